"""attn2 benchmark with its anchors, in one run: our kernel (through the
Python package, programmatic dependent launch on as by default; us_no_pdl is
the same call launched plainly), FlashInfer's paged attention with 8 query
tokens per request (BatchPrefillWithPagedKVCacheWrapper, causal, page size
16, each of its SM90 backends, fa2 and fa3, JIT-built on this machine) and
the stock PyTorch path (muse_decode.stock.attn2: page gather + attention +
o-norm + gate). Same shapes, same K/V bytes: FlashInfer reads our cache
through two strided views (K = columns 0:64, V = 64:128 of each key row,
HND layout), so it moves exactly the bytes we move.

FlashInfer computes attention only; we also apply the o-norm and the sigmoid
gate, so the comparison favours it. Its output, normed and gated in PyTorch,
is checked against ours (max relative RMS per row and head) so that both time
the same problem.

Every number: CUDA-graph replay of many calls per graph, each call on its own
copy of the pages (the L2 is scrubbed by a read before each replay, so no call finds
its pages there), median of the replays (bench/harness.py). Floor = (visible
K/V bytes + q + gate + out) / 4.2 TB/s. Bars: TP8 (one request), the
latency bars of TP8_BAR_US below; TP1 x 8 at least 80% of 4.2 TB/s from 32k
keys on (shorter ones have no bar: launch and merge costs dominate); at least
1.3x faster than FlashInfer on every shape.

  python3 bench/bench_attn2.py                 # writes bench/results/attn2.json
  python3 bench/bench_attn2.py --warm-flashinfer   # only JIT-builds FlashInfer's modules
"""

from __future__ import annotations

import math
import os
import sys
import traceback
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

SCALE = 0.6841258107984375
L2_BYTES = 60 << 20

# (name, KV heads, requests, max_model_len, sliding window, L)
SHAPES = [
    ("tp8", 2, 1, 131072, 0, 2048),
    ("tp8", 2, 1, 131072, 0, 8192),
    ("tp8", 2, 1, 131072, 0, 32768),
    ("tp8", 2, 1, 131072, 0, 131072),
    ("tp8_swa", 2, 1, 131072, 2048, 131072),
    ("tp8_short", 2, 1, 2048, 0, 2048),
    ("tp1x8", 16, 8, 131072, 0, 8192),
    ("tp1x8", 16, 8, 131072, 0, 32768),
    ("tp1x8", 16, 8, 131072, 0, 131072),
]

# TP8 latency bars (us) by (max_model_len, window, L): the kernel's measured
# limit plus machine-to-machine noise. At TP8 a call reads 1 MB (2k, the
# window) to 67 MB (128k), floors of 0.26-16 us; about 3 us of launch, pipeline
# fill and cross-SM merge come on top (docs/attn2.md).
TP8_BAR_US = {
    (131072, 0, 2048): 3.9,
    (131072, 0, 8192): 5.9,
    (131072, 0, 32768): 10.4,
    (131072, 0, 131072): 23.0,
    (131072, 2048, 131072): 3.7,
    (2048, 0, 2048): 3.4,
}


def flashinfer_or_reason():
    try:
        import flashinfer  # noqa: F401

        use_carried_modules(flashinfer)
        return flashinfer, None
    except Exception as e:  # noqa: BLE001 - the reason goes into the results
        return None, f"import flashinfer failed: {type(e).__name__}: {e}"


def use_carried_modules(fi):
    """FlashInfer's JIT costs minutes of device time: modules an earlier run
    built on the same image (.fi_cache/<name>.so, git-ignored) go where
    FlashInfer looks for prebuilt ones (flashinfer/data/aot/<name>/<name>.so)."""
    import glob
    import shutil

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    aot = os.path.join(os.path.dirname(fi.__file__), "data", "aot")
    for so in glob.glob(os.path.join(here, ".fi_cache", "*.so")):
        name = os.path.basename(so)[:-3]
        dst = os.path.join(aot, name, name + ".so")
        if not os.path.exists(dst):
            try:
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                shutil.copy(so, dst)
            except OSError as e:
                print(f"flashinfer: cannot use the carried {name}: {e}")


class FlashInferCall:
    """One planned wrapper (fixed buffers, so its run() is graph-capturable)."""

    def __init__(self, fi, backend, kvh, lens, table_rows, window):
        dev = "cuda"
        R = len(lens)
        npages = [(L + 15) // 16 for L in lens]
        self.ws = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
        qo = torch.arange(R + 1, dtype=torch.int32, device=dev) * 8
        kv_indptr = torch.tensor([0] + list(torch.tensor(npages).cumsum(0).tolist()), dtype=torch.int32, device=dev)
        indices = torch.cat([table_rows[r, : npages[r]] for r in range(R)]).to(torch.int32)
        last = torch.tensor([(L - 1) % 16 + 1 for L in lens], dtype=torch.int32, device=dev)
        self.w = fi.BatchPrefillWithPagedKVCacheWrapper(
            self.ws, kv_layout="HND", use_cuda_graph=True, qo_indptr_buf=qo.clone(),
            paged_kv_indptr_buf=kv_indptr.clone(), paged_kv_indices_buf=indices.clone(),
            paged_kv_last_page_len_buf=last.clone(), backend=backend)
        self.w.plan(qo, kv_indptr, indices, last, kvh * 8, kvh, 64, 16, causal=True, sm_scale=SCALE,
                    window_left=window - 1 if window else -1, q_data_type=torch.bfloat16,
                    kv_data_type=torch.bfloat16)

    def __call__(self, q3, cache, out3):
        return self.w.run(q3, (cache[..., :64], cache[..., 64:]), out=out3)


def warm_flashinfer():
    """Build FlashInfer's modules for our problem (both SM90 backends) on a tiny input."""
    fi, why = flashinfer_or_reason()
    if fi is None:
        print("flashinfer:", why)
        return 1
    status = 0
    cache = torch.randn(8, 2, 16, 128, device="cuda").to(torch.bfloat16)
    table = torch.arange(8, dtype=torch.int32, device="cuda")[None]
    q = torch.randn(8, 16, 64, device="cuda").to(torch.bfloat16)
    for backend in ("fa2", "fa3"):
        for window in (0, 2048):
            try:
                call = FlashInferCall(fi, backend, 2, [100], table, window)
                out = torch.empty_like(q)
                call(q, cache, out)
                torch.cuda.synchronize()
                print(f"flashinfer {backend} window {window}: built and ran", flush=True)
            except Exception:  # noqa: BLE001
                status = 1
                print(f"flashinfer {backend} window {window} failed:\n{traceback.format_exc()}", flush=True)
    return status


def make_inputs(kvh, R, mml, L, splits, calls):
    """One shape's inputs, as every attn2 timing here uses them: `calls`
    copies of every request's L keys' pages (one copy per call, so that the
    calls of a graph rotate past the L2), a shuffled block table (request r
    takes pages r * P .. of a copy, P = its pages), lengths L, one qkv row
    block (q and the gate), an output per call and a zeroed workspace."""
    import muse_decode as md

    pages_per_req = (L + 15) // 16
    per_copy = R * pages_per_req
    g = torch.Generator(device="cuda").manual_seed(L + kvh)
    cache = torch.empty(calls * per_copy, kvh, 16, 128, dtype=torch.bfloat16, device="cuda")
    cache.uniform_(-1, 1, generator=g)
    perm = torch.randperm(per_copy, device="cuda", generator=g).to(torch.int32)
    table = torch.zeros(R, (mml + 15) // 16, dtype=torch.int32, device="cuda")
    for r in range(R):
        table[r, :pages_per_req] = perm[r * pages_per_req : (r + 1) * pages_per_req]
    qkv = torch.randn(R * 8, 2 * (kvh * 8 + kvh) * 64, device="cuda", generator=g).to(torch.bfloat16)
    q, gate = md.split_qkv(qkv, kvh)
    md.prepare_attn2()
    return SimpleNamespace(
        cache=cache, copies=[cache[c * per_copy : (c + 1) * per_copy] for c in range(calls)], table=table,
        lens=torch.full((R,), L, dtype=torch.int32, device="cuda"), qkv=qkv, q=q, gate=gate,
        outs=torch.empty(calls, R * 8, kvh * 512, dtype=torch.bfloat16, device="cuda"),
        ws=torch.zeros(max(16, md.attn2_workspace_bytes(R, kvh, splits)), dtype=torch.uint8, device="cuda"))


def run_shape(shape, fi, timer, stock_timer):
    import muse_decode as md
    from muse_decode import stock

    name, kvh, R, mml, sliding, L = shape
    window = md.attn2_window(sliding or None, mml)
    splits = md.attn2_splits(mml, window, kvh)
    lo = max(0, L - 7 - window) if window else 0
    vis_keys = L - lo
    width = kvh * 512
    nbytes = R * kvh * vis_keys * 256 + 3 * R * 8 * width * 2
    floor = harness.floor_us(nbytes)
    tp1 = kvh == 16
    bar = (floor / 0.8 if L >= 32768 else None) if tp1 else TP8_BAR_US[(mml, sliding, L)]
    # Every request's pages (all L keys: the stock path and FlashInfer take the
    # whole page list; the window is applied inside), one copy per call.
    pages_per_req = (L + 15) // 16
    read_per_call = R * kvh * vis_keys * 256
    calls = max(16, min(60, math.ceil(3 * L2_BYTES / read_per_call)))
    # And at least as many as bench_attn2.cu: a graph's first call has no PDL
    # predecessor to overlap (the no-PDL cost), and a model step runs attn2
    # once per layer behind qkv_front, so the steady state is what counts.
    mib = 1 << 20
    calls = max(calls, 60 if read_per_call <= 16 * mib else 30 if read_per_call <= 256 * mib else 10)
    if read_per_call * calls > (12 << 30):
        calls = max(2, (12 << 30) // (R * kvh * pages_per_req * 4096))
    x = make_inputs(kvh, R, mml, L, splits, calls)
    q, gate, copies, table, lens, outs, ws = x.q, x.gate, x.copies, x.table, x.lens, x.outs, x.ws

    def ours(c, pdl=True):
        return md.attn2(q, gate, copies[c], table, lens, outs[c], ws, mml, window, splits, pdl=pdl)

    row = dict(op="attn2", shape=name, num_kv_heads=kvh, num_reqs=R, max_model_len=mml, window=window, seq_len=L,
               num_splits=splits, calls_per_graph=calls)
    us = timer.graph_us([lambda c=c: ours(c) for c in range(calls)])
    us_no_pdl = timer.graph_us([lambda c=c: ours(c, False) for c in range(calls)])
    row.update(us_per_call=round(us, 3), us_no_pdl=round(us_no_pdl, 3), floor_us=round(floor, 3),
               bar_us=round(bar, 3) if bar else None, pct_of_copy_bw=round(100 * floor / us, 1),
               meets_bar=None if bar is None else us <= bar)
    ref_out = outs[0].clone()
    row["output_finite"] = bool(torch.isfinite(ref_out).all())

    # Stock PyTorch path: gathers the L keys' pages (max_len = L, its best case).
    n_stock = max(2, min(8, calls))
    try:
        st = stock_timer.graph_us([lambda c=c: stock.attn2(q, gate, copies[c], table, lens, window, L)
                                   for c in range(n_stock)])
        row["stock_us"] = round(st, 2)
        row["speedup_vs_stock"] = round(st / us, 1)
    except Exception as e:  # noqa: BLE001
        row["stock_us"] = None
        row["stock_error"] = f"{type(e).__name__}: {e}"[:200]
        torch.cuda.empty_cache()

    # FlashInfer, each backend; the best one is the anchor.
    best = None
    if fi is not None:
        q3 = q.unflatten(1, (kvh * 8, 64))
        out3 = torch.empty(R * 8, kvh * 8, 64, dtype=torch.bfloat16, device="cuda")
        for backend in ("fa2", "fa3"):
            try:
                call = FlashInferCall(fi, backend, kvh, [L] * R, table, window)
                out3.fill_(float("nan"))
                call(q3, copies[0], out3)
                row[f"flashinfer_{backend}_output_finite"] = bool(torch.isfinite(out3).all())
                o = out3.double()
                o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-5) * torch.sigmoid(
                    gate.double().unflatten(1, (kvh * 8, 64)))
                got = ref_out.double().unflatten(1, (kvh * 8, 64))
                err = ((got - o).pow(2).sum(-1) / o.pow(2).sum(-1)).sqrt().max().item()
                t = timer.graph_us([lambda c=c: call(q3, copies[c], out3) for c in range(calls)])
                row[f"flashinfer_{backend}_us"] = round(t, 3)
                row[f"flashinfer_{backend}_vs_ours_rel_rms"] = float(f"{err:.2e}")
                if best is None or t < best[1]:
                    best = (backend, t)
                del call
            except Exception as e:  # noqa: BLE001
                row[f"flashinfer_{backend}_us"] = None
                row[f"flashinfer_{backend}_error"] = f"{type(e).__name__}: {e}"[:300]
    if best is not None:
        row.update(flashinfer_us=round(best[1], 3), flashinfer_backend=best[0],
                   speedup_vs_flashinfer=round(best[1] / us, 2), meets_flashinfer_bar=best[1] / us >= 1.3)
    else:
        row.update(flashinfer_us=None, speedup_vs_flashinfer=None)
    return row  # (the shape's tensors go with this frame; main empties the cache)


def main():
    if "--warm-flashinfer" in sys.argv:
        return warm_flashinfer()
    import muse_decode as md

    if not torch.cuda.is_available() or md.gpu_family() not in ("sm90", "sm100"):
        print("bench_attn2: no supported GPU:", md.unavailable("attn2"))
        return 0
    fi, why = flashinfer_or_reason()
    if fi is None:
        print("flashinfer anchor not timed:", why)
    timer = harness.Timer()
    stock_timer = harness.Timer(replays=3)
    only = os.environ.get("ATTN2_BENCH_ONLY")
    shapes = [s for i, s in enumerate(SHAPES) if not only or str(i) in only.split(",")]
    extra = {} if fi is not None else {"flashinfer": why}
    rows, path = [], None
    for shape in shapes:
        row = run_shape(shape, fi, timer, stock_timer)
        torch.cuda.empty_cache()  # (its tensors are freed: the next shape may need up to 12 GB)
        rows.append(row)
        print(row, flush=True)
        # After every shape: a later shape that fails leaves the earlier rows.
        path = harness.write_results("attn2", rows, extra)
    cols = ["shape", "seq_len", "us_per_call", "us_no_pdl", "floor_us", "bar_us", "stock_us", "flashinfer_us",
            "flashinfer_backend", "speedup_vs_flashinfer", "pct_of_copy_bw", "meets_bar"]
    print("\n" + " ".join(f"{c:>12}" for c in cols))
    for r in rows:
        print(" ".join(f"{str(r.get(c, '')):>12}" for c in cols))
    print("wrote", path or "nothing (no shape selected)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
