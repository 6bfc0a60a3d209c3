"""Reading the layer objects the "why not" checks are given (vLLM's router
and attention layers, or anything else): the attributes a check needs, or a
ValueError naming the first one that is missing or cannot be read, which the
checks return as their reason."""

from __future__ import annotations

_MISSING = object()


def attributes(obj, label: str, names: tuple[str, ...]) -> list:
    """obj's attributes `names`, in that order; ValueError "<label> has no
    attribute '<name>'" for the first one obj lacks, or naming the one whose
    read raised (a property that fails)."""
    values = []
    for name in names:
        value = optional_attribute(obj, label, name, _MISSING)
        if value is _MISSING:
            raise ValueError(f"{label} has no attribute {name!r}")
        values.append(value)
    return values


def optional_attribute(obj, label: str, name: str, default=None):
    """obj's attribute `name`, or `default` where obj has none; ValueError
    naming it when its read raises (a property that fails)."""
    try:
        return getattr(obj, name, default)
    except Exception as e:  # noqa: BLE001 (any object: its own error becomes the reason)
        raise ValueError(f"{label}.{name} cannot be read: {type(e).__name__}: {e}") from None


def quantized(linear) -> bool:
    """Whether a vLLM linear layer's weight is quantized: it carries a quant
    method other than the unquantized one."""
    quant = getattr(linear, "quant_method", None)
    return quant is not None and type(quant).__name__ != "UnquantizedLinearMethod"
