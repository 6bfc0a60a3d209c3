"""qkv_front: the attention front (QKV+gate projection, q/k norm, RoPE, KV-cache insert) for 1..16 tokens."""

from __future__ import annotations

from . import _C
from ._attributes import attributes, quantized
from .constants import HEAD_DIM


def split_qkv(qkv, num_kv_heads: int):
    """The q and gate column views of qkv_front's output rows [q | k | v |
    gate] (q and gate: 8 heads of 64 per KV head), keeping qkv's row stride.
    ValueError naming the argument unless num_kv_heads is 1, 2, 4, 8 or 16 and
    qkv is [tokens, 2 * (8 + 1) * num_kv_heads * 64]."""
    k, _, gate, width = _C.qkv_front_columns(num_kv_heads)
    shape = getattr(qkv, "shape", None)
    if shape is None:
        raise ValueError(f"qkv must be a tensor, got {type(qkv).__name__}")
    if len(shape) != 2 or shape[1] != width:
        raise ValueError(f"qkv must be [tokens, {width}] for {num_kv_heads} KV heads, got {list(shape)}")
    return qkv[:, :k], qkv[:, gate:]


# The extension's functions and class themselves: no Python frame on the
# per-call path (an op has 5 us of host time in all).
#   qkv_front(x, weight, positions, cos_sin, slot_mapping, kv_cache, num_kv_heads, out, workspace,
#             pdl=True) -> out: the checked op
#   unsupported_qkv_front_call(x, weight, positions, cos_sin, slot_mapping, kv_cache, num_kv_heads,
#                              out=None, workspace=None, pdl=True) -> the reason qkv_front would raise, or None
#   qkv_front_supports_call(the same arguments) -> bool
#   qkv_front_supports_shape(n, num_kv_heads) -> bool
#   qkv_front_workspace_bytes(num_kv_heads, sm_count) -> int
#   qkv_front_workspace_bytes_for_device(num_kv_heads, device=-1) -> int
#   prepare_qkv_front(device=-1): one-time setup of a device, outside graph capture
#   QkvFront(weight, cos_sin, kv_cache, num_kv_heads, workspace), then
#   bound(x, positions, slot_mapping, out, pdl=True) -> out: the layer's
#   tensors checked once and their device prepared; keep their storage in place.
qkv_front = _C.qkv_front
unsupported_qkv_front_call = _C.unsupported_qkv_front_call
qkv_front_supports_call = _C.qkv_front_supports_call
qkv_front_supports_shape = _C.qkv_front_supports_shape
qkv_front_workspace_bytes = _C.qkv_front_workspace_bytes
qkv_front_workspace_bytes_for_device = _C.qkv_front_workspace_bytes_for_device
prepare_qkv_front = _C.prepare_qkv_front
QkvFront = _C.QkvFront

# The seed's names of qkv_front's functions, the same objects as the names
# above (their docstrings say so): launch_qkv_front is the checked op.
launch_qkv_front = qkv_front
supports_call = qkv_front_supports_call
supports_shape = qkv_front_supports_shape

# What qkv_front reads off a vLLM Muse Spark attention layer before the
# optional parts (the projection's quantization, bias, gather and TP size,
# the rotary embedding), which have defaults.
_ATTN_ATTRIBUTES = ("qkv_proj", "num_heads", "num_kv_heads", "head_dim")


def unsupported_projection(attn) -> str | None:
    """Why qkv_front cannot read this Muse Spark attention layer's loaded QKV
    projection and rotary table (vLLM attributes: qkv_proj.quant_method, bias,
    gather_output, tp_size, weight; num_heads, num_kv_heads, head_dim,
    use_rope, rotary_emb.rotary_dim / is_neox_style / cos_sin_cache), or None.
    Any object gets an answer: a missing or unreadable attribute is a reason
    too."""
    try:
        values = _projection_values(attn)
    except ValueError as e:
        return str(e)
    return _C.unsupported_projection(*values)


def _projection_values(attn) -> tuple:
    """What the extension's unsupported_projection takes, read off the layer
    (attention_block's layer check passes the same); ValueError naming the
    first attribute that is missing or cannot be read."""
    proj, num_heads, num_kv_heads, head_dim = attributes(attn, "attn", _ATTN_ATTRIBUTES)
    emb = getattr(attn, "rotary_emb", None)
    return (
        quantized(proj),
        getattr(proj, "bias", None) is not None,
        getattr(proj, "gather_output", False),
        getattr(proj, "tp_size", 1),
        getattr(proj, "weight", None),
        num_heads,
        num_kv_heads,
        head_dim,
        getattr(attn, "use_rope", emb is not None),
        emb is not None,
        getattr(emb, "rotary_dim", HEAD_DIM),
        getattr(emb, "is_neox_style", False),
        getattr(emb, "cos_sin_cache", None),
    )
