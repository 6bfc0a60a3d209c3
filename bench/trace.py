#!/usr/bin/env python3
"""Where a traced kernel's time goes, from the rings the muse-decode tool dumps.

A build configured with -DMUSE_DECODE_TRACE=ON has every instrumented kernel
(qkv_front, attn2, o_proj) record, per CTA and launch, the %globaltimer stamp
of each named phase it reached (src/common/trace.cuh). With
MUSE_DECODE_TRACE_DIR set, the tool dumps attn2's ring after timing attn2
alone, and all three rings after timing the block.

One kernel, per phase, the first, median and last CTA of a call, in us after
the previous call's last CTA left, as the median over the steady-state calls:

  python3 bench/trace.py attn2 TRACE.bin GRID_CTAS

GRID_CTAS is the launch's CTA count (slices x cluster x KV heads x requests).
A call's CTAs all enter before the next call's first one (the next launch
starts once every CTA has passed griddepcontrol.launch_dependents or left),
so in entry order the calls are consecutive runs of GRID_CTAS records.

The block (qkv_front, attn2 and o_proj chained), the same per phase of each
kernel, in us after the previous iteration's last o_proj CTA left:

  python3 bench/trace.py block FRONT.bin ATTN2.bin O_PROJ.bin

qkv_front's and o_proj's records carry their launch's CTA count; attn2's
CTAs of an iteration are those that entered between its qkv_front's first
CTA and the next iteration's.
"""
import signal
import statistics
import struct
import sys

RECORD_WORDS, STAMP_WORDS, SM, CTA, SEQ, TAG = 32, 24, 24, 25, 26, 27

# Phase names in the order of each kernel's Phase enum.
PHASES = {
    "qkv_front": ["enter", "init synced", "past the wait", "loop done", "exit"],  # src/qkv_front/config.cuh
    "o_proj": ["enter", "init synced", "weight held", "first x landed", "loop done", "exit"],  # src/o_proj/config.cuh
    "attention_block": [  # src/attention_block/config.cuh
        "enter", "front loop done", "front done", "heads ready", "Q staged", "keys done", "slice published", "slices ready", "merged", "x landed", "exit",
    ],
    "attn2": [  # src/attn2/config.cuh
        "enter", "init synced", "L arrived", "scheduled", "first tile ids", "early copies issued", "past the wait",
        "all issued", "Q staged", "first tile landed", "first scores", "first softmax", "second tile landed",
        "last tile landed", "key loop done", "halves merged", "rows encoded", "cluster synced", "cluster merged",
        "partial stored", "ticket", "split merged", "exit",
    ],
}


def read_ring(path):
    """The ring's records, oldest first (launch-order sequence number)."""
    data = open(path, "rb").read()
    size = RECORD_WORDS * 8
    return sorted((struct.unpack_from(f"<{RECORD_WORDS}Q", data, k * size) for k in range(len(data) // size)),
                  key=lambda r: r[SEQ])


def calls_by_tag(recs):
    """The latest calls of a kernel whose records carry their launch's CTA count, oldest first."""
    calls, end = [], len(recs)
    while end > 0:
        grid = recs[end - 1][TAG]
        if grid == 0 or end < grid or any(r[TAG] != grid for r in recs[end - grid:end]):
            break
        calls.append(recs[end - grid:end])
        end -= grid
    return calls[::-1]


def block(front_path, attn_path, oproj_path):
    """Per kernel and phase of the block: first, median and last CTA, us after the previous iteration's end."""
    fronts, oprojs = calls_by_tag(read_ring(front_path)), calls_by_tag(read_ring(oproj_path))
    attn_recs = read_ring(attn_path)
    f_exit, o_exit = len(PHASES["qkv_front"]) - 1, len(PHASES["o_proj"]) - 1
    # Pair each o_proj call with the qkv_front call before it (the last calls of both rings are the block's).
    n = min(len(fronts), len(oprojs))
    fronts, oprojs = fronts[-n:], oprojs[-n:]
    starts = [min(r[0] for r in c) for c in fronts]
    iters = []
    for j in range(1, n - 1):
        attn = [r for r in attn_recs if starts[j] <= r[0] < starts[j + 1]]
        t0 = max(r[o_exit] for r in oprojs[j - 1])
        end = max(r[o_exit] for r in oprojs[j])
        if not attn:
            continue
        iters.append((t0, end, {"qkv_front": fronts[j], "attn2": attn, "o_proj": oprojs[j]}))
    if len(iters) < 4:
        sys.exit(f"only {len(iters)} whole iterations in the rings")
    periods = [(e - t0) / 1e3 for t0, e, _ in iters]
    med = statistics.median
    typical = med(periods)
    iters = [it for it, p in zip(iters, periods) if p < 2 * typical]  # replay boundaries (the L2 flush) out
    print(f"# the block: {len(iters)} iterations; period (o_proj's last exit to the next) median {typical:.2f} us, "
          f"min {min(periods):.2f}")
    counts = {op: int(med(len(it[2][op]) for it in iters)) for op in ("qkv_front", "attn2", "o_proj")}
    iters = [it for it in iters if len(it[2]["attn2"]) == counts["attn2"]]  # iterations the attn2 ring covers whole
    print(f"# CTAs per call: qkv_front {counts['qkv_front']}, attn2 {counts['attn2']}, o_proj {counts['o_proj']}; "
          f"{len(iters)} iterations with every attn2 CTA in the ring")
    print(f"# {'kernel':9s} {'phase':22s} {'first':>7s} {'median':>7s} {'last':>7s}   (us after the previous "
          "iteration's last o_proj exit)")
    for op in ("qkv_front", "attn2", "o_proj"):
        for i, name in enumerate(PHASES[op]):
            firsts, medians, lasts = [], [], []
            for t0, _, calls in iters:
                ts = sorted((r[i] - t0) / 1e3 for r in calls[op] if r[i] != 0)
                if ts:
                    firsts.append(ts[0])
                    medians.append(ts[len(ts) // 2])
                    lasts.append(ts[-1])
            if firsts:
                print(f"  {op:9s} {name:22s} {med(firsts):7.2f} {med(medians):7.2f} {med(lasts):7.2f}")


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    if len(sys.argv) == 5 and sys.argv[1] == "block":
        return block(*sys.argv[2:])
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
