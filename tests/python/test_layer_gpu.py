"""The Muse Spark layer on the GPU: the verify step through the fused ops
agrees with the stock PyTorch path, op by op from the same inputs as the
contract's bar is stated (the front's output per token and head against the
stock front; the attention per row and head against the stock attention of
the fused step's own q, gate and cache: relative RMS <= 5e-3; chained, bf16
rounding of q moves peaked softmaxes further), the hidden state after the
residual against the stock step's, the cache rows, and the routing against
the formula on the step's own logits; and the whole fused step captured in
one CUDA graph replays correctly with new tokens and lengths. These tests
run the three ops (THREE_OPS, the path of a call attention_block refuses);
the layer's attention through attention_block is test_attention_block_gpu's."""

import pytest

torch = pytest.importorskip("torch")
import muse_decode as md  # noqa: E402
from muse_decode import layer as L  # noqa: E402
from muse_decode import stock  # noqa: E402

pytestmark = pytest.mark.gpu
MAX_LEN, PAGES = 8192, 600
STOCK = L.Plan(False, False, False, False, "forced")
THREE_OPS = L.Plan(True, True, True, True)  # the planner's choice for 8 rows, attention_block left out


def rel_rms_rows(a, b):
    a, b = a.double(), b.double()
    return ((a - b).pow(2).sum(-1) / b.pow(2).sum(-1)).sqrt()


def separated(logits, bias):
    """Rows whose 8th and 9th keys differ by more than float rounding."""
    keys = torch.sort(torch.sigmoid(logits) + bias, dim=-1, descending=True).values
    return (keys[:, 7] - keys[:, 8]) > 1e-5


def check_step(layer, fused, ref, cache, table, lens):
    h_f, qkv_f, attn_f, ids_f, w_f, _ = fused
    assert torch.isfinite(h_f.float()).all() and torch.isfinite(attn_f.float()).all()
    t = attn_f.shape[0]
    front = rel_rms_rows(qkv_f.view(t, -1, 64), ref.qkv.view(t, -1, 64))
    assert front.max().item() <= 5e-3, front.max().item()
    q, gate = md.split_qkv(qkv_f, layer.num_kv_heads)
    attn_ref = stock.attn2(q, gate, cache, table, lens, layer.window, layer.max_model_len)
    per_head = rel_rms_rows(attn_f.view(t, -1, 64), attn_ref.view(t, -1, 64))
    assert per_head.max().item() <= 5e-3, per_head.max().item()
    assert rel_rms_rows(h_f, ref.hidden).max().item() <= 5e-3
    # Routing: the fused ids against the contract's formula on the fused step's own logits.
    hn = stock.rms_norm(h_f) * layer.post_attention_norm.float()
    logits = hn @ layer.router.weight.t()
    ids_ref, w_ref = stock.route(logits, layer.router.expert_bias, layer.router.route_scale)
    ok = separated(logits, layer.router.expert_bias)
    assert torch.equal(ids_f[ok], ids_ref[ok])
    assert torch.allclose(w_f[ok], w_ref[ok], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("layer_idx", [0, 1])  # a sliding RoPE layer, a full NoPE layer
def test_fused_step_matches_stock(layer_idx):
    layer = L.MuseSparkAttentionRouting(layer_idx, MAX_LEN, tp_rank=0, tp_size=8, device="cuda")
    assert layer.unsupported() is None
    layer.prepare(num_reqs=1)
    assert layer.plan(8, 1, "cuda") == L.Plan(True, True, True, True, block=True)  # TP8: the block serves it
    plan = THREE_OPS
    cache_f = L.paged_cache(PAGES, layer.num_kv_heads, "cuda")
    cache_s = cache_f.clone()
    x, pos, slots, table, lens = L.verify_step_inputs([4100], MAX_LEN, PAGES, "cuda")
    fused = layer(x, pos, slots, cache_f, table, lens, layer.new_metadata(), plan)
    ref = layer(x, pos, slots, cache_s, table, lens, layer.new_metadata(), STOCK)
    torch.cuda.synchronize()
    check_step(layer, fused, ref, cache_f, table, lens)
    # The step's k and v rows in the cache agree (bf16 of the same values, up to one rounding).
    for s in slots.tolist():
        a, b = cache_f[s // 16, :, s % 16].float(), cache_s[s // 16, :, s % 16].float()
        assert (a - b).abs().max().item() <= 0.02 * b.abs().max().item() + 1e-3


def test_whole_step_in_one_graph():
    layer = L.MuseSparkAttentionRouting(0, MAX_LEN, tp_rank=0, tp_size=8, device="cuda", seed=3)
    layer.prepare(num_reqs=1)
    plan = THREE_OPS
    cache = L.paged_cache(PAGES, layer.num_kv_heads, "cuda", seed=3)
    x, pos, slots, table, lens = L.verify_step_inputs([3000], MAX_LEN, PAGES, "cuda", seed=3)
    meta = layer.new_metadata()
    layer(x, pos, slots, cache, table, lens, meta, plan)  # warm-up outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layer(x, pos, slots, cache, table, lens, meta, plan)
    for step in range(3):
        # The next verify step: 8 more tokens, new hidden states, the same pages.
        new_len = 3000 + 8 * (step + 1)
        nx, npos, nslots, _, nlens = L.verify_step_inputs([new_len], MAX_LEN, PAGES, "cuda", seed=3)
        x.copy_(torch.randn_like(x.float()).to(x.dtype))
        pos.copy_(npos)
        slots.copy_(nslots)
        lens.copy_(nlens)
        ref_cache = cache.clone()
        graph.replay()
        torch.cuda.synchronize()
        ref = layer(x, pos, slots, ref_cache, table, lens, layer.new_metadata(), STOCK)
        check_step(layer, out, ref, cache, table, lens)


def test_torch_library_op_runs_and_matches_the_direct_call():
    import muse_decode.torch_ops  # noqa: F401

    bias = torch.randn(256, device="cuda") * 0.02
    logits = torch.randn(8, 256, device="cuda")
    ids_a = torch.empty(8, 8, dtype=torch.int32, device="cuda")
    w_a = torch.empty(8, 8, device="cuda")
    ids_b, w_b = torch.empty_like(ids_a), torch.empty_like(w_a)
    buf_a = torch.zeros(md.metadata_size(64), dtype=torch.int32, device="cuda")
    buf_b = buf_a.clone()
    md.prepare_route()
    torch.ops.muse_decode.route(logits, bias, 1.0, ids_a, w_a, buf_a, 0, 32, 64)

    md.MuseRouting(L.router(bias))(logits, ids_b, w_b, md.RoutingMetadata(buf_b, 0, 32, 64))
    torch.cuda.synchronize()
    assert torch.equal(ids_a, ids_b) and torch.equal(w_a, w_b) and torch.equal(buf_a, buf_b)
