"""Argument types of the bench commands: each parses one option's text or refuses it
with an ``ArgumentTypeError`` that argparse prints as one line, before anything runs."""

from __future__ import annotations

import argparse
import csv
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def parse_triples(form: str) -> Callable[[str], list[tuple[int, int, int]]]:
    """An argument type: comma-separated triples of positive integers, ``form`` (such as
    ``"MxNxK"``) naming their parts in the error."""
    def parse(text: str) -> list[tuple[int, int, int]]:
        shapes = []
        for item in text.split(","):
            dims = item.lower().split("x")
            if len(dims) != 3 or not all(d.isdigit() and int(d) > 0 for d in dims):
                raise argparse.ArgumentTypeError(f"{item!r} is not {form} (positive integers)")
            shapes.append((int(dims[0]), int(dims[1]), int(dims[2])))
        return shapes
    return parse


# ``"128x4096x4096,1024x1024x1024"`` -> ``[(128, 4096, 4096), (1024, 1024, 1024)]``
parse_shapes = parse_triples("MxNxK")


def parse_shard(text: str) -> tuple[int, int]:
    """``"2/4"`` -> ``(2, 4)``: run every 4th shape of the list from the 2nd."""
    index, _, count = text.partition("/")
    if not (index.isdigit() and count.isdigit() and 1 <= int(index) <= int(count)):
        raise argparse.ArgumentTypeError(f"{text!r} is not K/N with 1 <= K <= N")
    return int(index), int(count)


def positive(what: str) -> Callable[[str], int]:
    """An argument type: a positive integer, refused as not a positive ``what``."""
    def parse(text: str) -> int:
        if not (text.isdigit() and int(text) >= 1):
            raise argparse.ArgumentTypeError(f"{text!r} is not a positive {what}")
        return int(text)
    return parse


parse_rounds = positive("number of rounds")
parse_count = positive("integer")


def one_of(choices: Sequence[str], what: str, all_of: bool = False
           ) -> Callable[[str], list[str]]:
    """An argument type: a comma-separated list of ``choices`` (``all_of``: or "all")."""
    def parse(text: str) -> list[str]:
        values = list(choices) if all_of and text == "all" else text.split(",")
        unknown = [value for value in values if value not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(
                f"{', '.join(map(repr, unknown))}: not a {what} (one of {', '.join(choices)}"
                + (", or all)" if all_of else ")"))
        return values
    return parse


parse_layouts = one_of(("nt", "nn"), "layout")


def output_folder(text: str) -> Path:
    """``--out``: a folder, made if missing (a default is made where it is written)."""
    try:
        Path(text).mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise argparse.ArgumentTypeError(f"{text!r}: cannot make that folder "
                                         f"({err.strerror})") from None
    return Path(text)


def read_csv_rows(path: Path, name: str, fields: Sequence[str],
                  value: Callable[[str, str], Any]) -> list[dict[str, Any]]:
    """The rows of a bench CSV (``path``, or ``path``/``name``), each cell as ``value(column,
    text)`` makes it; ValueError where a column of ``fields`` is missing or no row is."""
    with open(path / name if path.is_dir() else path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [key for key in fields if key not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(f"without the column(s) {', '.join(missing)}")
        rows = [{key: value(key, text) for key, text in row.items()} for row in reader]
    if not rows:
        raise ValueError("no rows")
    return rows


def csv_rows(read: Callable[[Path], list[dict[str, Any]]], what: str
             ) -> Callable[[str], list[dict[str, Any]]]:
    """An argument type for ``--merge``: a run's folder or CSV file, read by ``read``;
    refused as not a ``what`` CSV where it cannot be read or is not one."""
    def parse(text: str) -> list[dict[str, Any]]:
        try:
            return read(Path(text))
        except OSError as err:
            raise argparse.ArgumentTypeError(
                f"{text!r}: cannot read {err.filename} ({err.strerror})") from None
        except (ValueError, csv.Error) as err:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {what} CSV ({err})") from None
    return parse
