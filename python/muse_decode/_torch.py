"""Lazy link to PyTorch: registers torch's dtype objects with the extension
(so a call compares dtypes by identity) the first time torch is seen."""

import sys

from . import _C

_registered = False

# Codes of include/muse_decode/tensor.h DType.
_CODES = {"float32": 0, "bfloat16": 1, "float16": 2, "int32": 3, "int64": 4, "uint8": 5}


def ensure_registered():
    global _registered
    if _registered:
        return
    torch = sys.modules.get("torch")
    if torch is None:
        return
    for name, code in _CODES.items():
        _C._register_dtype(getattr(torch, name), code)
    _registered = True
