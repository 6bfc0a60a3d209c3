"""A Muse Spark decoder layer's attention and MoE routing on one rank, as an
engine runs its verify step: the fused ops where the planner sends them
(8-token verify steps on a supported GPU, supported layers), the stock PyTorch
path everywhere else. The attention goes to attention_block (qkv_front, attn2
and o_proj in one launch) where it serves the layer and the step's call, and
to the three ops otherwise; the layer says which ran and why
(Plan.block_reason, MuseSparkAttentionRouting.attention_path). The module
carries the attributes of vLLM's Muse Spark layers, so the package's checks
read it as they would read vLLM's.

The MoE experts themselves are not part of this module: it ends with the
routing (ids, weights and the routed GEMMs' metadata)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import NamedTuple

import torch

from . import stock
from ._arguments import integer
from ._attention_block import (
    AttentionBlock,
    attention_block_workspace_bytes,
    prepare_attention_block,
    unsupported_attention_block,
    unsupported_attention_block_call,
)
from ._attn2 import Attn2, attn2_splits, attn2_window, attn2_workspace_bytes, prepare_attn2, unsupported_attn2
from .constants import HEAD_DIM, HEADS_PER_KV_HEAD, HIDDEN_SIZE, NUM_EXPERTS, QUERY_LEN, RMS_NORM_EPS, SM_SCALE, TOP_K
from ._qkv_front import QkvFront, prepare_qkv_front, qkv_front_workspace_bytes_for_device, split_qkv, unsupported_projection
from .platform import supported_gpu
from ._o_proj import OProj, prepare_o_proj, unsupported_o_proj
from ._route import MuseRouting, RoutingMetadata, fold_router_output_multiplier, metadata_size, unsupported_router

ROPE_THETA = 500000.0
SLIDING_WINDOW = 2048


@dataclass(frozen=True)
class Plan:
    """Which ops of a step run fused (True) or on the stock path (False), and
    why not (reason). block: the attention (front, attention and out_proj)
    goes to attention_block, and front, attention and out_proj say where a
    call it refuses goes instead; block_reason: why not, where the layer's
    other ops are fused (None when the whole step is stock: reason says why)."""

    front: bool
    attention: bool
    out_proj: bool
    routing: bool
    reason: str | None = None
    block: bool = False
    block_reason: str | None = None


class AttentionPath(NamedTuple):
    """Which path a step's attention took: "attention_block" (one launch) or
    "three ops" (qkv_front, attn2 and o_proj, each fused or stock as the plan
    says), and why not the block (None when it ran)."""

    path: str
    reason: str | None


def router(expert_bias, weight=None, route_scale: float = 1.0, output_multiplier: float | None = None):
    """A Muse Spark router as vLLM's layer carries it (the attributes
    MuseRouting and unsupported_router read), for engines and tests without
    vLLM: sigmoid scores, top-8 of 256, division eps 1e-15."""
    return SimpleNamespace(weight=weight, expert_bias=expert_bias, route_scale=route_scale,
                           router_output_multiplier=output_multiplier, router_score_normalization="sigmoid",
                           top_k=TOP_K, global_num_experts=NUM_EXPERTS, router_score_division_eps=1e-15)


def rope_table(max_pos: int, device=None) -> torch.Tensor:
    """The fp32 interleaved RoPE table [max_pos, 64] (cos in 0:32, sin in 32:64), theta 500000."""
    max_pos = integer(max_pos, "max_pos")
    inv = 1.0 / (ROPE_THETA ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float64, device=device) / HEAD_DIM))
    angles = torch.arange(max_pos, dtype=torch.float64, device=device)[:, None] * inv[None, :]
    return torch.cat((angles.cos(), angles.sin()), -1).float()


class Step(NamedTuple):
    """What one layer step returns. attention_block keeps the front's and
    the attention's rows inside its workspace: after it, qkv and attn are None."""

    hidden: torch.Tensor  # x + o_proj(attention) [T, 8192] bf16: the residual stream
    qkv: torch.Tensor | None  # the attention front's output [T, q | k | v | gate] bf16
    attn: torch.Tensor | None  # attention with o-norm and gate [T, heads * 64] bf16 (this rank's heads)
    ids: torch.Tensor  # routed experts [T, 8] int32
    weights: torch.Tensor  # their weights [T, 8] fp32
    metadata: torch.Tensor  # routing metadata of this rank's experts (int32)


class MuseSparkAttentionRouting(torch.nn.Module):
    """Attention (QKV front, paged attention with o-norm and gate, o_proj) and
    MoE routing of layer `layer_idx` on rank `tp_rank` of `tp_size`: this rank's
    KV heads (16 / tp_size) and experts (256 / tp_size, expert parallel).

    forward() takes the step's hidden states x [T, 8192] (bf16), positions and
    slot_mapping [T] (int64), the paged KV cache [pages, KVH, 16, 128] (bf16),
    block_table [R, pages per request] and seq_lens [R] (int32, counting the
    step's tokens), and returns a Step (hidden after attention + residual, the
    front's and the attention's outputs, ids, weights, metadata buffer). With
    all_reduce (torch.distributed), o_proj's partial sums of the ranks are
    added.

    The attention runs as one attention_block launch where the plan says so
    (plan.block) and the step's call passes the block's check, else as the
    three ops; attention_path says which the last step took and why."""

    def __init__(self, layer_idx: int, max_model_len: int, tp_rank: int = 0, tp_size: int = 1,
                 device=None, dtype=torch.bfloat16, seed: int = 0, tile_n: int = 128):
        layer_idx, max_model_len = integer(layer_idx, "layer_idx"), integer(max_model_len, "max_model_len")
        tp_rank, tp_size = integer(tp_rank, "tp_rank"), integer(tp_size, "tp_size")
        seed, tile_n = integer(seed, "seed"), integer(tile_n, "tile_n")
        super().__init__()
        if tp_size < 1 or 16 % tp_size or NUM_EXPERTS % tp_size:
            raise ValueError(f"tp_size must divide 16 KV heads and 256 experts, got {tp_size}")
        g = torch.Generator(device="cpu").manual_seed(seed * 1000 + layer_idx)
        kvh = 16 // tp_size
        self.layer_idx, self.tp_rank, self.tp_size = layer_idx, tp_rank, tp_size
        self.head_dim, self.num_kv_heads, self.num_heads = HEAD_DIM, kvh, HEADS_PER_KV_HEAD * kvh
        self.scaling, self.rms_norm_eps = SM_SCALE, RMS_NORM_EPS
        self.use_o_norm = self.use_o_gate = True
        self.use_rope = layer_idx % 4 != 1  # full attention (no RoPE) at layer % 4 == 1
        self.sliding_window = SLIDING_WINDOW if self.use_rope else None
        self.max_model_len = max_model_len
        self.window = attn2_window(self.sliding_window, max_model_len)  # what attn2 applies
        n = 2 * (self.num_heads + kvh) * HEAD_DIM

        def randn(*shape, scale):
            return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)

        # The full model's weights are drawn with the same seed on every rank,
        # then sliced to this rank's heads, so TP results can be compared.
        full_q = randn(128 * HEAD_DIM, HIDDEN_SIZE, scale=HIDDEN_SIZE**-0.5)
        full_k = randn(16 * HEAD_DIM, HIDDEN_SIZE, scale=HIDDEN_SIZE**-0.5)
        full_v = randn(16 * HEAD_DIM, HIDDEN_SIZE, scale=HIDDEN_SIZE**-0.5)
        full_g = randn(128 * HEAD_DIM, HIDDEN_SIZE, scale=HIDDEN_SIZE**-0.5)
        full_o = randn(HIDDEN_SIZE, 128 * HEAD_DIM, scale=(128 * HEAD_DIM) ** -0.5)
        qs = slice(tp_rank * self.num_heads * HEAD_DIM, (tp_rank + 1) * self.num_heads * HEAD_DIM)
        ks = slice(tp_rank * kvh * HEAD_DIM, (tp_rank + 1) * kvh * HEAD_DIM)
        weight = torch.cat((full_q[qs], full_k[ks], full_v[ks], full_g[qs])).contiguous()
        assert weight.shape[0] == n
        self.qkv_proj = SimpleNamespace(weight=weight, bias=None, quant_method=None, gather_output=False,
                                        tp_size=tp_size)
        self.o_proj = SimpleNamespace(weight=full_o[:, qs].contiguous(), bias=None, quant_method=None,
                                      input_is_parallel=True, tp_size=tp_size)
        self.rotary_emb = (SimpleNamespace(rotary_dim=HEAD_DIM, is_neox_style=False,
                                           cos_sin_cache=rope_table(max_model_len, device))
                           if self.use_rope else None)
        self.post_attention_norm = (1.0 + 0.1 * torch.randn(HIDDEN_SIZE, generator=g)).to(device=device, dtype=dtype)
        # The router: fp32, replicated; its output multiplier folded after loading.
        self.router = router(weight=(torch.randn(NUM_EXPERTS, HIDDEN_SIZE, generator=g) * HIDDEN_SIZE**-0.5).to(device),
                             expert_bias=(torch.randn(NUM_EXPERTS, generator=g) * 0.01).to(device),
                             output_multiplier=2.0**-2.5)
        fold_router_output_multiplier(self.router)
        self.local_expert_offset = tp_rank * (NUM_EXPERTS // tp_size)
        self.num_local_experts = NUM_EXPERTS // tp_size
        self.tile_n = tile_n
        self._fused_ready = False
        self.block_reason = "prepare() has not run"  # why prepare() left attention_block out, or None
        self.attention_path: AttentionPath | None = None  # the last step's

    # ---------------------------------------------------------------------
    def unsupported(self) -> str | None:
        """Why this layer cannot use the fused ops at all, or None."""
        return (unsupported_attn2(self) or unsupported_projection(self) or unsupported_o_proj(self)
                or unsupported_router(self.router))

    def unsupported_block(self, num_reqs: int) -> str | None:
        """Why attention_block cannot run this layer's attention in steps of
        up to num_reqs requests (the three ops' reasons first, then the
        block's own: KV heads, requests, context), or None."""
        num_reqs = integer(num_reqs, "num_reqs")
        return unsupported_attention_block(self, self.max_model_len, num_reqs)

    def plan(self, num_tokens: int, num_reqs: int, device) -> Plan:
        """The verify step (8 tokens per request) goes to the fused ops on a
        supported GPU; prefill, other lengths, unsupported layers or GPUs go
        to the stock path. route takes at most 8 tokens, qkv_front 16, o_proj 64.
        The attention goes to attention_block where it serves the layer for
        num_reqs requests (block_reason: why not); the three ops' flags then
        say where a call it refuses goes."""
        num_tokens, num_reqs = integer(num_tokens, "num_tokens"), integer(num_reqs, "num_reqs")
        dev = torch.device(device)
        if dev.type != "cuda" or not supported_gpu(dev.index if dev.index is not None else -1):
            return Plan(False, False, False, False, "not an SM90/SM100 GPU")
        if num_tokens != QUERY_LEN * num_reqs:
            return Plan(False, False, False, False, f"{num_tokens} tokens for {num_reqs} requests is not a verify step")
        why = self.unsupported()
        if why is not None:
            return Plan(False, False, False, False, why)
        why_block = self.unsupported_block(num_reqs)
        return Plan(num_tokens <= 16, True, num_tokens <= 64, num_tokens <= 8, block=why_block is None,
                    block_reason=why_block)

    def prepare(self, num_reqs: int):
        """One-time setup of the fused path for up to num_reqs requests:
        kernel attributes, the bound routing and the workspaces (zeroed once),
        outside graph capture; attention_block's too where it serves the
        layer (block_reason: why not), the three ops staying ready for the
        calls it refuses."""
        num_reqs = integer(num_reqs, "num_reqs")
        dev = self.qkv_proj.weight.device
        prepare_attn2(dev.index or 0)
        prepare_qkv_front(dev.index or 0)
        self._o_proj = OProj(self.o_proj.weight)  # checks the weight once, prepares its device
        self.splits = attn2_splits(self.max_model_len, self.window, self.num_kv_heads)
        self.attn_ws = torch.zeros(max(attn2_workspace_bytes(num_reqs, self.num_kv_heads, self.splits), 16),
                                   dtype=torch.uint8, device=dev)
        self.front_ws = torch.zeros(qkv_front_workspace_bytes_for_device(self.num_kv_heads, dev.index or 0),
                                    dtype=torch.uint8, device=dev)
        self.routing = MuseRouting(self.router)
        self.block_ws, self.block_reason = None, self.unsupported_block(num_reqs)
        if self.block_reason is None:
            try:
                prepare_attention_block(dev.index or 0)
            except (ValueError, RuntimeError) as e:  # this GPU cannot run it: the three ops serve
                self.block_reason = f"prepare_attention_block: {e}"
        if self.block_reason is None:
            # The workspace's layout follows the requests of a call: the largest of 1..num_reqs.
            nbytes = max(attention_block_workspace_bytes(r, self.num_kv_heads, self.max_model_len, self.window)
                         for r in range(1, num_reqs + 1))
            self.block_ws = torch.zeros(nbytes, dtype=torch.uint8, device=dev)
        self._bound_cache = None  # the KV cache the bound ops below read
        self._fused_ready = True

    def _bind(self, kv_cache):
        """The front, attn2 and attention_block (where prepared) bound to this
        layer's weights, rotary table, workspaces and KV cache (validated
        once; a call then reads only the step's tensors, which keeps its host
        time within 5 us). Rebound when the cache changes."""
        if self._bound_cache is not kv_cache:
            cos_sin = self.rotary_emb.cos_sin_cache if self.rotary_emb is not None else None
            self._front = QkvFront(self.qkv_proj.weight, cos_sin, kv_cache, self.num_kv_heads, self.front_ws)
            self._attn = Attn2(kv_cache, self.attn_ws, self.max_model_len, self.window, self.splits)
            self._block = (AttentionBlock(self.qkv_proj.weight, cos_sin, kv_cache, self.num_kv_heads,
                                          self.o_proj.weight, self.max_model_len, self.window, self.block_ws)
                           if self.block_ws is not None else None)
            self._bound_cache = kv_cache

    def _block_call_reason(self, x, positions, slot_mapping, kv_cache, block_table, seq_lens, out) -> str | None:
        """Why attention_block does not take this step's call (its own check
        of the step's tensors), or None."""
        if self._block is None:
            return f"attention_block is not prepared for this layer: {self.block_reason}"
        cos_sin = self.rotary_emb.cos_sin_cache if self.rotary_emb is not None else None
        return unsupported_attention_block_call(x, self.qkv_proj.weight, positions, cos_sin, slot_mapping, kv_cache,
                                                self.num_kv_heads, block_table, seq_lens, self.max_model_len,
                                                self.window, self.o_proj.weight, out, self.block_ws)

    def new_metadata(self) -> torch.Tensor:
        """A metadata buffer for this rank's experts (int32, 16-byte aligned)."""
        return torch.full((metadata_size(self.tile_n),), -1, dtype=torch.int32, device=self.qkv_proj.weight.device)

    # ---------------------------------------------------------------------
    def forward(self, x, positions, slot_mapping, kv_cache, block_table, seq_lens, metadata, plan: Plan | None = None,
                all_reduce=None):
        t, r = x.shape[0], seq_lens.shape[0]
        plan = plan or self.plan(t, r, x.device)
        if (plan.front or plan.attention or plan.out_proj or plan.routing or plan.block) and not self._fused_ready:
            raise RuntimeError("call prepare() before a fused step (outside graph capture)")
        if plan.front or plan.attention or plan.block:
            self._bind(kv_cache)
        # The attention in one launch where the block takes the call.
        o, why_not_block = None, plan.block_reason or plan.reason or "the plan keeps the three ops"
        if plan.block:
            o = torch.empty(t, HIDDEN_SIZE, dtype=x.dtype, device=x.device)
            why_not_block = self._block_call_reason(x, positions, slot_mapping, kv_cache, block_table, seq_lens, o)
            if why_not_block is None:
                self._block(x, positions, slot_mapping, block_table, seq_lens, o)
                qkv = attn = None
            else:
                o = None
        self.attention_path = AttentionPath("attention_block" if o is not None else "three ops", why_not_block)
        if o is None:
            qkv, attn, o = self._three_ops(x, positions, slot_mapping, kv_cache, block_table, seq_lens, plan)
        if all_reduce is not None:
            all_reduce(o)
        h = x + o
        # Routing of the post-attention hidden state.
        hn = (stock.rms_norm(h) * self.post_attention_norm.float())
        logits = hn @ self.router.weight.t()
        if plan.routing:
            ids = torch.empty(t, TOP_K, dtype=torch.int32, device=x.device)
            weights = torch.empty(t, TOP_K, dtype=torch.float32, device=x.device)
            self.routing(logits, ids, weights,
                         RoutingMetadata(metadata, self.local_expert_offset, self.num_local_experts, self.tile_n))
        else:
            ids, weights = stock.route(logits, self.router.expert_bias, self.router.route_scale)
            if t <= 8:
                metadata = stock.routing_metadata(ids, self.local_expert_offset, self.num_local_experts, self.tile_n,
                                                  metadata)
        return Step(h, qkv, attn, ids, weights, metadata)

    def _three_ops(self, x, positions, slot_mapping, kv_cache, block_table, seq_lens, plan: Plan):
        """The attention as qkv_front, attn2 and o_proj, each fused or stock
        as the plan says: (qkv, attn, o)."""
        t = x.shape[0]
        cos_sin = self.rotary_emb.cos_sin_cache if self.rotary_emb is not None else None
        kvh = self.num_kv_heads
        # Attention front.
        if plan.front:
            qkv = torch.empty(t, self.qkv_proj.weight.shape[0], dtype=x.dtype, device=x.device)
            self._front(x, positions, slot_mapping, qkv)
        else:
            qkv = stock.qkv_front(x, self.qkv_proj.weight, positions, cos_sin, slot_mapping, kv_cache, kvh)
        q, gate = split_qkv(qkv, kvh)
        # Attention with o-norm and gate.
        if plan.attention:
            attn = torch.empty(t, self.num_heads * HEAD_DIM, dtype=x.dtype, device=x.device)
            self._attn(q, gate, block_table, seq_lens, attn)
        else:
            attn = stock.attn2(q, gate, kv_cache, block_table, seq_lens, self.window, self.max_model_len)
        # The output projection: this rank's partial sum.
        if plan.out_proj:
            o = torch.empty(t, HIDDEN_SIZE, dtype=x.dtype, device=x.device)
            self._o_proj(attn, o)
        else:
            o = attn @ self.o_proj.weight.t()
        return qkv, attn, o


def paged_cache(num_pages: int, num_kv_heads: int, device=None, seed: int = 0) -> torch.Tensor:
    """A random bf16 KV cache [pages, KVH, 16, 128] (the keys of earlier tokens)."""
    num_pages, num_kv_heads = integer(num_pages, "num_pages"), integer(num_kv_heads, "num_kv_heads")
    seed = integer(seed, "seed")
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(num_pages, num_kv_heads, 16, 2 * HEAD_DIM, generator=g).to(device=device, dtype=torch.bfloat16)


def verify_step_inputs(seq_lens: list[int], max_model_len: int, num_pages: int, device=None, seed: int = 0):
    """Inputs of one verify step for requests of the given lengths (each
    counting its 8 new tokens): x, positions, slot_mapping, block_table (pages
    shuffled over the cache), seq_lens."""
    seq_lens = [integer(L, f"seq_lens[{i}]") for i, L in enumerate(seq_lens)]
    max_model_len, num_pages = integer(max_model_len, "max_model_len"), integer(num_pages, "num_pages")
    seed = integer(seed, "seed")
    g = torch.Generator(device="cpu").manual_seed(seed)
    r = len(seq_lens)
    per_req = math.ceil(max_model_len / 16)
    need = sum(math.ceil(L / 16) for L in seq_lens)
    if need > num_pages:
        raise ValueError(f"{need} pages needed, the cache has {num_pages}")
    perm = torch.randperm(num_pages, generator=g)
    table = torch.zeros(r, per_req, dtype=torch.int32)
    positions, slots, used = [], [], 0
    for i, L in enumerate(seq_lens):
        n = math.ceil(L / 16)
        table[i, :n] = perm[used : used + n].int()
        used += n
        for p in range(L - QUERY_LEN, L):
            positions.append(p)
            slots.append(int(table[i, p // 16]) * 16 + p % 16)
    x = (torch.randn(QUERY_LEN * r, HIDDEN_SIZE, generator=g)).to(device=device, dtype=torch.bfloat16)
    return (x, torch.tensor(positions, device=device), torch.tensor(slots, device=device), table.to(device),
            torch.tensor(seq_lens, dtype=torch.int32, device=device))
