"""qkv_front: the attention front (QKV+gate projection, q/k norm, RoPE, KV-cache insert) for 1..16 tokens."""

from __future__ import annotations

from . import _C
from .constants import HEAD_DIM, HEADS_PER_KV_HEAD


def supports_shape(n: int, num_kv_heads: int) -> bool:
    """Whether the front serves a [q | k | v | gate] projection of width n for num_kv_heads."""
    return _C.supports_shape(n, num_kv_heads)


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


def qkv_front_workspace_bytes(num_kv_heads: int, device: int = -1) -> int:
    """Bytes of the workspace qkv_front needs on `device` (zero it once when allocating it)."""
    return _C.qkv_front_workspace_bytes(num_kv_heads, device)


def prepare_qkv_front() -> None:
    """One-time setup of the current device, outside CUDA-graph capture."""
    _C.prepare_qkv_front()


def unsupported_call(x, weight, positions, cos_sin_cache, slot_mapping, kv_cache, num_kv_heads, out=None):
    """Why the front does not take this call (the argument, expected and actual), or None."""
    return _C.unsupported_call(x, weight, positions, cos_sin_cache, slot_mapping, kv_cache, num_kv_heads, out)


def supports_call(x, weight, positions, cos_sin_cache, slot_mapping, kv_cache, num_kv_heads, out=None) -> bool:
    """Whether the QKV front takes this call of a layer with num_kv_heads (with
    out, the full check before launch_qkv_front); otherwise the caller keeps
    the unfused path."""
    return unsupported_call(x, weight, positions, cos_sin_cache, slot_mapping, kv_cache, num_kv_heads, out) is None


# The extension's function itself: no Python frame on the per-call path (host
# cost, SPEC section 7). launch_qkv_front(x, weight, positions, cos_sin_cache,
# slot_mapping, kv_cache, num_kv_heads, out, workspace, pdl=True) -> out.
launch_qkv_front = _C.launch_qkv_front

# The front bound to a layer's weight, rotary table, KV cache and workspace:
# QkvFront(weight, cos_sin_cache, kv_cache, num_kv_heads, workspace), then
# bound(x, positions, slot_mapping, out, pdl=True) -> out. Fewer tensors read
# per call; keep the bound tensors' storage in place.
QkvFront = _C.QkvFront


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
