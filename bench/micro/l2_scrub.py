"""What bench/harness.py's L2 scrub (write, read or none) costs the attn2 calls it times (TP8).

The harness empties the L2 before each timed replay. A scrub that writes (a
256 MB fill) leaves ~60 MB of dirty lines whose write-backs share the DRAM
with the replay's first calls; one that reads (a sum of the same buffer, the
harness's default) leaves clean lines. This times attn2's TP8 shapes through
the harness with each scrub, and with none, in interleaved rounds: with the
bench's calls per graph, and with a single call per graph (where a scrub that
does not evict would show: the call would find its pages in the L2).

  PYTHONPATH=<build>/python python3 bench/micro/l2_scrub.py [--rounds 3]

Needs a GPU and the extension built into <build> (-DMUSE_DECODE_PYTHON=ON).
One line per shape and calls per graph: us per call under each scrub (write,
read, none), min-max over the rounds, each the median of the harness's
replays.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import harness  # noqa: E402
import muse_decode as md  # noqa: E402
from bench_attn2 import make_inputs  # noqa: E402

# (name, max_model_len, window, L, calls per graph as bench_attn2.py)
SHAPES = [("2k", 131072, 0, 2048, 60), ("mml2048", 2048, 0, 2048, 60), ("128k", 131072, 0, 131072, 30)]


def make_calls(mml, sliding, L, calls, kvh=2):
    """bench_attn2.py's inputs of one request (make_inputs) and its attn2 calls, one per copy."""
    window = md.attn2_window(sliding or None, mml)
    splits = md.attn2_splits(mml, window, kvh)
    x = make_inputs(kvh, 1, mml, L, splits, calls)
    return x, [lambda c=c: md.attn2(x.q, x.gate, x.copies[c], x.table, x.lens, x.outs[c], x.ws, mml, window, splits)
               for c in range(calls)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    timer = harness.Timer()
    modes = ("write", "read", "none")
    print(f"{'shape':8} {'calls':>5} " + " ".join(f"{m:>17}" for m in modes))
    for name, mml, sliding, L, calls in SHAPES:
        keep, fns = make_calls(mml, sliding, L, calls)
        for n in (calls, 1):
            got = {m: [] for m in modes}
            for _ in range(args.rounds):
                for m in modes:
                    got[m].append(timer.graph_us(fns[:n], scrub=m))
            cells = [f"{min(v):7.2f}-{max(v):7.2f}".rjust(17) for v in got.values()]
            print(f"{name:8} {n:5d} " + " ".join(cells), flush=True)
        del keep, fns
        torch.cuda.empty_cache()
    print("us per call, TP8 PDL, min-max over rounds (each the median of", timer.replays, "replays)")


if __name__ == "__main__":
    main()
