"""The stock PyTorch path of each op: what an engine runs where the fused
kernels do not apply, the reference the fused path is compared with, and the
anchor the benchmarks time. Plain PyTorch, any device, capturable in a CUDA
graph (fixed shapes, no host synchronisation)."""

from __future__ import annotations

import torch

from ._arguments import integer, optional_integer
from .constants import DIVISION_EPS, HEAD_DIM, HEADS_PER_KV_HEAD, PAGE_SIZE, RMS_NORM_EPS, SM_SCALE, TOP_K


def route(logits, bias, route_scale: float = 1.0):
    """The routing formula of docs/contract.md (sigmoid scores, top-8 of score
    + bias, weights normalised by the sum of the 8 scores + 1e-15): ids
    (int32 [b, 8]) and weights (fp32 [b, 8]).
    torch.topk ranks NaN first and breaks ties toward the lower expert, as
    the kernel does; the weights' sum here is torch's reduction order."""
    s = torch.sigmoid(logits)
    ids = torch.topk(s + bias, TOP_K, dim=-1, sorted=True).indices
    top = s.gather(1, ids)
    return ids.to(torch.int32), (top * route_scale) / (top.sum(-1, keepdim=True) + DIVISION_EPS)


def routing_metadata(ids, local_expert_offset: int, num_local_experts: int, tile_n: int, buffer):
    """The TRT-LLM-gen metadata of `ids` (int32 [b, 8]) for local experts
    [offset, offset + count) and tile_n, written into a copy of `buffer`
    (int32, the layout of muse_decode.RoutingMetadata) and returned; entries
    the kernel does not write keep the buffer's values."""
    from ._route import RoutingMetadata

    off, n = integer(local_expert_offset, "local_expert_offset"), integer(num_local_experts, "num_local_experts")
    tile = integer(tile_n, "tile_n")
    b = ids.shape[0]
    routes = TOP_K * b
    flat = ids.flatten().long()
    j = flat - off
    local = (j >= 0) & (j < n)
    jc = torch.where(local, j, torch.full_like(j, n))
    onehot = torch.nn.functional.one_hot(jc, n + 1)[:, :n]
    count = onehot.sum(0)
    ncta = (count + tile - 1) // tile
    ends = torch.cumsum(ncta, 0)
    first = ends - ncta
    total = ends[-1]
    jj = jc.clamp(max=n - 1)
    rank = (torch.cumsum(onehot, 0) - onehot).gather(1, jj[:, None])[:, 0]
    p = torch.where(local, first[jj] * tile + rank, torch.full_like(j, -1))
    g = torch.arange(routes, device=ids.device)
    eg = torch.searchsorted(ends, g, right=True).clamp(max=n - 1)
    limit = torch.minimum((g + 1) * tile, first[eg] * tile + count[eg])
    perm = torch.full((routes * tile + 1,), -1, dtype=torch.long, device=ids.device)
    perm.scatter_(0, torch.where(local, p, torch.full_like(p, routes * tile)), torch.arange(routes, device=ids.device) // 8)
    out = buffer.clone()
    f = RoutingMetadata(out, off, n, tile).fields(b)
    f["total_num_padded_tokens"].copy_((total * tile).reshape(1))
    f["num_non_exiting_ctas"].copy_(total.reshape(1))
    f["expanded_idx_to_permuted_idx"].copy_(p)
    cta = g < total
    f["cta_idx_xy_to_batch_idx"].copy_(torch.where(cta, eg, f["cta_idx_xy_to_batch_idx"].long()))
    f["cta_idx_xy_to_mn_limit"].copy_(torch.where(cta, limit, f["cta_idx_xy_to_mn_limit"].long()))
    rows = torch.arange(routes * tile, device=ids.device) < total * tile
    pt = f["permuted_idx_to_token_idx"]
    pt[: routes * tile].copy_(torch.where(rows, perm[: routes * tile], pt[: routes * tile].long()))
    return out


def rms_norm(x, eps: float = RMS_NORM_EPS):
    """Weightless RMS norm over the last dimension, in fp32."""
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rope_interleaved(x, positions, cos_sin):
    """Interleaved-pair RoPE of x [..., T, heads, 64] (fp32) at `positions`
    from the fp32 table [max_pos, 64] (cos in 0:32, sin in 32:64)."""
    cs = cos_sin[positions]
    c, s = cs[:, None, :32], cs[:, None, 32:]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), -1).flatten(-2)


def qkv_front(x, weight, positions, cos_sin, slot_mapping, kv_cache, num_kv_heads: int):
    """The unfused attention front: out = [q | k | v | gate] of x W^T with q
    and k normed (and roped when cos_sin is given); k and v written to the
    cache slots (slot -1: none). Returns out (bf16 [T, N])."""
    num_kv_heads = integer(num_kv_heads, "num_kv_heads")
    t = x.shape[0]
    h = HEADS_PER_KV_HEAD * num_kv_heads
    y = x @ weight.t()
    qk = rms_norm(y[:, : (h + num_kv_heads) * HEAD_DIM].view(t, h + num_kv_heads, HEAD_DIM))
    if cos_sin is not None:
        qk = rope_interleaved(qk, positions, cos_sin)
    y[:, : (h + num_kv_heads) * HEAD_DIM] = qk.flatten(1).to(y.dtype)
    k = y[:, h * HEAD_DIM : (h + num_kv_heads) * HEAD_DIM].view(t, num_kv_heads, HEAD_DIM)
    v = y[:, (h + num_kv_heads) * HEAD_DIM : (h + 2 * num_kv_heads) * HEAD_DIM].view(t, num_kv_heads, HEAD_DIM)
    keep = slot_mapping >= 0
    slots = torch.where(keep, slot_mapping, torch.zeros_like(slot_mapping))
    page, row = slots // PAGE_SIZE, slots % PAGE_SIZE
    # Pad tokens (slot -1) write back what the slot already holds.
    old = kv_cache[page, :, row]
    kv_cache[page, :, row] = torch.where(keep[:, None, None], torch.cat((k, v), -1), old)
    return y


def attn2(q, gate, kv_cache, block_table, seq_lens, window: int = 0, max_len: int | None = None):
    """The unfused verify-step attention: for each request, its pages
    gathered, softmax(scale q K^T) V over the visible keys (causal, window),
    then the weightless o-norm and the sigmoid gate. q and gate [R*8, H*64];
    returns bf16 [R*8, H*64]. max_len bounds the keys gathered (the
    deployment's max_model_len), so shapes do not depend on the lengths."""
    window, max_len = integer(window, "window"), optional_integer(max_len, "max_len")
    rows, width = q.shape
    kvh = width // (HEADS_PER_KV_HEAD * HEAD_DIM)
    r = rows // 8
    max_len = max_len or block_table.shape[1] * PAGE_SIZE
    pages = block_table[:, : (max_len + PAGE_SIZE - 1) // PAGE_SIZE].long()
    pages = pages.clamp(0, kv_cache.shape[0] - 1)
    kv = kv_cache[pages]  # [R, P, KVH, 16, 128]
    kv = kv.permute(0, 2, 1, 3, 4).reshape(r, kvh, -1, 2 * HEAD_DIM).float()
    qh = q.float().view(r, 8, kvh, HEADS_PER_KV_HEAD, HEAD_DIM)
    scores = SM_SCALE * torch.einsum("rihgd,rhjd->rihgj", qh, kv[..., :HEAD_DIM])
    pos = seq_lens.long()[:, None] - 8 + torch.arange(8, device=q.device)[None, :]  # [R, 8]
    j = torch.arange(kv.shape[2], device=q.device)
    visible = j[None, None, :] <= pos[:, :, None]
    if window:
        visible &= j[None, None, :] > pos[:, :, None] - window
    scores = scores.masked_fill(~visible[:, :, None, None, :], float("-inf"))
    o = torch.einsum("rihgj,rhjd->rihgd", torch.softmax(scores, -1), kv[..., HEAD_DIM:])
    o = rms_norm(o) * torch.sigmoid(gate.float().view(r, 8, kvh, HEADS_PER_KV_HEAD, HEAD_DIM))
    return o.reshape(rows, width).to(q.dtype)
