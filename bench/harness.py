"""Timing harness of the Python benchmarks.

Every number is the GPU time of one call, from CUDA-graph replays of many
calls per graph (one replay costs ~5 us of its own, amortised over the calls),
the median of at least 5 replays. Before each timed replay the L2 (60 MB) is
emptied by reading a 256 MB buffer, so that no call finds its inputs there, as
a layer's first touch would not; the benchmarks also rotate their inputs over
copies past the L2. The scrub reads rather than writes: a model step runs each
op behind others that stream weights through the L2 (clean lines), while a
written scrub leaves ~60 MB of dirty lines whose write-backs share the DRAM
with the replay's first calls (at attn2's 128k, 0.3-0.45 us per call of a
30-call graph; bench/micro/l2_scrub.py measures it).
MUSE_BENCH_SCRUB=write scrubs by writing instead, to see that effect.
"""

from __future__ import annotations

import json
import os
import statistics
import time

import torch

COPY_BW = 4.2e12  # bytes/s, measured device-to-device copy on the H200
SCRUB_BYTES = 256 << 20
SCRUB_MODE = os.environ.get("MUSE_BENCH_SCRUB", "read")  # "read" or "write": how graph_us(scrub=True) scrubs
if SCRUB_MODE not in ("read", "write"):
    raise ValueError(f"MUSE_BENCH_SCRUB: expected 'read' or 'write', got {SCRUB_MODE!r}")


class Timer:
    def __init__(self, replays: int = 7):
        self.replays = replays
        self.scrub = torch.zeros(SCRUB_BYTES // 4, dtype=torch.float32, device="cuda")
        self.stream = torch.cuda.Stream()

    def graph_us(self, calls, warmup: bool = True, scrub: bool | str = True) -> float:
        """GPU microseconds per call of `calls` (a list of no-argument
        callables, each a different input set), captured in one graph; with
        scrub, the L2 is emptied before each replay: "read" by reading the
        scrub buffer (a sum: the L2 is left holding clean lines), "write" by
        writing it, True as SCRUB_MODE says, False or "none" not at all."""
        mode = {True: SCRUB_MODE, False: "none"}.get(scrub, scrub)
        if mode not in ("write", "read", "none"):
            raise ValueError(f"scrub: expected True, False, 'write', 'read' or 'none', got {scrub!r}")
        # The inputs were made on the caller's stream, and self.stream (from
        # PyTorch's pool) does not wait for it: without this, the warm-up and
        # the capture's first replay could run before the inputs exist.
        torch.cuda.synchronize()
        if warmup:
            with torch.cuda.stream(self.stream):
                for c in calls:
                    c()
            torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=self.stream):
            for c in calls:
                c()
        graph.replay()
        torch.cuda.synchronize()
        times = []
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(self.replays):
            if mode == "write":
                self.scrub.fill_(1.0)
            elif mode == "read":
                self.scrub.sum()
            start.record()
            graph.replay()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / len(calls))
        del graph
        return statistics.median(times)

    def host_us(self, call, n: int = 64) -> float:
        return host_us(call, n)


def host_us(call, n: int = 64, loops: int = 50) -> float:
    """Host microseconds per eager call: wall time of a loop of n calls, best
    of `loops` loops, the GPU drained between loops. The loop is short so the
    launch queue never fills: a call whose kernel takes longer on the GPU than
    its launch on the host (qkv_front at TP8: ~10 us against ~4) would
    otherwise make the host wait for queue space, and the loop would time the
    GPU instead of the host."""
    for _ in range(200):
        call()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(loops):
        t0 = time.perf_counter()
        for _ in range(n):
            call()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    return best


# The bar: at most 5 us of host time per op call. Most of a call is the
# CUDA launch itself, whose host cost moves by more than 1 us from one H200
# host to another and within minutes on one (torch's own empty kernel: 3.8
# and 4.9 us on the same host). Where that launch alone takes more than
# 3.8 us, an op may take at most 1.2 us more than it.
HOST_BAR_US, HOST_EMPTY_REF_US = 5.0, 3.8


def host_bar_us(empty_launch_us: float) -> float:
    """The host-time bar of one op call, given the host time of launching an
    empty kernel through torch (torch.cuda._sleep(0), host_us) in the same
    process just before."""
    return max(HOST_BAR_US, empty_launch_us + (HOST_BAR_US - HOST_EMPTY_REF_US))


def empty_launch_us() -> float:
    """Host microseconds of launching torch's empty kernel (the machine's
    launch cost, for host_bar_us)."""
    return host_us(lambda: torch.cuda._sleep(0))


def floor_us(nbytes: int) -> float:
    return nbytes / COPY_BW * 1e6


def write_results(name: str, rows: list[dict], extra: dict | None = None) -> str:
    """bench/results/<name>.json: the run's device, date and method, `extra`
    (what else the reader must know, e.g. why an anchor is missing), the rows."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "results", f"{name}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    doc = {
        "benchmark": name,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "method": f"CUDA-graph replay, many calls per graph, L2 scrubbed by {SCRUB_MODE} of 256 MB before each replay, median of replays",
        **(extra or {}),
        "rows": rows,
    }
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    return path
