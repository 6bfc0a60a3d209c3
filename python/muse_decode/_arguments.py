"""The integer arguments of the package's Python-level functions, read as the
extension reads its own: anything with __index__ is an integer, except True
and False, which Python counts as integers but which as a count or a size
are a slip; everything else is a ValueError naming the argument."""

from __future__ import annotations

import operator


def integer(value, name: str) -> int:
    """value as an int; ValueError "<name> must be an integer, got <what>"
    for a bool (got True / got False) or an object without __index__ (got its
    type's name)."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value}")
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {type(value).__name__}") from None


def optional_integer(value, name: str) -> int | None:
    """integer(value, name), None staying None."""
    return None if value is None else integer(value, name)
