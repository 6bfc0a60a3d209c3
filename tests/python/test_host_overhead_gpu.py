"""Host time of one eager call of each op through the package (SPEC section
7: at most 5 us per op), and of the torch.library path for comparison
(bench/harness.host_us: loops of 64 calls, short enough that the launch queue
never fills, best of 50). The bar is asserted for the eager path meant for a
layer: MuseRouting, and the QkvFront / Attn2 objects bound to its
static tensors (the SPEC's "validate once when bound"); the unbound
functions' times are printed beside them. Each is measured beside the host
time of torch's own empty-kernel launch (harness.host_bar_us: 5 us, or the
launch + 1.2 us on a machine where the launch alone takes more than 3.8 us).
These tests run in a process of their own (scripts/gpu_check.sh), not after
the other GPU tests."""

import os
import sys

import pytest

torch = pytest.importorskip("torch")
import muse_decode as md  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from harness import empty_launch_us, host_bar_us, host_us  # noqa: E402

pytestmark = pytest.mark.gpu


def test_route_host_overhead():
    from muse_decode import layer

    b = 8
    routing = md.MuseRouting(layer.router((torch.randn(256, device="cuda") * 0.02).contiguous()))
    x = torch.randn(b, 256, device="cuda")
    ids = torch.empty(b, 8, dtype=torch.int32, device="cuda")
    w = torch.empty(b, 8, device="cuda")
    meta = md.RoutingMetadata(torch.zeros(md.metadata_size(128), dtype=torch.int32, device="cuda"), 0, 32, 128)
    empty = empty_launch_us()
    best = host_us(lambda: routing(x, ids, w, meta))
    unbound = host_us(lambda: md.route(x, routing.bias, routing.route_scale, ids, w, meta))
    checks = host_us(lambda: md.unsupported_route_call(x, routing.bias, routing.route_scale, ids, w, meta))
    print(f"\nroute host us per call: bound {best:.2f}, route() {unbound:.2f} (b = 8, metadata); reads + checks "
          f"without the launch {checks:.2f}; torch's empty kernel {empty:.2f}, bar {host_bar_us(empty):.2f}")
    assert best <= host_bar_us(empty)


@pytest.fixture(scope="module")
def front_inputs():
    kvh, t = 2, 8
    x = torch.randn(t, 8192, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2304, 8192, device="cuda", dtype=torch.bfloat16) * 0.02
    pos = torch.arange(t, device="cuda")
    slots = torch.arange(t, device="cuda")
    cache = torch.zeros(64, kvh, 16, 128, device="cuda", dtype=torch.bfloat16)
    cos_sin = torch.randn(4096, 64, device="cuda")
    out = torch.empty(t, 2304, device="cuda", dtype=torch.bfloat16)
    ws = torch.zeros(md.qkv_front_workspace_bytes_for_device(kvh), dtype=torch.uint8, device="cuda")
    md.prepare_qkv_front()
    return x, w, pos, cos_sin, slots, cache, kvh, out, ws


def test_qkv_front_host_overhead(front_inputs):
    x, w, pos, cs, slots, cache, kvh, out, ws = front_inputs
    direct = host_us(lambda: md.launch_qkv_front(x, w, pos, cs, slots, cache, kvh, out, ws))
    import muse_decode.torch_ops  # noqa: F401

    op = torch.ops.muse_decode.qkv_front
    library = host_us(lambda: op(x, w, pos, cs, slots, cache, kvh, out, ws), loops=5)
    # Where the direct call's time goes: reading the 8 tensors and the checks
    # (no launch), and the 8 data_ptr() calls a memoised read makes.
    checks = host_us(lambda: md.unsupported_qkv_front_call(x, w, pos, cs, slots, cache, kvh, out, ws))
    tensors = (x, w, pos, cs, slots, cache, out, ws)
    ptrs = host_us(lambda: [t.data_ptr() for t in tensors])
    # The same call on a side stream, and in loops of 300 (the GPU falls behind).
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        on_side = host_us(lambda: md.launch_qkv_front(x, w, pos, cs, slots, cache, kvh, out, ws))
    long_loops = host_us(lambda: md.launch_qkv_front(x, w, pos, cs, slots, cache, kvh, out, ws), n=300, loops=20)
    front = md.QkvFront(w, cs, cache, kvh, ws)
    empty = empty_launch_us()
    bound = host_us(lambda: front(x, pos, slots, out))
    print(f"\nqkv_front host us per call: bound {bound:.2f}, direct {direct:.2f}, torch.library {library:.2f}; "
          f"reads + checks without the launch {checks:.2f}, 8 data_ptr() {ptrs:.2f}; "
          f"on a side stream {on_side:.2f}, in loops of 300 {long_loops:.2f}; "
          f"torch's empty kernel {empty:.2f}, bar {host_bar_us(empty):.2f}")
    assert bound <= host_bar_us(empty)


def test_attn2_host_overhead():
    kvh, max_len = 2, 32768
    splits = md.attn2_splits(max_len, 0, kvh)
    q = torch.randn(8, 2304, device="cuda", dtype=torch.bfloat16)
    qv, gv = md.split_qkv(q, kvh)
    cache = torch.randn(2048, kvh, 16, 128, device="cuda", dtype=torch.bfloat16)
    table = torch.arange(2048, dtype=torch.int32, device="cuda")[None, :]
    lens = torch.tensor([max_len], dtype=torch.int32, device="cuda")
    out = torch.empty(8, 1024, device="cuda", dtype=torch.bfloat16)
    ws = torch.zeros(md.attn2_workspace_bytes(1, kvh, splits), dtype=torch.uint8, device="cuda")
    md.prepare_attn2()
    direct = host_us(lambda: md.attn2(qv, gv, cache, table, lens, out, ws, max_len, 0, splits))
    import muse_decode.torch_ops  # noqa: F401

    op = torch.ops.muse_decode.attn2
    library = host_us(lambda: op(qv, gv, cache, table, lens, out, ws, max_len, 0, splits), loops=5)
    # Where the time goes: the reads and checks without the launch, and the
    # same call at L = 2048 (a kernel shorter than the call's host time).
    checks = host_us(lambda: md.unsupported_attn2_call(qv, gv, cache, table, lens, out, ws, max_len, 0, splits))
    short_lens = torch.tensor([2048], dtype=torch.int32, device="cuda")
    short = host_us(lambda: md.attn2(qv, gv, cache, table, short_lens, out, ws, max_len, 0, splits))
    op2 = md.Attn2(cache, ws, max_len, 0, splits)
    empty = empty_launch_us()
    bound = host_us(lambda: op2(qv, gv, table, lens, out))
    print(f"\nattn2 host us per call: bound {bound:.2f}, direct {direct:.2f}, torch.library {library:.2f}; "
          f"reads + checks without the launch {checks:.2f}; at L = 2048 {short:.2f}; "
          f"torch's empty kernel {empty:.2f}, bar {host_bar_us(empty):.2f}")
    assert bound <= host_bar_us(empty)
