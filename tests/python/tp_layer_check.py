"""The Muse Spark layer at TP2, TP4 and TP8 against TP1: each rank holds its
KV heads (16 / TP of them) and its experts (256 / TP), o_proj's partial sums
are added with torch.distributed.all_reduce, and the step must match the
one-rank result within the contract's tolerance (the rank's attention rows
against the same heads of TP1, and the hidden state after the residual:
relative RMS per row <= 5e-3; routing: ids and weights equal to the
contract's formula on the rank's own logits where the keys are separated (the
TP sizes round o_proj differently, so their logits differ in the last bits),
each rank's metadata of its own experts). On the fused path the plan must
send the attention to attention_block where it serves (TP4 and TP8) and to
the three ops elsewhere.

    python tests/python/tp_layer_check.py --backend nccl --path fused --time  # every TP size the GPUs allow
    python tests/python/tp_layer_check.py --backend gloo --path fused --tp 8  # the 8 ranks on the GPUs there are
    python tests/python/tp_layer_check.py --backend gloo --path stock --tp 4  # CPU

With --time each rank also times its step (its own kernels, without the
all-reduce) by CUDA-graph replay over layers whose weights and caches exceed
the L2 (bench/harness.py's Timer), with attention_block and with the three ops, beside TP1 on the same
GPU; the ranks take turns, so ranks sharing a GPU do not overlap.

Keep NVLink multicast off on shared machines: NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1 (set here)."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from types import SimpleNamespace

for k, v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(k, v)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import muse_decode as md  # noqa: E402
from muse_decode import layer as L  # noqa: E402
from muse_decode import stock  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from harness import Timer  # noqa: E402  (the benchmarks' CUDA-graph timing)

MAX_LEN, PAGES, LENS, LAYER = 4096, 160, [1500], 0
TP_SIZES = (2, 4, 8)
STOCK = L.Plan(False, False, False, False, "forced")
TIMED_LAYERS = 4  # TP8: 4 x (37.7 MB of qkv weight + 16.8 MB of o_proj's + the router's 8.4 MB), past the 60 MB L2


def step(tp_rank, tp_size, device, fused, all_reduce=None, seed=0):
    """One verify step of one rank: the layer, its inputs and its output."""
    layer = L.MuseSparkAttentionRouting(LAYER, MAX_LEN, tp_rank=tp_rank, tp_size=tp_size, device=device, seed=seed)
    kvh = layer.num_kv_heads
    full = L.paged_cache(PAGES, 16, device, seed=seed)
    cache = full[:, tp_rank * kvh : (tp_rank + 1) * kvh].contiguous()
    x, pos, slots, table, lens = L.verify_step_inputs(LENS, MAX_LEN, PAGES, device, seed=seed)
    plan = STOCK
    if fused:
        layer.prepare(num_reqs=len(LENS))
        plan = layer.plan(x.shape[0], len(LENS), device)
        # The three ops fused; attention_block where it serves: 2 or 4 KV heads per rank (TP8, TP4).
        expect = (True,) * 4 + (kvh <= 4,)
        assert (plan.front, plan.attention, plan.out_proj, plan.routing, plan.block) == expect, (tp_size, plan)
    args = (x, pos, slots, cache, table, lens, layer.new_metadata())
    out = layer(*args, plan, all_reduce)
    return SimpleNamespace(layer=layer, args=args, plan=plan, out=out)


def rel_rms_rows(a, b):
    a, b = a.double(), b.double()
    return ((a - b).pow(2).sum(-1) / b.pow(2).sum(-1)).sqrt()


def compare(one, many, rank):
    s1, s2, layer2 = one.out, many.out, many.layer
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


def step_us(timer, steps, plan, rounds=8):
    """us per step of one rank (its kernels, no all-reduce): `rounds` passes
    over `steps` (one per layer) in one CUDA graph, timed as the benchmarks
    time (bench/harness.py: the L2 emptied before each replay, median of 7)."""
    return timer.graph_us([functools.partial(s.layer, *s.args, plan) for _ in range(rounds) for s in steps])


def timed_steps(rank, world, device):
    """The layers this rank times (TIMED_LAYERS of its own and of TP1's)."""
    return ([step(rank, world, device, True, seed=s) for s in range(TIMED_LAYERS)],
            [step(0, 1, device, True, seed=s) for s in range(TIMED_LAYERS)])


def rank_times(mine, ones):
    """This rank's step with attention_block (where it serves) and with the
    three ops, and TP1's on the same GPU, us."""
    three = L.Plan(True, True, True, True)
    timer = Timer()
    t = {"three_ops": step_us(timer, mine, three), "tp1": step_us(timer, ones, three)}
    if mine[0].plan.block:
        t["block"] = step_us(timer, mine, mine[0].plan)
    return t


def rank_device(backend, path, rank):
    if backend == "gloo" and path == "stock":
        return "cpu"
    return f"cuda:{rank % torch.cuda.device_count()}"  # nccl: one GPU per rank (checked by run)


def worker(rank, world, backend, path, port, timed, out):
    device = rank_device(backend, path, rank)
    if device != "cpu":
        torch.cuda.set_device(torch.device(device))
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        many = step(rank, world, device, path == "fused", all_reduce=dist.all_reduce)
        one = step(0, 1, device, path == "fused")  # the same step on one rank
        err = compare(one, many, rank)
        times = None
        if timed:
            del many, one
            mine, ones = timed_steps(rank, world, device)  # every rank at once
            for turn in range(world):  # the timing one rank at a time
                dist.barrier()
                if turn == rank:
                    times = rank_times(mine, ones)
            dist.barrier()
        out.put((rank, "ok", err, times))
    except Exception as e:  # reported to the parent
        out.put((rank, f"{type(e).__name__}: {e}", None, None))
    finally:
        dist.destroy_process_group()


def run(backend="gloo", path="stock", world=2, port=29533, timed=False):
    """Runs the check at TP `world`; returns (rank, status, error, times) per rank."""
    if world not in TP_SIZES:
        raise ValueError(f"world: TP {world} is not one of {TP_SIZES}")
    if backend == "nccl" and torch.cuda.device_count() < world:
        raise ValueError(f"world: TP {world} over NCCL needs {world} GPUs, found {torch.cuda.device_count()}")
    if timed and (path != "fused" or not torch.cuda.is_available()):
        raise ValueError("timed: the step is timed on the fused path on GPUs only")
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    procs = [ctx.Process(target=worker, args=(r, world, backend, path, port, timed, out)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(900)
    return sorted(out.get() for _ in range(world))


def line(rank, status, err, times):
    s = f"rank {rank}: {status}" + (f" (worst relative RMS vs TP1 {err:.2e})" if err is not None else "")
    if times:
        parts = [f"attention_block {times['block']:.2f}"] if "block" in times else []
        parts += [f"three ops {times['three_ops']:.2f}", f"TP1 {times['tp1']:.2f}"]
        s += "; step us: " + ", ".join(parts)
    return s


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="nccl", choices=["nccl", "gloo"])
    ap.add_argument("--path", default="fused", choices=["fused", "stock"])
    ap.add_argument("--tp", type=int, action="append", choices=TP_SIZES,
                    help="a TP size (repeatable); default: over NCCL every one the GPUs allow, else 2")
    ap.add_argument("--time", action="store_true", help="time each rank's step beside TP1's (fused path, GPUs)")
    args = ap.parse_args()
    sizes = args.tp
    if sizes is None:
        sizes = [t for t in TP_SIZES if t <= torch.cuda.device_count()] if args.backend == "nccl" else [2]
    if not sizes:
        sys.exit(f"tp_layer_check: NCCL needs at least 2 GPUs, found {torch.cuda.device_count()}")
    status = 0
    for i, tp in enumerate(sizes):
        try:
            res = run(args.backend, args.path, tp, port=29533 + i, timed=args.time)
        except ValueError as e:
            sys.exit(f"tp_layer_check: {e}")
        print(f"TP{tp} against TP1 ({args.backend}, {args.path} path):")
        for r in res:
            print("  " + line(*r))
        status |= not all(s == "ok" for _, s, _, _ in res)
    sys.exit(status)
