"""The versions that every cache key carries: this package's version and a hash of its
Python sources (generated modules import its kernels, e.g. the GEMM's body: an edit there
must miss every cache even where the version stays the same), and those of
nvidia-cutlass-dsl and apache-tvm-ffi."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
from pathlib import Path

from ..version import __version__


def source_tree_hash(root: Path) -> str:
    """sha256 over the relative paths and contents of every ``*.py`` under ``root``."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(f"{path.relative_to(root).as_posix()}\0".encode())
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


@functools.cache
def toolchain_versions() -> dict[str, str]:
    versions = {"cutedsl_inductor": __version__,
                "cutedsl_inductor sources": source_tree_hash(Path(__file__).resolve().parents[1])}
    for dist in ("nvidia-cutlass-dsl", "apache-tvm-ffi"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = "absent"
    return versions
