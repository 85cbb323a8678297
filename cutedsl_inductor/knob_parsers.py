"""The parsers of ``config``'s knobs: an environment value (text) or an assigned value
in, the knob's value out, or ``ConfigError`` naming the variable (or ``config.<name>``)
and what it accepts. Strict: a boolean is one of 1/0/true/false/yes/no/on/off (any
case), a count an integer in range, a mode one of its words (or a boolean's: on/off),
text what its pattern or check takes."""

from __future__ import annotations

import dataclasses
import os
import re
import urllib.parse
from collections.abc import Callable
from typing import Any

from .exc import ConfigError

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
# cute.compile options that cutedsl_inductor sets itself (and labels entries with):
# refused in compile_options, abbreviated or not (CuTe's parser takes abbreviations)
RESERVED_OPTIONS = ("gpu-arch", "enable-tvm-ffi", "host-target")


@dataclasses.dataclass(frozen=True)
class Boolean:
    accepted: str = f"a boolean: {'/'.join(_TRUE + _FALSE)} (any case)"
    doc: str = "a boolean (1/0, true/false, yes/no, on/off)"

    def __call__(self, raw: str, variable: str) -> bool:
        if raw.lower() in _TRUE + _FALSE:
            return raw.lower() in _TRUE
        raise ConfigError(variable=variable, value=raw, accepted=self.accepted)

    def value(self, value: Any, name: str) -> bool:
        """An assigned value: True or False."""
        if isinstance(value, bool):
            return value
        raise ConfigError(variable=name, value=value, accepted="True or False")


@dataclasses.dataclass(frozen=True)
class Integer:
    low: int
    high: int
    high_doc: str = ""  # the documented upper bound where it depends on the machine

    @property
    def accepted(self) -> str:
        return f"an integer from {self.low} to {self.high}"

    @property
    def doc(self) -> str:
        return f"an integer from {self.low} to {self.high_doc or self.high}"

    def __call__(self, raw: str, variable: str) -> int:
        if re.fullmatch(r"-?[0-9]+", raw) and self.low <= int(raw) <= self.high:
            return int(raw)
        raise ConfigError(variable=variable, value=raw, accepted=self.accepted)

    def value(self, value: Any, name: str) -> int:
        """An assigned value: an int (not a bool) in range."""
        if isinstance(value, int) and not isinstance(value, bool) and (
                self.low <= value <= self.high):
            return value
        raise ConfigError(variable=name, value=value, accepted=self.accepted)


@dataclasses.dataclass(frozen=True)
class Pattern:
    regex: str
    accepted: str

    @property
    def doc(self) -> str:
        return self.accepted

    def __call__(self, raw: str, variable: str) -> str:
        if re.fullmatch(self.regex, raw):
            return raw
        raise ConfigError(variable=variable, value=raw, accepted=self.accepted)

    def value(self, value: Any, name: str) -> str:
        """An assigned value: text the pattern takes."""
        if isinstance(value, str):
            return self(value, name)
        raise ConfigError(variable=name, value=value, accepted=self.accepted)


def check_compile_options(value: str, variable: str) -> str:
    """Options for ``cute.compile``, none of which sets what ``RESERVED_OPTIONS`` names,
    with a ``--dump-dir`` that exists (CuTe DSL writes nothing to one that does not, and
    says nothing)."""
    tokens = value.split()
    for index, token in enumerate(tokens):
        name, _, given = token[2:].partition("=") if token.startswith("--") else ("", "", "")
        if name and any(option.startswith(name) for option in RESERVED_OPTIONS):
            raise ConfigError(
                variable=variable, value=value,
                accepted="cute.compile options other than "
                + ", ".join(f"--{option}" for option in RESERVED_OPTIONS)
                + " (cutedsl_inductor sets those; the arch is CUTEDSL_INDUCTOR_ARCH)")
        folder = given or (tokens[index + 1] if index + 1 < len(tokens) else "")
        if name == "dump-dir" and not os.path.isdir(folder):
            raise ConfigError(variable=variable, value=value,
                              accepted=f"a --dump-dir that is a folder ({folder!r} is none: "
                              "CuTe DSL would dump nothing there)")
    return value


# what the hooks (``<kernel_name>_epilogue``, ...) and the built-in templates and the docs'
# examples (``<kernel_name>_kernel``, ...) define beside the entry: the entry named so
# would replace it
TAKEN_SUFFIXES = ("kernel", "jit", "Gemm", "Flex", "FlexBwd", "prologue", "epilogue",
                  "epilogue_registers", "epilogue_load", "epilogue_load_pair", "epilogue_apply")


def check_entry_suffix(value: str, variable: str) -> str:
    """Letters, digits and _, none of ``TAKEN_SUFFIXES``."""
    if not re.fullmatch(r"[A-Za-z0-9_]+", value) or value in TAKEN_SUFFIXES:
        raise ConfigError(variable=variable, value=value,
                          accepted="letters, digits and _, other than "
                          + ", ".join(TAKEN_SUFFIXES)
                          + " (the templates define <kernel_name>_<that> beside the entry)")
    return value


REDIS_URL_ACCEPTED = ("a Redis URL: redis://HOST:PORT or rediss://HOST:PORT (PORT from 1 to "
                      "65535), or unix://PATH")


def check_redis_url(value: str, variable: str) -> str:
    """A Redis URL with a port redis-py can connect to (parsed by ``urllib``, as redis-py
    parses it), or a socket path."""
    try:
        url = urllib.parse.urlsplit(value)
        usable = ((url.scheme in ("redis", "rediss") and bool(url.netloc) and url.port != 0)
                  or (url.scheme == "unix" and bool(url.path)))
    except ValueError:  # a port that is no number or out of range, a broken IPv6 address
        usable = False
    if not usable or re.search(r"\s", value):
        raise ConfigError(variable=variable, value=value, accepted=REDIS_URL_ACCEPTED)
    return value


@dataclasses.dataclass(frozen=True)
class Text:
    check: Callable[[str, str], str]
    doc: str

    def __call__(self, raw: str, variable: str) -> str:
        return self.check(raw, variable)

    def value(self, value: Any, name: str) -> str:
        """An assigned value: text the check takes."""
        if isinstance(value, str):
            return self(value, name)
        raise ConfigError(variable=name, value=value, accepted=self.doc)


@dataclasses.dataclass(frozen=True)
class Mode:
    """One of ``words``; a boolean's words (and True/False) mean "on" and "off"."""
    words: tuple[str, ...]

    @property
    def accepted(self) -> str:
        return f"one of {', '.join(self.words)} (a boolean's words mean on and off)"

    @property
    def doc(self) -> str:
        return self.accepted

    def __call__(self, raw: str, variable: str) -> str:
        word = raw.lower()
        if word in self.words:
            return word
        if word in _TRUE + _FALSE:
            return "on" if word in _TRUE else "off"
        raise ConfigError(variable=variable, value=raw, accepted=self.accepted)

    def value(self, value: Any, name: str) -> str:
        """An assigned value: one of the words, or a bool."""
        if isinstance(value, bool):
            return "on" if value else "off"
        if isinstance(value, str) and value in self.words:
            return value
        raise ConfigError(variable=name, value=value, accepted=self.accepted)


Parser = Boolean | Integer | Mode | Pattern | Text
