"""qkv_front: the attention front (QKV+gate projection, q/k norm, RoPE, KV-cache insert) for 1..16 tokens."""

from __future__ import annotations

from . import _C
from .constants import HEAD_DIM, HEADS_PER_KV_HEAD


def split_qkv(qkv, num_kv_heads: int):
    """The q and gate column views of the front's output rows [q | k | v | gate]
    (q and gate: 8 heads of 64 per KV head), keeping qkv's row stride."""
    q_width = HEADS_PER_KV_HEAD * num_kv_heads * HEAD_DIM
    kv_width = num_kv_heads * HEAD_DIM
    if qkv.dim() != 2 or qkv.shape[1] != 2 * q_width + 2 * kv_width:
        raise ValueError(
            f"qkv must be [tokens, {2 * q_width + 2 * kv_width}] for {num_kv_heads} KV heads, got {list(qkv.shape)}"
        )
    return qkv[:, :q_width], qkv[:, q_width + 2 * kv_width :]


# The extension's functions and class themselves: no Python frame on the
# per-call path (host cost, SPEC section 7).
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

# The seed's names (SPEC sections 6 and 7), the same objects as the names above:
# launch_qkv_front is the checked op, as in the seed.
launch_qkv_front = qkv_front
supports_call = qkv_front_supports_call
supports_shape = qkv_front_supports_shape


def unsupported_projection(attn) -> str | None:
    """Why the front cannot read this Muse Spark attention layer's loaded QKV
    projection and rotary table (vLLM attributes: qkv_proj.quant_method, bias,
    gather_output, tp_size, weight; num_heads, num_kv_heads, head_dim,
    use_rope, rotary_emb.rotary_dim / is_neox_style / cos_sin_cache), or None."""
    proj = attn.qkv_proj
    quant = getattr(proj, "quant_method", None)
    quantized = quant is not None and type(quant).__name__ != "UnquantizedLinearMethod"
    emb = getattr(attn, "rotary_emb", None)
    return _C.unsupported_projection(
        quantized,
        getattr(proj, "bias", None) is not None,
        bool(getattr(proj, "gather_output", False)),
        int(getattr(proj, "tp_size", 1)),
        getattr(proj, "weight", None),
        int(attn.num_heads),
        int(attn.num_kv_heads),
        int(attn.head_dim),
        bool(getattr(attn, "use_rope", emb is not None)),
        emb is not None,
        int(getattr(emb, "rotary_dim", HEAD_DIM)) if emb is not None else HEAD_DIM,
        bool(getattr(emb, "is_neox_style", False)) if emb is not None else False,
        getattr(emb, "cos_sin_cache", None) if emb is not None else None,
    )
