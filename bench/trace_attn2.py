#!/usr/bin/env python3
"""Reads the per-CTA trace rings the attn2 C++ bench dumps under -DMUSE_ATTN2_TRACE
(variant token `trace`, TRACE_ROOT in attn2_device.sh) and prints where a call's
time goes: per phase, the earliest, median and latest CTA, in us from the end of
the call before (its last CTA's exit), median over the steady-state calls.

  python3 bench/trace_attn2.py TRACE.bin GRID_CTAS [CLUSTER]

With CLUSTER (the cluster size), also per cluster: when its last CTA had its
state in shared memory, its first and last CTA past the cluster barrier, and
its first and last CTA with the merged rows (same clock, medians over calls).

A call's CTAs all enter before the next call's first one (the next launch
starts once every CTA has passed griddepcontrol.launch_dependents or left),
so in entry order the calls are consecutive runs of GRID_CTAS records.
"""
import signal
import statistics
import struct
import sys

PHASES = [  # record index, name (see PROBE / TRACE in src/attn2/attn2.cu)
    (0, "entry"), (1, "init synced"), (2, "L arrived"), (30, "tiles assigned"), (31, "tile 0 ids"), (28, "early issued"), (3, "past wait"), (29, "all issued"), (4, "Q staged"), (5, "tile 0 ready"), (24, "tile 0: S done"), (25, "tile 0: softmax"), (22, "tile 1 ready"), (23, "last tile ready"),
    (26, "last P V done"), (27, "both halves done"),
    (6, "key loop done"), (19, "state in smem"), (7, "cluster synced"), (15, "cluster merged"),
    (16, "partial stored"), (17, "ticket/tag"), (21, "merger 1st poll/tags"), (18, "merger loaded"), (9, "out stored"), (11, "exit"),
]


def main():
    path, grid = sys.argv[1], int(sys.argv[2])
    data = open(path, "rb").read()
    recs = [struct.unpack_from("<32Q", data, k * 256) for k in range(len(data) // 256)]
    recs.sort(key=lambda r: r[14])
    # The ring may start mid-call: align on the sequence numbers.
    start = (grid - recs[0][14] % grid) % grid
    calls = [recs[start + c * grid:start + (c + 1) * grid] for c in range((len(recs) - start) // grid)]
    calls = [c for c in calls if len(c) == grid]
    if len(calls) < 4:
        sys.exit(f"{path}: only {len(calls)} whole calls")
    per_phase = {i: ([], [], []) for i, _ in PHASES}
    periods = []
    for prev, cur in zip(calls[1:-1], calls[2:]):
        e_prev = max(r[11] for r in prev)
        periods.append((max(r[11] for r in cur) - e_prev) / 1e3)
        for i, _ in PHASES:
            ts = sorted((r[i] - e_prev) / 1e3 for r in cur if r[i] != 0)
            if ts:
                per_phase[i][0].append(ts[0])
                per_phase[i][1].append(ts[len(ts) // 2])
                per_phase[i][2].append(ts[-1])
    med = statistics.median
    polls = [r[20] for c in calls[2:] for r in c if r[20]]
    if polls:
        print(f"# merger polls (thread 0's warp): mean {statistics.mean(polls):.2f}, max {max(polls)}, "
              f"histogram {dict(sorted((k, polls.count(k)) for k in set(polls)))}")
    print(f"# {path}: {len(calls)} calls of {grid} CTAs; period (last exit to last exit) "
          f"median {med(periods):.2f} us, min {min(periods):.2f}, max {max(periods):.2f}")
    print(f"# {'phase':16s} {'first':>7s} {'median':>7s} {'last':>7s}   (us after the previous call's last exit)")
    for i, name in PHASES:
        a, b, c = per_phase[i]
        if a:
            print(f"  {name:16s} {med(a):7.2f} {med(b):7.2f} {med(c):7.2f}   ({len(a)} calls)")
    # The polling merger (word 8: slice, head, rank; at its first poll, the
    # slots it found unwritten): how long after its own "partial stored" stamp
    # (its polls start there) its first poll returned, which slices it still
    # missed and when those had stamped theirs.
    def slot_of(r):  # (slice, KV head, rank) from word 8
        w = (r[8] >> 8) & 0xFFFFFF
        return w & 0xFF, (w >> 8) & 0xFF, w >> 16

    first_rt, load_after, missing_n, late_store = [], [], [], []
    for cur in calls[2:]:
        who = {slot_of(r): r for r in cur if r[16] and r[8] >> 32}
        for r in cur:
            if not (r[20] and r[21] and r[16] and r[8] >> 32):
                continue
            _, kvh, rank = slot_of(r)
            mask = r[8] & 0xFF
            first_rt.append((r[21] - r[16]) / 1e3)
            if r[18]:
                load_after.append((r[18] - r[21]) / 1e3)
            missing_n.append(bin(mask).count("1"))
            for z in range(8):
                o = who.get((z, kvh, rank))
                if mask >> z & 1 and o is not None:
                    late_store.append((o[16] - r[16]) / 1e3)
    if first_rt:
        print(f"# merger: first poll back {med(first_rt):.2f} us after its own rows were merged (median); "
              f"slots unwritten then {dict(sorted((k, missing_n.count(k)) for k in set(missing_n)))}; "
              f"loaded {med(load_after or [0]):.2f} us after the first poll")
        if late_store:
            print(f"#   the missing slices stamped their partial {med(late_store):.2f} us after the merger's "
                  f"(median; min {min(late_store):.2f}, max {max(late_store):.2f}, {len(late_store)} slots)")
    # Where the working CTAs (those that had a tile) sit, per call: SM -> their
    # CTA indices. SMs holding two of them share their MUFU, tensor cores and
    # copy bandwidth.
    working_by_sm = []
    for cur in calls[2:]:
        by_sm = {}
        for r in cur:
            if r[5]:
                by_sm.setdefault(r[10], []).append(r[12])
        working_by_sm.append(by_sm)
    occ = [(sum(len(v) for v in by_sm.values()), len(by_sm), sum(1 for v in by_sm.values() if len(v) > 1))
           for by_sm in working_by_sm]
    if occ:
        print(f"# working CTAs per call: median {med(o[0] for o in occ)}, on {med(o[1] for o in occ)} SMs, "
              f"{med(o[2] for o in occ)} SMs with two (max {max(o[2] for o in occ)})")
    if len(sys.argv) > 3:
        cl = int(sys.argv[3])
        pairs = {}
        for by_sm in working_by_sm:
            for v in by_sm.values():
                if len(v) > 1:
                    key = tuple(sorted(c // cl for c in v))
                    pairs[key] = pairs.get(key, 0) + 1
        if pairs:
            top = sorted(pairs.items(), key=lambda kv: -kv[1])[:8]
            print(f"# working clusters sharing an SM (pair: SM-calls): {dict(top)}")
        rows = {}
        for prev, cur in zip(calls[1:-1], calls[2:]):
            e_prev = max(r[11] for r in prev)
            by = {}
            for r in cur:
                by.setdefault(r[12] // cl, []).append(r)
            for k, rs in by.items():
                t = lambda i, f: f((x[i] - e_prev) / 1e3 for x in rs) if all(x[i] for x in rs) else float("nan")
                rows.setdefault(k, []).append((t(6, max), t(19, max), t(7, min), t(7, max), t(15, min), t(15, max)))
        print(f"# per cluster: {'loop done last':>14s} {'state last':>10s} {'synced first':>12s} {'last':>6s} "
              f"{'merged first':>12s} {'last':>6s}")
        for k in sorted(rows):
            cols = [med(v[j] for v in rows[k]) for j in range(6)]
            print(f"  cluster {k:3d}  " + " ".join(f"{x:10.2f}" for x in cols))
        # The CTA whose key loop ends last in each call: which cluster and SM,
        # and its phases against the median CTA of the same call.
        late, n_late = [], []
        for prev, cur in zip(calls[1:-1], calls[2:]):
            rs = [r for r in cur if r[6]]
            if len(rs) < 2:
                continue
            e_prev = max(r[11] for r in prev)
            x = max(rs, key=lambda r: r[6])
            mid = lambda i: statistics.median([r[i] for r in rs if r[i]] or [0])
            mate = [r for r in cur if r[10] == x[10] and r is not x]  # the other CTA on its SM
            mate_late = (mate[0][6] - mid(6)) / 1e3 if mate and mate[0][6] else float("nan")
            n_late.append(sum(1 for r in rs if r[6] - mid(6) > 1000))
            late.append((x[12] // cl, x[10], *[((x[i] - e_prev) / 1e3, (x[i] - mid(i)) / 1e3) if x[i] else (0.0, 0.0)
                                               for i in (0, 3, 5, 22, 23, 26, 27, 6)], mate_late,
                         mate[0][12] // cl if mate else -1))
        if late:
            hist = lambda j: dict(sorted(((k, [v[j] for v in late].count(k)) for k in set(v[j] for v in late)),
                                         key=lambda kv: -kv[1])[:8])
            print(f"# the last loop of each call ({len(late)} calls): clusters {hist(0)}; SMs {hist(1)}")
            names = ("entry", "past wait", "tile 0 ready", "tile 1 ready", "last tile ready", "wg0 last P V",
                     "both halves", "loop done")
            print("#   phase          at (median)  minus the call's median CTA (median, max)")
            for j, n in enumerate(names):
                print(f"    {n:14s} {med(v[2 + j][0] for v in late):9.2f}   {med(v[2 + j][1] for v in late):6.2f} "
                      f"{max(v[2 + j][1] for v in late):6.2f}")
            print(f"#   CTAs whose loop ends > 1 us after the median CTA's, per call: median {med(n_late)}, "
                  f"max {max(n_late)}")
            mates = [v[10] for v in late if v[10] == v[10]]  # (NaN: no other CTA on that SM)
            if mates:
                print(f"#   the other CTA on its SM: loop done minus the median CTA: median {med(mates):.2f}, "
                      f"same cluster in {sum(v[11] == v[0] for v in late)} of {len(late)} calls")


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet under `| head`
    main()
