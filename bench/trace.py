#!/usr/bin/env python3
"""Where a traced kernel's time goes, from the ring its benchmark dumps.

A build configured with -DMUSE_DECODE_TRACE=ON has every instrumented kernel
record, per CTA and launch, the %globaltimer stamp of each named phase it
reached (src/common/trace.cuh); the muse-decode tool dumps attn2's ring after
timing it when MUSE_DECODE_TRACE_DIR is set. This prints, per phase, the first, median
and last CTA of a call, in us after the previous call's last CTA left, as the
median over the steady-state calls:

  python3 bench/trace.py attn2 TRACE.bin GRID_CTAS

GRID_CTAS is the launch's CTA count (slices x cluster x KV heads x requests).
A call's CTAs all enter before the next call's first one (the next launch
starts once every CTA has passed griddepcontrol.launch_dependents or left),
so in entry order the calls are consecutive runs of GRID_CTAS records.
"""
import signal
import statistics
import struct
import sys

RECORD_WORDS, STAMP_WORDS, SM, CTA, SEQ, TAG = 32, 24, 24, 25, 26, 27

# Phase names in the order of each kernel's Phase enum.
PHASES = {
    "attn2": [  # src/attn2/config.cuh
        "enter", "init synced", "L arrived", "scheduled", "first tile ids", "early copies issued", "past the wait",
        "all issued", "Q staged", "first tile landed", "first scores", "first softmax", "second tile landed",
        "last tile landed", "key loop done", "halves merged", "rows encoded", "cluster synced", "cluster merged",
        "partial stored", "ticket", "split merged", "exit",
    ],
}


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    if len(sys.argv) != 4 or sys.argv[1] not in PHASES:
        sys.exit(__doc__)
    names, path, grid = PHASES[sys.argv[1]], sys.argv[2], int(sys.argv[3])
    exit_word = len(names) - 1
    data = open(path, "rb").read()
    size = RECORD_WORDS * 8
    recs = sorted((struct.unpack_from(f"<{RECORD_WORDS}Q", data, k * size) for k in range(len(data) // size)),
                  key=lambda r: r[SEQ])
    if not recs:
        sys.exit(f"{path}: no records")
    start = (grid - recs[0][SEQ] % grid) % grid  # the ring may start mid-call
    calls = [recs[start + c * grid:start + (c + 1) * grid] for c in range((len(recs) - start) // grid)]
    calls = [c for c in calls if len(c) == grid]
    if len(calls) < 4:
        sys.exit(f"{path}: only {len(calls)} whole calls of {grid} CTAs")
    firsts, medians, lasts = ({i: [] for i in range(len(names))} for _ in range(3))
    periods = []
    for prev, cur in zip(calls[1:-1], calls[2:]):
        t0 = max(r[exit_word] for r in prev)
        periods.append((max(r[exit_word] for r in cur) - t0) / 1e3)
        for i in range(len(names)):
            ts = sorted((r[i] - t0) / 1e3 for r in cur if r[i] != 0)
            if ts:
                firsts[i].append(ts[0])
                medians[i].append(ts[len(ts) // 2])
                lasts[i].append(ts[-1])
    med = statistics.median
    print(f"# {path}: {len(calls)} calls of {grid} CTAs; period (last exit to last exit) median {med(periods):.2f} us,"
          f" min {min(periods):.2f}, max {max(periods):.2f}")
    print(f"# {'phase':22s} {'first':>7s} {'median':>7s} {'last':>7s}   (us after the previous call's last exit)")
    for i, name in enumerate(names):
        if firsts[i]:
            print(f"  {name:22s} {med(firsts[i]):7.2f} {med(medians[i]):7.2f} {med(lasts[i]):7.2f}")


if __name__ == "__main__":
    main()
