"""attention_block: one layer's attention of the verify step (qkv_front, attn2
and o_proj) in one launch, x [R*8, 8192] in, this rank's o_proj partial sum
[R*8, 8192] out."""

from __future__ import annotations

from . import _C
from ._attn2 import _layer_values as _attention_values
from ._attributes import attributes, optional_attribute
from ._o_proj import _output_values
from ._qkv_front import _projection_values


def attention_block_supports_kv_heads(num_kv_heads: int) -> bool:
    """Whether attention_block serves a rank of num_kv_heads KV heads (2 at
    TP8, 4 at TP4). ValueError naming num_kv_heads unless it is an integer in
    int32."""
    return _C.attention_block_supports_kv_heads(num_kv_heads)


def attention_block_splits(num_reqs: int, num_kv_heads: int, max_model_len: int, window: int) -> int:
    """Key slices per (request, KV head) of a deployment: the block's fixed
    shares dealt to each (request, KV head), bounded so that a slice holds at
    least 8 pages of the longest row (max_model_len, or a window's W + 7
    keys). ValueError naming the argument a call would refuse: num_reqs
    outside [1, 8], num_kv_heads the block does not serve, max_model_len
    below 8, window not 0 or in [1, max_model_len) (attn2_window's value)."""
    return _C.attention_block_splits(num_reqs, num_kv_heads, max_model_len, window)


def attention_block_workspace_bytes(num_reqs: int, num_kv_heads: int, max_model_len: int, window: int) -> int:
    """Bytes of the workspace of a call of num_reqs requests (the
    projection's rows, the attention's output rows, the partial sums and the
    counters): zero it once when allocating it; every launch leaves it ready
    for the next. The partials follow the split count, which falls as
    requests grow, so steps of 1 to R requests need the largest of the values
    for 1..R (at 128k, 3 requests need more than 4). ValueError naming the
    argument as attention_block_splits."""
    return _C.attention_block_workspace_bytes(num_reqs, num_kv_heads, max_model_len, window)


def unsupported_attention_block(layer, max_model_len: int | None = None, max_reqs: int = 1) -> str | None:
    """Why attention_block cannot compute this Muse Spark attention layer's
    attention for a deployment of max_model_len (None: the layer's own
    max_model_len attribute) and steps of up to max_reqs requests, or None.
    The layer is read as the three ops' checks read it (unsupported_projection,
    unsupported_attn2 and unsupported_o_proj: qkv_proj, rotary_emb, o_proj,
    num_heads, num_kv_heads, head_dim, use_rope, use_o_norm, use_o_gate,
    scaling, rms_norm_eps), and its sliding_window (none, or no such
    attribute: full attention); the first of the three ops' reasons comes
    first, then the block's own (its KV-head counts, requests, context, the
    window). Any object gets an answer: a missing or unreadable attribute, or
    an argument that is not an integer, is a reason too. Where it says no, the
    layer keeps the three ops."""
    try:
        projection = _projection_values(layer)
        attention = _attention_values(layer)
        output = _output_values(layer)
        (num_kv_heads,) = attributes(layer, "layer", ("num_kv_heads",))
        if max_model_len is None:
            (max_model_len,) = attributes(layer, "layer", ("max_model_len",))
        # vLLM's attention layers carry it; a layer without one has full attention.
        sliding_window = optional_attribute(layer, "layer", "sliding_window")
    except ValueError as e:
        return str(e)
    return _C.unsupported_attention_block(projection, attention, output, num_kv_heads, max_model_len, max_reqs,
                                          sliding_window)


# The extension's functions and class themselves: no Python frame on the
# per-call path (an op has 5 us of host time in all).
#   attention_block(x, qkv_weight, positions, cos_sin, slot_mapping, kv_cache, num_kv_heads, block_table,
#                   seq_lens, max_model_len, window, o_proj_weight, out, workspace) -> out: the checked op
#   unsupported_attention_block_call(the same arguments, out=None, workspace=None) -> the reason
#                   attention_block would raise, or None
#   prepare_attention_block(device=-1): one-time setup of a device, outside graph capture
#   AttentionBlock(qkv_weight, cos_sin, kv_cache, num_kv_heads, o_proj_weight, max_model_len, window,
#                  workspace), then bound(x, positions, slot_mapping, block_table, seq_lens, out) -> out:
#   the layer's tensors checked once and their device prepared; keep their storage in place.
# The arguments come in the order of the C++ AttentionBlockArgs, as every op's do.
attention_block = _C.attention_block
unsupported_attention_block_call = _C.unsupported_attention_block_call
prepare_attention_block = _C.prepare_attention_block
AttentionBlock = _C.AttentionBlock
