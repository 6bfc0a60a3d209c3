"""attn2: paged attention of the 8-row verify step fused with the o-norm and sigmoid gate."""

from __future__ import annotations

from . import _C


def attn2_window(sliding_window: int | None, max_model_len: int) -> int:
    """The window attn2 applies: 0 (none) when the layer has none or it covers
    max_model_len; ValueError for a window below 1."""
    return _C.attn2_window(sliding_window, max_model_len)


def attn2_splits(max_model_len: int, window: int, num_kv_heads: int) -> int:
    """Key slices per (request, KV head) of a deployment: 1 for max_model_len
    <= 2048 and for any window, else enough to fill the GPU."""
    return _C.attn2_splits(max_model_len, window, num_kv_heads)


def attn2_workspace_bytes(num_reqs: int, num_kv_heads: int, num_splits: int) -> int:
    """Bytes of the split kernel's workspace (zero it once when allocating it)."""
    return _C.attn2_workspace_bytes(num_reqs, num_kv_heads, num_splits)


def unsupported_attn2(layer) -> str | None:
    """Why attn2 cannot compute this MuseSpark1xAttention layer (use_o_norm,
    use_o_gate, head_dim, num_heads, num_kv_heads, scaling, rms_norm_eps), or None."""
    return _C.unsupported_attn2(bool(layer.use_o_norm), bool(layer.use_o_gate), int(layer.head_dim),
                                int(layer.num_heads), int(layer.num_kv_heads), float(layer.scaling),
                                float(layer.rms_norm_eps))


# The extension's functions and class themselves: no Python frame on the
# per-call path (host cost, SPEC section 7).
#   attn2(q, gate, kv_cache, block_table, seq_lens, out, workspace, max_model_len, window, num_splits,
#         pdl=True) -> out
#   unsupported_attn2_call(the same arguments) -> the reason attn2 would raise, or None
#   prepare_attn2(device=-1): one-time setup of a device, outside graph capture
#   Attn2(kv_cache, workspace, max_model_len, window, num_splits), then
#   bound(q, gate, block_table, seq_lens, out, pdl=True) -> out: the layer's
#   tensors checked once and their device prepared; keep their storage in place.
attn2 = _C.attn2
unsupported_attn2_call = _C.unsupported_attn2_call
prepare_attn2 = _C.prepare_attn2
Attn2 = _C.Attn2
