"""The ops registered with torch.library (namespace muse_decode), for
torch.compile users: each is opaque to the compiler, mutates its outputs in
place and returns nothing. Importing this module registers them (it needs
PyTorch). Each is the package's checked op: prepare the device first
(prepare_route, prepare_attn2, prepare_qkv_front, prepare_o_proj,
prepare_attention_block), outside graph capture.
Eager callers should call the package's functions directly: a
torch.library.custom_op call costs tens of microseconds of host time
(42 us measured on the H200 host), the direct call a few.

    torch.ops.muse_decode.route(logits, bias, route_scale, ids, weights, metadata, offset, count, tile_n)
    torch.ops.muse_decode.attn2(q, gate, kv_cache, block_table, seq_lens, out, workspace, max_model_len, window, num_splits)
    torch.ops.muse_decode.qkv_front(x, weight, positions, cos_sin, slot_mapping, kv_cache, num_kv_heads, out, workspace)
    torch.ops.muse_decode.o_proj(x, weight, out)
    torch.ops.muse_decode.attention_block(x, qkv_weight, positions, cos_sin, slot_mapping, kv_cache, num_kv_heads,
                                          block_table, seq_lens, max_model_len, window, o_proj_weight, out, workspace)
"""

from __future__ import annotations

from typing import Optional

import torch

from ._attention_block import attention_block as _attention_block
from ._attn2 import attn2 as _attn2
from ._qkv_front import qkv_front as _qkv_front
from ._o_proj import o_proj as _o_proj
from ._route import RoutingMetadata as _RoutingMetadata
from ._route import route as _route


@torch.library.custom_op("muse_decode::route", mutates_args=("ids", "weights", "metadata"))
def route(logits: torch.Tensor, bias: torch.Tensor, route_scale: float, ids: torch.Tensor, weights: torch.Tensor,
          metadata: Optional[torch.Tensor], local_expert_offset: int, num_local_experts: int, tile_n: int) -> None:
    meta = None if metadata is None else _RoutingMetadata(metadata, local_expert_offset, num_local_experts, tile_n)
    _route(logits, bias, route_scale, ids, weights, meta)


@route.register_fake
def _(logits, bias, route_scale, ids, weights, metadata, local_expert_offset, num_local_experts, tile_n):
    return None


@torch.library.custom_op("muse_decode::attn2", mutates_args=("out", "workspace"))
def attn2(q: torch.Tensor, gate: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
          seq_lens: torch.Tensor, out: torch.Tensor, workspace: Optional[torch.Tensor], max_model_len: int,
          window: int, num_splits: int) -> None:
    _attn2(q, gate, kv_cache, block_table, seq_lens, out, workspace, max_model_len, window, num_splits)


@attn2.register_fake
def _(q, gate, kv_cache, block_table, seq_lens, out, workspace, max_model_len, window, num_splits):
    return None


@torch.library.custom_op("muse_decode::qkv_front", mutates_args=("kv_cache", "out", "workspace"))
def qkv_front(x: torch.Tensor, weight: torch.Tensor, positions: torch.Tensor, cos_sin: Optional[torch.Tensor],
              slot_mapping: torch.Tensor, kv_cache: torch.Tensor, num_kv_heads: int, out: torch.Tensor,
              workspace: torch.Tensor) -> None:
    _qkv_front(x, weight, positions, cos_sin, slot_mapping, kv_cache, num_kv_heads, out, workspace)


@qkv_front.register_fake
def _(x, weight, positions, cos_sin, slot_mapping, kv_cache, num_kv_heads, out, workspace):
    return None


@torch.library.custom_op("muse_decode::o_proj", mutates_args=("out",))
def o_proj(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> None:
    _o_proj(x, weight, out)


@o_proj.register_fake
def _(x, weight, out):
    return None


# The KV cache gets the step's k and v; the workspace's counters are written
# and left zeroed.
@torch.library.custom_op("muse_decode::attention_block", mutates_args=("kv_cache", "out", "workspace"))
def attention_block(x: torch.Tensor, qkv_weight: torch.Tensor, positions: torch.Tensor, cos_sin: Optional[torch.Tensor],
                    slot_mapping: torch.Tensor, kv_cache: torch.Tensor, num_kv_heads: int, block_table: torch.Tensor,
                    seq_lens: torch.Tensor, max_model_len: int, window: int, o_proj_weight: torch.Tensor,
                    out: torch.Tensor, workspace: torch.Tensor) -> None:
    _attention_block(x, qkv_weight, positions, cos_sin, slot_mapping, kv_cache, num_kv_heads, block_table, seq_lens,
                     max_model_len, window, o_proj_weight, out, workspace)


@attention_block.register_fake
def _(x, qkv_weight, positions, cos_sin, slot_mapping, kv_cache, num_kv_heads, block_table, seq_lens, max_model_len,
      window, o_proj_weight, out, workspace):
    return None
