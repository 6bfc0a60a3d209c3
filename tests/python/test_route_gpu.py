"""GPU tests of route through the Python package, against the contract's formula
computed independently in PyTorch on the same GPU (torch.sigmoid, a stable
descending sort, a left-to-right fp32 sum): ids and weights bit-identical on
100,000+ random rows, exact ties and NaN; the metadata equal to a PyTorch
construction of the same fields; graph capture and replay. (Its host time per
call is tested in test_host_overhead_gpu.py, in a process of its own.)"""

import pytest

torch = pytest.importorskip("torch")
import muse_decode as md  # noqa: E402
from muse_decode import layer as L  # noqa: E402
from muse_decode import stock  # noqa: E402

pytestmark = pytest.mark.gpu


def formula(logits, bias, scale=1.0):
    """The contract's routing (docs/contract.md), step by step, in PyTorch."""
    s = torch.sigmoid(logits)
    key = s + bias
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices[:, :8]
    top = s.gather(1, order)
    total = top[:, 0].clone()
    for k in range(1, 8):
        total = total + top[:, k]
    weights = (top * scale) / (total + 1e-15)[:, None]
    return order.to(torch.int32), weights


def run_rows(routing, x, meta=None):
    """Route rows of x in chunks of up to 8 tokens, as separate calls."""
    n = x.shape[0]
    ids = torch.empty(n, 8, dtype=torch.int32, device="cuda")
    w = torch.empty(n, 8, dtype=torch.float32, device="cuda")
    for i in range(0, n, 8):
        routing(x[i : i + 8], ids[i : i + 8], w[i : i + 8], meta)
    return ids, w


def assert_same_bits(a, b):
    assert a.dtype == b.dtype
    av = a.view(torch.int32) if a.dtype == torch.float32 else a
    bv = b.view(torch.int32) if b.dtype == torch.float32 else b
    mismatch = (av != bv).nonzero()
    assert mismatch.numel() == 0, f"{mismatch.shape[0]} mismatches, first at {mismatch[0].tolist()}"


@pytest.fixture(scope="module")
def routing():
    torch.manual_seed(0)
    bias = (torch.randn(256, device="cuda") * 0.02).contiguous()
    return md.MuseRouting(L.router(bias))


def test_bit_exact_on_random_rows(routing):
    g = torch.Generator(device="cuda").manual_seed(1)
    rows = 0
    for sigma in (0.5, 2.0, 8.0):
        x = torch.randn(40000, 256, device="cuda", generator=g) * sigma
        ids, w = run_rows(routing, x)
        ref_ids, ref_w = formula(x, routing.bias)
        assert_same_bits(ids, ref_ids)
        assert_same_bits(w, ref_w)
        rows += x.shape[0]
    assert rows >= 100000


def test_bit_exact_on_ties_and_nan(routing):
    g = torch.Generator(device="cuda").manual_seed(2)
    n = 4096
    # Logits from a handful of values: many exact ties in every row.
    levels = torch.tensor([-3.0, -0.5, 0.0, 0.25, 1.5, 4.0], device="cuda")
    x = levels[torch.randint(0, 6, (n, 256), device="cuda", generator=g)]
    x[::7] = 0.75  # whole rows equal
    nan_rows = torch.arange(3, n, 5, device="cuda")
    cols = torch.randint(0, 256, (nan_rows.numel(), 3), device="cuda", generator=g)
    x[nan_rows[:, None], cols] = float("nan")
    x[1::11, 17] = float("inf")
    x[2::13, 200] = float("-inf")
    zero_bias = md.MuseRouting(L.router(torch.zeros(256, device="cuda")))
    for r in (routing, zero_bias):
        ids, w = run_rows(r, x)
        ref_ids, ref_w = formula(x, r.bias)
        assert_same_bits(ids, ref_ids)
        assert_same_bits(w, ref_w)
    assert torch.isnan(w[3]).all()


def torch_metadata(ids, off, n, tile, md_buffer):
    """The contract's metadata built with PyTorch ops (muse_decode.stock), into md_buffer's layout."""
    return stock.routing_metadata(ids, off, n, tile, md_buffer)


@pytest.mark.parametrize("tile", [8, 16, 32, 64, 128, 256])
def test_metadata_matches_torch_construction(routing, tile):
    g = torch.Generator(device="cuda").manual_seed(tile)
    size = md.metadata_size(tile)
    for off, n in [(0, 256), (0, 32), (96, 32), (224, 32), (5, 1)]:
        for b in range(1, 9):
            x = torch.randn(b, 256, device="cuda", generator=g)
            if off:  # push some routes onto the local range
                x[:, off : off + n] += 3.0
            buf = torch.full((size,), 0x7EADBEEF, dtype=torch.int32, device="cuda")
            ids = torch.empty(b, 8, dtype=torch.int32, device="cuda")
            w = torch.empty(b, 8, device="cuda")
            meta = md.RoutingMetadata(buf, off, n, tile)
            before = buf.clone()
            routing(x, ids, w, meta)
            expect = torch_metadata(ids, off, n, tile, before)
            assert torch.equal(buf, expect), (off, n, b)


def test_graph_replay_with_new_logits(routing):
    b, tile = 8, 16
    x = torch.randn(b, 256, device="cuda")
    ids = torch.empty(b, 8, dtype=torch.int32, device="cuda")
    w = torch.empty(b, 8, device="cuda")
    buf = torch.zeros(md.metadata_size(tile), dtype=torch.int32, device="cuda")
    meta = md.RoutingMetadata(buf, 96, 32, tile)
    routing(x, ids, w, meta)  # warm up outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        routing(x, ids, w, meta)
    for seed in range(5):
        x.copy_(torch.randn(b, 256, device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed)))
        before = buf.clone()
        graph.replay()
        torch.cuda.synchronize()
        ref_ids, ref_w = formula(x, routing.bias)
        assert_same_bits(ids, ref_ids)
        assert_same_bits(w, ref_w)
        assert torch.equal(buf, torch_metadata(ids, 96, 32, tile, before))


def test_deterministic(routing):
    x = torch.randn(8, 256, device="cuda")
    buf = torch.zeros(md.metadata_size(8), dtype=torch.int32, device="cuda")
    outs = []
    for _ in range(10):
        ids = torch.empty(8, 8, dtype=torch.int32, device="cuda")
        w = torch.empty(8, 8, device="cuda")
        routing(x, ids, w, md.RoutingMetadata(buf, 0, 256, 8))
        outs.append((ids, w.view(torch.int32), buf.clone()))
    for o in outs[1:]:
        for a, b in zip(o, outs[0]):
            assert torch.equal(a, b)


def test_bad_input_launches_nothing(routing):
    x = torch.randn(8, 256, device="cuda")
    ids = torch.full((8, 8), 7, dtype=torch.int32, device="cuda")
    w = torch.full((8, 8), 7.0, device="cuda")
    buf = torch.full((md.metadata_size(256),), 7, dtype=torch.int32, device="cuda")
    cases = [
        (x.double(), ids, w, None, "logits must be float32"),
        (torch.randn(9, 256, device="cuda"), ids, w, None, r"logits must be \[b, 256\]"),
        (x[:0], ids, w, None, r"logits must be \[b, 256\]"),
        (torch.randn(8, 257, device="cuda")[:, 1:], ids, w, None, "logits must be 16-byte aligned"),
        (x, ids, ids.view(torch.float32), None, "ids and weights must not overlap"),
        (x, ids, w, md.RoutingMetadata(buf, 0, 256, 12), "metadata.tile_n must be one of"),
        (x, ids, w, md.RoutingMetadata(buf, 224, 64, 8), "metadata.num_local_experts must be in"),
        (x, ids, w, md.RoutingMetadata(ids.view(-1), 0, 256, 8), "metadata.buffer must be at least"),
    ]
    for logits, i, ww, meta, msg in cases:
        with pytest.raises(ValueError, match=msg):
            routing(logits, i, ww, meta)
    torch.cuda.synchronize()
    assert (ids == 7).all() and (w == 7.0).all() and (buf == 7).all()
