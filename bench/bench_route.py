"""route benchmark: our kernel (with metadata) against the stock PyTorch
composite, b = 1..8, in the same run. Our calls use the package's defaults
(programmatic dependent launch on); the column us_no_pdl is the same call
launched plainly. The bar: <= 3 us per call with
metadata for every b.

route moves almost no bytes (b KB of logits), so its floor is latency: the
byte floor is printed for completeness, and the time of an empty kernel
(torch.cuda._sleep(0)) measured in the same run is the practical floor.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

import muse_decode as md  # noqa: E402

from muse_decode import layer, stock  # noqa: E402

CALLS = 256  # calls per graph, each on its own input set
TILE, OFFSET, LOCAL = 128, 0, 32  # EP8 rank: 32 local experts


def stock_path(x, bias, off, n, tile, buf):
    """The unfused PyTorch path: routing, then the metadata from its ids."""
    ids, w = stock.route(x, bias)
    return ids, w, stock.routing_metadata(ids, off, n, tile, buf)


def main():
    torch.manual_seed(0)
    timer = harness.Timer()
    bias = torch.randn(256, device="cuda") * 0.02
    routing = md.MuseRouting(layer.router(bias))
    size = md.metadata_size(TILE)
    empty_us = timer.graph_us([lambda: torch.cuda._sleep(0)] * CALLS)
    rows = []
    for b in range(1, 9):
        xs = torch.randn(CALLS, b, 256, device="cuda")
        ids = torch.empty(CALLS, b, 8, dtype=torch.int32, device="cuda")
        ws = torch.empty(CALLS, b, 8, device="cuda")
        row = (size + 3) // 4 * 4  # every buffer 16-byte aligned
        bufs = torch.zeros(CALLS, row, dtype=torch.int32, device="cuda")[:, :size]
        metas = [md.RoutingMetadata(bufs[i], OFFSET, LOCAL, TILE) for i in range(CALLS)]
        calls = [(lambda i=i: routing(xs[i], ids[i], ws[i], metas[i])) for i in range(CALLS)]
        ours = timer.graph_us(calls)
        hot = timer.graph_us(calls, scrub=False)
        no_pdl = timer.graph_us([(lambda i=i: routing(xs[i], ids[i], ws[i], metas[i], pdl=False)) for i in range(CALLS)])
        no_meta = timer.graph_us([(lambda i=i: routing(xs[i], ids[i], ws[i])) for i in range(CALLS)])
        n_stock = 32
        theirs = timer.graph_us([(lambda i=i: stock_path(xs[i], bias, OFFSET, LOCAL, TILE, bufs[i])) for i in range(n_stock)])
        theirs_route = timer.graph_us([(lambda i=i: stock.route(xs[i], bias)) for i in range(n_stock)])
        x0, i0, w0, m0 = xs[0], ids[0], ws[0], metas[0]
        host = timer.host_us(lambda: routing(x0, i0, w0, m0))
        host_check = timer.host_us(lambda: md.unsupported_route_call(x0, bias, 1.0, i0, w0, m0))
        nbytes = b * 256 * 4 + 256 * 4 + b * 8 * 8 + 4 * (200 + 8 * b * TILE)
        rows.append(dict(op="route", b=b, tile_n=TILE, local_experts=LOCAL, us_per_call=round(ours, 3),
                         us_l2_hot=round(hot, 3), us_no_pdl=round(no_pdl, 3), us_no_metadata=round(no_meta, 3),
                         floor_us=round(harness.floor_us(nbytes), 4), empty_kernel_us=round(empty_us, 3),
                         bar_us=3.0, stock_torch_us=round(theirs, 2), stock_route_only_us=round(theirs_route, 2),
                         speedup_vs_stock=round(theirs / ours, 1), host_us_per_call=round(host, 2),
                         host_us_checks_only=round(host_check, 2)))
        print(f"route b={b}: {ours:.2f} us cold, {hot:.2f} hot, {no_pdl:.2f} without PDL, {no_meta:.2f} no metadata "
              f"(stock {theirs:.1f} us, stock routing only {theirs_route:.1f}, empty kernel {empty_us:.2f}); "
              f"host {host:.2f} us ({host_check:.2f} checks only)", flush=True)
    path = harness.write_results("route", rows)
    print("wrote", path)


if __name__ == "__main__":
    main()
