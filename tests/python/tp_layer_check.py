"""The Muse Spark layer at TP2 against TP1: each rank holds its KV heads
(8 of 16) and its experts (128 of 256), o_proj's partial sums are added with
torch.distributed.all_reduce, and the step must match the one-rank result
within the contract's tolerance (the rank's attention rows against the same heads of TP1, and the hidden
state after the residual: relative RMS per row <= 5e-3; routing: ids and
weights equal to the contract's formula on the rank's own logits where the keys are
separated (the two TP sizes round o_proj differently, so their logits differ
in the last bits), each rank's metadata of its own experts).

    python tests/python/tp_layer_check.py --backend nccl --path fused   # 2 GPUs
    python tests/python/tp_layer_check.py --backend gloo --path stock   # CPU

Keep NVLink multicast off on shared machines: NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1 (set here)."""

from __future__ import annotations

import argparse
import os
import sys

for k, v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(k, v)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import muse_decode as md  # noqa: E402
from muse_decode import layer as L  # noqa: E402
from muse_decode import stock  # noqa: E402

MAX_LEN, PAGES, LENS, LAYER = 4096, 160, [1500], 0
STOCK = L.Plan(False, False, False, False, "forced")


def step(tp_rank, tp_size, device, fused, all_reduce=None):
    layer = L.MuseSparkAttentionRouting(LAYER, MAX_LEN, tp_rank=tp_rank, tp_size=tp_size, device=device)
    kvh = layer.num_kv_heads
    full = L.paged_cache(PAGES, 16, device)
    cache = full[:, tp_rank * kvh : (tp_rank + 1) * kvh].contiguous()
    x, pos, slots, table, lens = L.verify_step_inputs(LENS, MAX_LEN, PAGES, device)
    plan = STOCK
    if fused:
        layer.prepare(num_reqs=len(LENS))
        plan = layer.plan(x.shape[0], len(LENS), device)
        # TP2 and TP1 ranks (8 and 16 KV heads): the three ops, attention_block serving TP8 and TP4 only.
        assert (plan.front, plan.attention, plan.out_proj, plan.routing, plan.block) == (True,) * 4 + (False,), plan
    out = layer(x, pos, slots, cache, table, lens, layer.new_metadata(), plan, all_reduce)
    return x, out, layer


def rel_rms_rows(a, b):
    a, b = a.double(), b.double()
    return ((a - b).pow(2).sum(-1) / b.pow(2).sum(-1)).sqrt()


def compare(one, two, rank):
    x, s1, _ = one
    _, s2, layer2 = two
    heads = layer2.num_heads * 64
    attn1 = s1.attn[:, rank * heads : (rank + 1) * heads]
    err = max(rel_rms_rows(s2.attn, attn1).max().item(), rel_rms_rows(s2.hidden, s1.hidden).max().item())
    assert err <= 5e-3, err
    logits = (stock.rms_norm(s2.hidden) * layer2.post_attention_norm.float()) @ layer2.router.weight.t()
    ids_ref, w_ref = stock.route(logits, layer2.router.expert_bias, layer2.router.route_scale)
    keys = torch.sort(torch.sigmoid(logits) + layer2.router.expert_bias, dim=-1, descending=True).values
    ok = (keys[:, 7] - keys[:, 8]) > 1e-5
    assert ok.any()
    assert torch.equal(s2.ids[ok], ids_ref[ok].to(s2.ids.dtype)), "ids differ from the formula"
    assert torch.allclose(s2.weights[ok], w_ref[ok].float(), rtol=1e-5, atol=1e-7), "weights differ from the formula"
    # This rank's metadata describes its own experts: every local route present.
    f = md.RoutingMetadata(s2.metadata, layer2.local_expert_offset, layer2.num_local_experts, layer2.tile_n).fields(8)
    local = (s2.ids >= layer2.local_expert_offset) & (s2.ids < layer2.local_expert_offset + layer2.num_local_experts)
    assert ((f["expanded_idx_to_permuted_idx"] >= 0) == local.flatten()).all(), "metadata misses a local route"
    return err


def worker(rank, world, backend, path, port, out):
    device = f"cuda:{rank}" if backend == "nccl" else "cpu"
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        two = step(rank, world, device, path == "fused", all_reduce=dist.all_reduce)
        one = step(0, 1, device, path == "fused")  # the same step on one rank
        err = compare(one, two, rank)
        out.put((rank, "ok", err))
    except Exception as e:  # reported to the parent
        out.put((rank, f"{type(e).__name__}: {e}", None))
    finally:
        dist.destroy_process_group()


def run(backend="gloo", path="stock", world=2, port=29533):
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    procs = [ctx.Process(target=worker, args=(r, world, backend, path, port, out)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(600)
    results = sorted(out.get() for _ in range(world))
    return results


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="nccl", choices=["nccl", "gloo"])
    ap.add_argument("--path", default="fused", choices=["fused", "stock"])
    args = ap.parse_args()
    res = run(args.backend, args.path)
    for rank, status, err in res:
        print(f"rank {rank}: {status}" + (f" (worst relative RMS vs TP1 {err:.2e})" if err is not None else ""))
    sys.exit(0 if all(s == "ok" for _, s, _ in res) else 1)
