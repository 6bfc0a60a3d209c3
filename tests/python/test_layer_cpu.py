"""CPU tests of the layer, its planner, the stock path and the torch.library
registration (they need PyTorch, not a GPU; skipped without PyTorch)."""

import pytest

torch = pytest.importorskip("torch")
import muse_decode as md  # noqa: E402
from muse_decode import layer as L  # noqa: E402
from muse_decode import stock  # noqa: E402


def brute_attention(q, gate, cache, table, lens, kvh, window):
    """Per request, per row, per head, in float64: the contract's formula."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    for r, length in enumerate(lens.tolist()):
        keys = [(int(table[r, j // 16]), j % 16) for j in range(length)]
        for i in range(8):
            p = length - 8 + i
            lo = max(0, p - window + 1) if window else 0
            for h in range(kvh * 8):
                kv = h // 8
                qv = q[r * 8 + i, h * 64 : h * 64 + 64].double()
                ks = torch.stack([cache[pg, kv, row, :64].double() for pg, row in keys[lo : p + 1]])
                vs = torch.stack([cache[pg, kv, row, 64:].double() for pg, row in keys[lo : p + 1]])
                a = torch.softmax(0.6841258107984375 * ks @ qv, 0)
                o = a @ vs
                o = o / torch.sqrt(o.pow(2).mean() + 1e-5)
                out[r * 8 + i, h * 64 : h * 64 + 64] = o * torch.sigmoid(gate[r * 8 + i, h * 64 : h * 64 + 64].double())
    return out


@pytest.mark.parametrize("window", [0, 20])
def test_stock_attention_matches_the_formula(window):
    torch.manual_seed(window)
    kvh, lens, max_len = 1, [37, 9], 64
    cache = torch.randn(12, kvh, 16, 128).to(torch.bfloat16)
    table = torch.tensor([[3, 7, 1, 0], [5, 0, 0, 0]], dtype=torch.int32)
    lens_t = torch.tensor(lens, dtype=torch.int32)
    q = torch.randn(16, kvh * 512).to(torch.bfloat16)
    gate = torch.randn(16, kvh * 512).to(torch.bfloat16)
    got = stock.attn2(q, gate, cache, table, lens_t, window, max_len).double()
    ref = brute_attention(q, gate, cache, table, lens_t, kvh, window)
    rel = ((got - ref).pow(2).sum(-1) / ref.pow(2).sum(-1)).sqrt()
    assert rel.max() < 1e-2  # bf16 output


def test_stock_route_and_metadata():
    torch.manual_seed(1)
    logits = torch.randn(3, 256)
    bias = torch.randn(256) * 0.02
    ids, w = stock.route(logits, bias)
    assert ids.dtype == torch.int32 and ids.shape == (3, 8)
    assert torch.allclose(w.sum(-1), torch.ones(3))
    keys = torch.sigmoid(logits) + bias
    assert torch.equal(ids.long(), torch.sort(keys, dim=-1, descending=True, stable=True).indices[:, :8])
    buf = torch.full((md.metadata_size(16),), 7, dtype=torch.int32)
    meta = stock.routing_metadata(ids, 0, 64, 16, buf)
    f = md.RoutingMetadata(meta, 0, 64, 16).fields(3)
    local = (ids < 64).sum().item()
    assert f["num_non_exiting_ctas"].item() == len(set(ids[ids < 64].tolist()))
    p = f["expanded_idx_to_permuted_idx"]
    assert (p >= 0).sum().item() == local
    for r in range(24):
        if p[r] >= 0:
            assert f["permuted_idx_to_token_idx"][p[r]].item() == r // 8
    assert meta[-1].item() == 7  # guard untouched


def test_stock_qkv_front_writes_the_cache():
    torch.manual_seed(2)
    kvh, t = 2, 3
    x = torch.randn(t, 8192).to(torch.bfloat16)
    w = (torch.randn(2304, 8192) * 0.01).to(torch.bfloat16)
    cache = torch.zeros(4, kvh, 16, 128, dtype=torch.bfloat16)
    slots = torch.tensor([17, 3, -1])
    out = stock.qkv_front(x, w, torch.tensor([0, 5, 9]), L.rope_table(16), slots, cache, kvh)
    k = out[:, 16 * 64 : 18 * 64].view(t, kvh, 64)
    assert torch.equal(cache[1, :, 1, :64], k[0])
    assert torch.equal(cache[0, :, 3, :64], k[1])
    assert (cache[0, :, 0] == 0).all()  # the pad token (slot -1) wrote nothing
    # q and k heads have unit RMS before RoPE, and RoPE keeps the norm.
    qh = out[:, : 16 * 64].float().view(t, 16, 64)
    assert torch.allclose(qh.pow(2).mean(-1), torch.ones(t, 16), atol=2e-2)


def small_layer(layer_idx=0, tp=8):
    return L.MuseSparkAttentionRouting(layer_idx, max_model_len=128, tp_rank=0, tp_size=tp)


def test_layer_attributes_read_like_vllm():
    layer = small_layer()
    assert (layer.num_heads, layer.num_kv_heads, layer.head_dim) == (16, 2, 64)
    assert md.unsupported_attn2(layer) is None
    assert layer.router.router_output_multiplier is None  # folded at construction
    assert md.unsupported_projection(layer) == "a QKV weight in host memory"  # read from qkv_proj.weight
    assert small_layer(1).rotary_emb is None and small_layer(1).sliding_window is None


def test_planner(monkeypatch):
    layer = small_layer()
    assert layer.plan(8, 1, "cpu") == L.Plan(False, False, False, False, "not an SM90/SM100 GPU")
    monkeypatch.setattr(L, "supported_gpu", lambda device=-1: True)
    monkeypatch.setattr(layer, "unsupported", lambda: None)
    # attention_block takes the attention of 1 to 8 requests; the three ops' flags say where a refused call goes.
    too_many = "max_reqs 9 (the block serves 1 to 8 requests)"
    monkeypatch.setattr(layer, "unsupported_block", lambda num_reqs: None if num_reqs <= 8 else too_many)
    assert layer.plan(8, 1, "cuda:0") == L.Plan(True, True, True, True, block=True)
    assert layer.plan(16, 2, "cuda:0") == L.Plan(True, True, True, False, block=True)  # route takes at most 8 tokens
    assert layer.plan(24, 3, "cuda:0") == L.Plan(False, True, True, False, block=True)  # qkv_front takes at most 16
    assert layer.plan(72, 9, "cuda:0") == L.Plan(False, True, False, False,  # o_proj takes at most 64 rows
                                                 block_reason=too_many)
    assert not layer.plan(5, 1, "cuda:0").attention  # not a verify step
    assert not layer.plan(512, 1, "cuda:0").front  # prefill
    monkeypatch.setattr(layer, "unsupported", lambda: "head_dim 128 (the kernel has 64)")
    assert layer.plan(8, 1, "cuda:0") == L.Plan(False, False, False, False, "head_dim 128 (the kernel has 64)")


def test_layer_stock_step_on_cpu():
    layer = small_layer()
    cache = L.paged_cache(32, 2)
    x, pos, slots, table, lens = L.verify_step_inputs([70], 128, 32)
    h, _, _, ids, w, meta = layer(x, pos, slots, cache, table, lens, layer.new_metadata())
    assert h.shape == x.shape and torch.isfinite(h.float()).all()
    assert ids.shape == (8, 8) and torch.allclose(w.sum(-1), torch.ones(8), atol=1e-5)
    f = md.RoutingMetadata(meta, 0, 32, 128).fields(8)
    assert f["num_non_exiting_ctas"].item() == len(set(ids[ids < 32].tolist()))
    # The step's keys were inserted at their slots.
    for s in slots.tolist():
        assert cache[s // 16, :, s % 16].abs().sum() > 0


def test_torch_library_ops_are_registered():
    import muse_decode.torch_ops  # noqa: F401

    for name in ("route", "attn2", "qkv_front", "o_proj", "attention_block"):
        assert hasattr(torch.ops.muse_decode, name), name
    schema = str(torch.ops.muse_decode.route.default._schema)
    assert "Tensor(a" in schema and "!" in schema  # outputs marked mutated
    # Fake (meta) calls trace without running a kernel.
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        logits = torch.empty(8, 256)
        ids = torch.empty(8, 8, dtype=torch.int32)
        w = torch.empty(8, 8)
        assert torch.ops.muse_decode.route(logits, torch.empty(256), 1.0, ids, w, None, 0, 256, 128) is None
