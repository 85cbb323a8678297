"""The remote tier's names in Redis, and its one refusal before a value is read: what
``remote_cache.py`` (the tier) and ``remote_backend.py`` (its Redis access, which imports
Inductor) share, so that neither imports the other's module for them."""

from __future__ import annotations

CACHE_ID = "cutedsl-inductor"
KEY_VERSION = 1


class OversizedValue(Exception):
    """A value over the bound: refused unread."""

    def __init__(self, size: int, bound: int) -> None:
        super().__init__(f"{size} bytes, over the bound of {bound}")


def redis_key(key: str) -> str:
    """Where an entry lives, laid out as Inductor lays out its own remote-cache keys."""
    return f"pt2:{CACHE_ID}::{key}:c{KEY_VERSION}"
