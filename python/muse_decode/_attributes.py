"""Reading the layer objects the "why not" checks are given (vLLM's router
and attention layers, or anything else): the attributes a check needs, or a
ValueError naming the first one missing, which the checks return as their
reason."""

from __future__ import annotations

_MISSING = object()


def attributes(obj, label: str, names: tuple[str, ...]) -> list:
    """obj's attributes `names`, in that order; ValueError "<label> has no
    attribute '<name>'" for the first one obj lacks."""
    values = []
    for name in names:
        value = getattr(obj, name, _MISSING)
        if value is _MISSING:
            raise ValueError(f"{label} has no attribute {name!r}")
        values.append(value)
    return values
