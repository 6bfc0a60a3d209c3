"""o_proj: the attention output projection of the verify step's rows (1..64),
this rank's partial sum before the engine's all-reduce."""

from __future__ import annotations

from . import _C
from ._attributes import attributes, quantized

# The extension's functions and class themselves: no Python frame on the
# per-call path (an op has 5 us of host time in all).
#   o_proj(x, weight, out, pdl=True) -> out: the checked op
#   unsupported_o_proj_call(x, weight, out=None, pdl=True) -> the reason o_proj would raise, or None
#   prepare_o_proj(device=-1): one-time setup of a device, outside graph capture
#   OProj(weight), then bound(x, out, pdl=True) -> out: the weight checked once
#   and its device prepared; keep its storage in place.
o_proj = _C.o_proj
unsupported_o_proj_call = _C.unsupported_o_proj_call
prepare_o_proj = _C.prepare_o_proj
OProj = _C.OProj

# What o_proj reads off a vLLM Muse Spark attention layer before the optional
# parts of its RowParallelLinear (quantization, bias, input_is_parallel,
# tp_size), which have defaults.
_ATTN_ATTRIBUTES = ("o_proj", "num_heads", "head_dim")


def unsupported_o_proj(attn) -> str | None:
    """Why o_proj cannot compute this Muse Spark attention layer's loaded
    output projection (vLLM attributes: o_proj.quant_method, bias,
    input_is_parallel, tp_size, weight; num_heads, head_dim), or None. Any
    object gets an answer: a missing or unreadable attribute is a reason too."""
    try:
        values = _output_values(attn)
    except ValueError as e:
        return str(e)
    return _C.unsupported_o_proj(*values)


def _output_values(attn) -> tuple:
    """What the extension's unsupported_o_proj takes, read off the layer
    (attention_block's layer check passes the same); ValueError naming the
    first attribute that is missing or cannot be read."""
    proj, num_heads, head_dim = attributes(attn, "attn", _ATTN_ATTRIBUTES)
    return (
        quantized(proj),
        getattr(proj, "bias", None) is not None,
        getattr(proj, "input_is_parallel", True),
        getattr(proj, "tp_size", 1),
        num_heads,
        head_dim,
        getattr(proj, "weight", None),
    )
