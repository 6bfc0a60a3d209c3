"""qkv_front benchmark through the Python package, with the anchors of the
issue in the same run: cuBLAS alone (torch.matmul of x and the weight) and
the stock chain (GEMM, per-head q/k RMS norm, interleaved RoPE, KV-cache
insert in PyTorch). The weight is rotated over enough copies (layers) that
the L2 cannot hold them, and the L2 is flushed before each replay.

Bars: TP8 (N = 2304, 37.7 MB) <= 1.15 x the weight-read floor;
TP1 (N = 18432, 302 MB) <= 1.1 x."""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

import muse_decode as md  # noqa: E402
from muse_decode import stock  # noqa: E402

PAGES = 4096
MAX_POS = 8192


def main():
    torch.manual_seed(0)
    timer = harness.Timer()
    md.prepare_qkv_front()
    rows = []
    for tp, kvh, copies in ((8, 2, 8), (1, 16, 2)):
        n = md.HEADS_PER_KV_HEAD * kvh * 64 * 2 + 2 * kvh * 64
        weights = [torch.randn(n, 8192, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        calls = 8 * copies if tp == 8 else 4 * copies  # each weight copy used once per replay... then again
        cos_sin = torch.randn(MAX_POS, 64, device="cuda")
        cache = torch.zeros(PAGES, kvh, 16, 128, device="cuda", dtype=torch.bfloat16)
        ws = torch.zeros(md.qkv_front_workspace_bytes_for_device(kvh), dtype=torch.uint8, device="cuda")
        wbytes = n * 8192 * 2
        for t in (1, 2, 4, 8, 16):
            x = torch.randn(t, 8192, device="cuda", dtype=torch.bfloat16)
            pos = torch.randint(0, MAX_POS, (t,), device="cuda")
            slots = torch.randperm(PAGES * 16, device="cuda")[:t]
            out = torch.empty(t, n, device="cuda", dtype=torch.bfloat16)
            seq = [weights[i % copies] for i in range(calls)]
            ours = timer.graph_us([(lambda w=w: md.qkv_front(x, w, pos, cos_sin, slots, cache, kvh, out, ws))
                                   for w in seq])
            gemm = timer.graph_us([(lambda w=w: torch.matmul(x, w.t())) for w in seq])
            chain = timer.graph_us([(lambda w=w: stock.qkv_front(x, w, pos, cos_sin, slots, cache, kvh)) for w in seq])
            floor = harness.floor_us(wbytes)
            bar = (1.15 if tp == 8 else 1.1) * floor
            rows.append(dict(op="qkv_front", tp=tp, kv_heads=kvh, n=n, tokens=t, us_per_call=round(ours, 2),
                             floor_us=round(floor, 2), bar_us=round(bar, 2), x_floor=round(ours / floor, 3),
                             tb_per_s=round(wbytes / ours / 1e6, 2), pct_copy_bw=round(100 * floor / ours, 1),
                             cublas_matmul_us=round(gemm, 2), stock_chain_us=round(chain, 2),
                             speedup_vs_chain=round(chain / ours, 2)))
            print(f"qkv_front TP{tp} T={t}: {ours:.2f} us (floor {floor:.2f}, bar {bar:.2f}); "
                  f"cuBLAS {gemm:.2f} us, stock chain {chain:.2f} us", flush=True)
        del weights
        torch.cuda.empty_cache()
    print("wrote", harness.write_results("qkv_front", rows))


if __name__ == "__main__":
    main()
