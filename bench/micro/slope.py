"""How much of a benchmark's per-call number is the graph replay's own cost (attn2, TP8).

bench/harness.py divides a replay's time by its calls, so each call carries
1/N of what the replay costs beyond N steady-state calls (the launch of the
graph, a first call with no PDL predecessor to overlap). The slope between
replays of N and 2N calls leaves that out:

    slope = (2N * t(2N) - N * t(N)) / N          (t: us per call from graph_us)

Each call has its own copy of the pages (2N copies), the L2 scrubbed before
each replay as the harness's SCRUB_MODE says (a read unless
MUSE_BENCH_SCRUB=write; the last line names it). Rounds interleave N and 2N.

  PYTHONPATH=<build>/python python3 bench/micro/slope.py [--rounds 3]

Needs a GPU and the extension built into <build> (-DMUSE_DECODE_PYTHON=ON).
One line per shape: us per call with N and with 2N calls, the slope, and what
one replay costs beyond N slope calls (N x (t(N) - slope)), each as min-max
over the rounds.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from l2_scrub import make_calls  # noqa: E402

# (name, max_model_len, window, L, N as bench_attn2.py's calls per graph)
SHAPES = [("2k", 131072, 0, 2048, 60), ("8k", 131072, 0, 8192, 60), ("32k", 131072, 0, 32768, 30),
          ("128k", 131072, 0, 131072, 30), ("window", 131072, 2048, 131072, 60), ("mml2048", 2048, 0, 2048, 60)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    timer = harness.Timer()
    print(f"{'shape':8} {'N':>3} {'us/call, N':>14} {'us/call, 2N':>14} {'slope':>14} {'replay start us':>16}")
    for name, mml, sliding, L, n in SHAPES:
        keep, fns = make_calls(mml, sliding, L, 2 * n)
        t1, t2, sl = [], [], []
        for _ in range(args.rounds):
            a = timer.graph_us(fns[:n])
            b = timer.graph_us(fns)
            t1.append(a)
            t2.append(b)
            sl.append((2 * n * b - n * a) / n)
        start = [n * (a - s) for a, s in zip(t1, sl)]  # what one replay costs beyond N slope calls
        span = lambda v: f"{min(v):6.2f}-{max(v):6.2f}"  # noqa: E731
        print(f"{name:8} {n:3d} {span(t1):>14} {span(t2):>14} {span(sl):>14} {span(start):>16}", flush=True)
        del keep, fns
        torch.cuda.empty_cache()
    print("TP8 PDL, min-max over rounds (each the median of", timer.replays, "replays); scrub:", harness.SCRUB_MODE)


if __name__ == "__main__":
    main()
