"""attn2: paged attention of the 8-row verify step fused with the o-norm and sigmoid gate."""

from __future__ import annotations

from . import _C
from ._attributes import attributes

# What attn2 reads off a vLLM MuseSpark1xAttention layer, in the order the
# extension takes it.
_LAYER_ATTRIBUTES = ("use_o_norm", "use_o_gate", "head_dim", "num_heads", "num_kv_heads", "scaling", "rms_norm_eps")


def attn2_window(sliding_window: int | None, max_model_len: int) -> int:
    """The window attn2 applies: 0 (none) when the layer has none or it covers
    max_model_len. ValueError naming the argument for a window below 1 or a
    max_model_len below 8."""
    return _C.attn2_window(sliding_window, max_model_len)


def attn2_splits(max_model_len: int, window: int, num_kv_heads: int) -> int:
    """Key slices per (request, KV head) of a deployment: 1 for max_model_len
    <= 2048 and for any window, else enough to fill the GPU. ValueError naming
    the argument unless max_model_len >= 8, window is 0 or in [1,
    max_model_len) (attn2_window's value) and num_kv_heads is 1, 2, 4, 8 or
    16."""
    return _C.attn2_splits(max_model_len, window, num_kv_heads)


def attn2_workspace_bytes(num_reqs: int, num_kv_heads: int, num_splits: int) -> int:
    """Bytes of the split kernel's workspace (zero it once when allocating it);
    0 for num_splits 1. ValueError naming the argument unless num_reqs is in
    [1, 65535], num_kv_heads 1, 2, 4, 8 or 16 and num_splits in [1, 32]."""
    return _C.attn2_workspace_bytes(num_reqs, num_kv_heads, num_splits)


def unsupported_attn2(layer) -> str | None:
    """Why attn2 cannot compute this MuseSpark1xAttention layer (use_o_norm,
    use_o_gate, head_dim, num_heads, num_kv_heads, scaling, rms_norm_eps), or
    None. Any object gets an answer: a missing or unreadable attribute is a
    reason too."""
    try:
        values = _layer_values(layer)
    except ValueError as e:
        return str(e)
    return _C.unsupported_attn2(*values)


def _layer_values(layer) -> tuple:
    """What the extension's unsupported_attn2 takes, read off the layer
    (attention_block's layer check passes the same); ValueError naming the
    first attribute that is missing or cannot be read."""
    return tuple(attributes(layer, "layer", _LAYER_ATTRIBUTES))


# The extension's functions and class themselves: no Python frame on the
# per-call path (an op has 5 us of host time in all).
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
