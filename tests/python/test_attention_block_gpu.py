"""attention_block through the Python package on the GPU, against the three
ops chained through the same API on copies of the same inputs (x, weights,
cache), both against a PyTorch fp64 reference from the same bf16 inputs:
out within relative RMS 5e-3 per row, and the KV cache's new rows equal to
the projection's k and v within bf16 rounding, every other byte of the cache
untouched (NaN in the pages no request uses, block-table entries past each
request's pages out of range, pages in shuffled order, the new rows NaN
before the call). The reference rounds to bf16 where the block keeps its
rows in bf16 (the projection's rows, which the cache and the attention read,
and the attention's output rows, which o_proj reads), as the three ops do
between them; without that, the bf16 rounding of q alone moves peaked
softmaxes by more than the bar. R = 1, 2, 5 and 8 requests of different
lengths, TP8 and TP4, full and sliding layers, CUDA-graph capture replayed
with new lengths, bit-identical repeats, the bound form, the torch.library
op, and muse_decode.layer taking the block (and falling back where it does
not serve). The C++ GPU suite covers the kernel's own matrix."""

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
import muse_decode as md  # noqa: E402
from muse_decode import layer as L  # noqa: E402
from muse_decode import stock  # noqa: E402

pytestmark = pytest.mark.gpu
SCALE = 0.6841258107984375
BF16 = torch.bfloat16
OUT_OF_RANGE = 10**6  # block-table entries past a request's pages


@pytest.fixture(autouse=True)
def prepared():
    """Every op's device set up once, outside any graph capture."""
    for prepare in (md.prepare_attention_block, md.prepare_qkv_front, md.prepare_attn2, md.prepare_o_proj):
        prepare()


def rel_rms_rows(got, ref):
    got, ref = got.double(), ref.double()
    return ((got - ref).pow(2).sum(-1) / ref.pow(2).sum(-1)).sqrt()


def bits(t):
    return t.view(torch.int16)


def within_bf16_rounding(got, ref):
    """Each element of got within one bf16 step of ref (bf16 carries 8
    significant bits: a step is at most 2^-7 of the value), plus 1e-5 for
    the fp32 sums' own error near zero (~1e-7 here, unit-RMS heads)."""
    got, ref = got.float(), ref.float()
    return bool(((got - ref).abs() <= ref.abs() * 2.0**-7 + 1e-5).all())


# ---- inputs -----------------------------------------------------------------------------------

def make_step(lens, kvh=2, max_len=8192, rope=False, window=0, capacity=0, seed=0):
    """One verify step of len(lens) requests (each length counting its 8 new
    tokens) at a rank of kvh KV heads: random weights, x, and a cache whose
    pages are shuffled, NaN where no request reads, and NaN in the 8 new rows
    of each request (the block writes them before it reads them). Each
    request owns pages for `capacity` more tokens (for later steps)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    r, n, k = len(lens), 18 * kvh * 64, 8 * kvh * 64
    per_req = [-(-(length + capacity) // 16) for length in lens]
    num_pages = sum(per_req) + 9
    max_pages = -(-max_len // 16)
    perm = torch.randperm(num_pages, generator=g)
    table = torch.full((r, max_pages), OUT_OF_RANGE, dtype=torch.int32)
    used = 0
    for i, p in enumerate(per_req):
        table[i, :p] = perm[used : used + p].int()
        used += p
    cache = torch.randn(num_pages, kvh, 16, 128, generator=g).to(BF16)
    cache[perm[used:]] = float("nan")
    s = SimpleNamespace(
        kvh=kvh, max_len=max_len, window=md.attn2_window(window or None, max_len),
        wqkv=(torch.randn(n, 8192, generator=g) * 8192**-0.5).to(BF16).cuda(),
        wo=(torch.randn(8192, k, generator=g) * k**-0.5).to(BF16).cuda(),
        x=torch.randn(8 * r, 8192, generator=g).to(BF16).cuda(),
        cos_sin=L.rope_table(max_len, "cuda") if rope else None,
        table=table.cuda(), pos=torch.zeros(8 * r, dtype=torch.int64, device="cuda"),
        slots=torch.zeros(8 * r, dtype=torch.int64, device="cuda"),
        lens=torch.zeros(r, dtype=torch.int32, device="cuda"), cache=cache.cuda())
    set_lengths(s, lens)
    page, row = s.slots // 16, s.slots % 16
    s.cache[page, :, row] = float("nan")
    return s


def set_lengths(s, lens):
    """The step's lengths, positions and slots in their device tensors (a
    graph replays them)."""
    table = s.table.cpu()
    pos, slots = [], []
    for i, length in enumerate(lens):
        for p in range(length - 8, length):
            pos.append(p)
            slots.append(int(table[i, p // 16]) * 16 + p % 16)
    s.pos.copy_(torch.tensor(pos))
    s.slots.copy_(torch.tensor(slots))
    s.lens.copy_(torch.tensor(lens, dtype=torch.int32))


def block_workspace(s):
    r = s.lens.shape[0]
    nbytes = md.attention_block_workspace_bytes(r, s.kvh, s.max_len, s.window)
    return torch.zeros(nbytes, dtype=torch.uint8, device="cuda")


def run_block(s, cache, out, ws):
    return md.attention_block(s.x, s.wqkv, s.pos, s.cos_sin, s.slots, cache, s.kvh, s.table, s.lens, s.max_len,
                              s.window, s.wo, out, ws)


def run_three_ops(s, cache, out):
    """qkv_front (16 rows at a time: its most), attn2 and o_proj through the
    package, as muse_decode.layer chains them. Returns the front's rows."""
    t, r = s.x.shape[0], s.lens.shape[0]
    qkv = torch.empty(t, s.wqkv.shape[0], dtype=BF16, device="cuda")
    front_ws = torch.zeros(md.qkv_front_workspace_bytes_for_device(s.kvh), dtype=torch.uint8, device="cuda")
    for i in range(0, t, 16):
        md.qkv_front(s.x[i : i + 16], s.wqkv, s.pos[i : i + 16], s.cos_sin, s.slots[i : i + 16], cache, s.kvh,
                     qkv[i : i + 16], front_ws)
    q, gate = md.split_qkv(qkv, s.kvh)
    splits = md.attn2_splits(s.max_len, s.window, s.kvh)
    attn_ws = torch.zeros(max(md.attn2_workspace_bytes(r, s.kvh, splits), 16), dtype=torch.uint8, device="cuda")
    attn = torch.empty(t, s.wo.shape[1], dtype=BF16, device="cuda")
    md.attn2(q, gate, cache, s.table, s.lens, attn, attn_ws, s.max_len, s.window, splits)
    md.o_proj(attn, s.wo, out)
    return qkv


# ---- the fp64 reference ---------------------------------------------------------------------

def front_reference(s, cache):
    """qkv_front's part in fp64 from the step's bf16 inputs, rounded once:
    (the projection's rows q | k | v | gate in bf16, the cache after the
    insert)."""
    kvh, t = s.kvh, s.x.shape[0]
    h = 8 * kvh
    heads = (s.x.double() @ s.wqkv.double().t()).view(t, -1, 64).clone()
    qk = heads[:, : h + kvh]
    qk = qk * torch.rsqrt(qk.pow(2).mean(-1, keepdim=True) + 1e-5)
    if s.cos_sin is not None:
        cs = s.cos_sin.double()[s.pos.clamp(0, s.cos_sin.shape[0] - 1)]
        c, sn = cs[:, None, :32], cs[:, None, 32:]
        a0, a1 = qk[..., 0::2], qk[..., 1::2]
        qk = torch.stack((a0 * c - a1 * sn, a0 * sn + a1 * c), -1).flatten(-2)
    heads[:, : h + kvh] = qk
    qkv = heads.view(t, -1).to(BF16)
    k, v = qkv[:, h * 64 : (h + kvh) * 64], qkv[:, (h + kvh) * 64 : (h + 2 * kvh) * 64]
    after = cache.clone()
    after[s.slots // 16, :, s.slots % 16] = torch.cat((k.reshape(t, kvh, 64), v.reshape(t, kvh, 64)), -1)
    return qkv, after


def reference(s, cache):
    """From the step's bf16 inputs and the cache before the call, in fp64:
    (out [T, 8192], the projection's rows q | k | v | gate in bf16, the cache
    after the insert)."""
    kvh = s.kvh
    h = 8 * kvh
    qkv, after = front_reference(s, cache)
    q, gate = qkv[:, : h * 64], qkv[:, (h + 2 * kvh) * 64 :]
    rows = []
    for r, length in enumerate(s.lens.tolist()):
        pages = s.table[r, : (length + 15) // 16].long()
        kv = after[pages].double().permute(1, 0, 2, 3).reshape(kvh, -1, 128)[:, :length]
        qr = q[r * 8 : r * 8 + 8].double().view(8, kvh, 8, 64)
        gr = gate[r * 8 : r * 8 + 8].double().view(8, kvh, 8, 64)
        scores = SCALE * torch.einsum("ihgd,hjd->ihgj", qr, kv[..., :64])
        p = torch.arange(length - 8, length, device="cuda")[:, None]
        j = torch.arange(length, device="cuda")[None, :]
        visible = (j <= p) & ((s.window == 0) | (j > p - s.window))
        scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
        o = torch.einsum("ihgj,hjd->ihgd", torch.softmax(scores, -1), kv[..., 64:])
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-5) * torch.sigmoid(gr)
        rows.append(o.reshape(8, -1))
    attn = torch.cat(rows).to(BF16)
    return attn.double() @ s.wo.double().t(), qkv, after


def new_rows(cache, s):
    """The cache rows of the step's slots: [T, KVH, 128]."""
    return cache[s.slots // 16, :, s.slots % 16]


def check_cache(cache, before, s, kv_ref):
    """The step's rows within bf16 rounding of kv_ref [T, KVH, 128]; every
    other row the same bits as before."""
    assert within_bf16_rounding(new_rows(cache, s), kv_ref)
    written = torch.zeros(cache.shape[0], 16, dtype=torch.bool, device="cuda")
    written[s.slots // 16, s.slots % 16] = True
    a, b = cache.permute(0, 2, 1, 3), before.permute(0, 2, 1, 3)  # [pages, 16, KVH, 128]
    assert torch.equal(bits(a[~written]), bits(b[~written]))


def check_against_reference(s, before, out, cache):
    ref_out, ref_qkv, ref_cache = reference(s, before)
    assert torch.isfinite(out.float()).all()
    err = rel_rms_rows(out, ref_out).max().item()
    assert err <= 5e-3, err
    check_cache(cache, before, s, new_rows(ref_cache, s))
    return ref_out


# ---- the block against the three ops -------------------------------------------------------------

CASES = [
    # (lens, kvh, max_len, rope, window)
    ([4097], 2, 8192, False, 0),                             # TP8, one request, a full NoPE layer
    ([2049, 8], 2, 8192, False, 0),
    ([8, 17, 2047, 4100, 777], 2, 8192, True, 0),
    ([8, 9, 2047, 2049, 4097, 100, 3001, 8192], 2, 8192, False, 0),
    ([5000, 2100, 8], 2, 32768, True, 2048),                 # a sliding layer at 32k
    ([300, 31, 16], 2, 4096, True, 100),                     # a window shorter than the longer lengths
    ([50000], 2, 131072, False, 0),                          # 128k
    ([4097], 4, 8192, True, 0),                              # TP4
    ([2049, 8, 4095], 4, 32768, True, 2048),
    ([64] * 8, 4, 2048, False, 0),
]
IDS = [f"R{len(c[0])}-kvh{c[1]}-{c[2] // 1024}k-{'rope' if c[3] else 'nope'}-w{c[4]}" for c in CASES]


@pytest.mark.parametrize("lens, kvh, max_len, rope, window", CASES, ids=IDS)
def test_block_matches_the_three_ops_and_the_reference(lens, kvh, max_len, rope, window):
    s = make_step(lens, kvh, max_len, rope, window, seed=len(lens) * 10 + kvh)
    t = s.x.shape[0]
    cache_b, cache_o = s.cache.clone(), s.cache.clone()
    out_b = torch.full((t, 8192), float("nan"), dtype=BF16, device="cuda")
    out_o = torch.full_like(out_b, float("nan"))
    ws = block_workspace(s)
    assert md.unsupported_attention_block_call(s.x, s.wqkv, s.pos, s.cos_sin, s.slots, cache_b, kvh, s.table, s.lens,
                                               s.max_len, s.window, s.wo, out_b, ws) is None
    assert run_block(s, cache_b, out_b, ws) is out_b
    qkv_o = run_three_ops(s, cache_o, out_o)
    torch.cuda.synchronize()
    ref_out = check_against_reference(s, s.cache, out_b, cache_b)
    assert rel_rms_rows(out_o, ref_out).max().item() <= 5e-3
    assert rel_rms_rows(out_b, out_o).max().item() <= 5e-3
    # The block's k and v rows against the three ops' (their cache holds the front's own k and v).
    h = 8 * kvh
    kv_o = torch.cat((qkv_o[:, h * 64 : (h + kvh) * 64].reshape(t, kvh, 64),
                      qkv_o[:, (h + kvh) * 64 : (h + 2 * kvh) * 64].reshape(t, kvh, 64)), -1)
    assert torch.equal(bits(new_rows(cache_o, s)), bits(kv_o))
    assert within_bf16_rounding(new_rows(cache_b, s), kv_o)


def test_strided_views_and_untouched_bytes():
    s = make_step([3000, 9], seed=5)
    t = s.x.shape[0]
    xs = torch.randn(t, 8192 + 64, device="cuda").to(BF16)
    xs[:, 32 : 32 + 8192] = s.x
    s.x = xs[:, 32 : 32 + 8192]  # a column view with its own row stride
    big = torch.full((t + 2, 8192 + 128), 7.0, dtype=BF16, device="cuda")
    out = big[1 : 1 + t, 64 : 64 + 8192]
    before = big.clone()
    cache = s.cache.clone()
    ws = block_workspace(s)
    run_block(s, cache, out, ws)
    torch.cuda.synchronize()
    mask = torch.ones_like(big, dtype=torch.bool)
    mask[1 : 1 + t, 64 : 64 + 8192] = False
    assert torch.equal(big[mask], before[mask])
    check_against_reference(s, s.cache, out, cache)


def test_repeats_are_bit_identical_and_the_workspace_stays_ready():
    """The same inputs give the same bits on every run, the workspace reused
    as each launch leaves it."""
    s = make_step([4097, 2049], rope=True, seed=6)
    ws = block_workspace(s)
    outs, caches = [], []
    for _ in range(3):
        cache = s.cache.clone()
        out = torch.empty(s.x.shape[0], 8192, dtype=BF16, device="cuda")
        run_block(s, cache, out, ws)
        outs.append(out)
        caches.append(cache)
    torch.cuda.synchronize()
    for out, cache in zip(outs[1:], caches[1:]):
        assert torch.equal(bits(out), bits(outs[0])) and torch.equal(bits(cache), bits(caches[0]))
    check_against_reference(s, s.cache, outs[0], caches[0])


def test_bound_form_gives_the_direct_calls_bits():
    s = make_step([4097, 8, 100], rope=True, window=2048, seed=7)
    ws = block_workspace(s)
    cache_d, cache_b = s.cache.clone(), s.cache.clone()
    out_d = torch.empty(s.x.shape[0], 8192, dtype=BF16, device="cuda")
    out_b = torch.empty_like(out_d)
    run_block(s, cache_d, out_d, ws)
    block = md.AttentionBlock(s.wqkv, s.cos_sin, cache_b, s.kvh, s.wo, s.max_len, s.window, ws)
    assert block(s.x, s.pos, s.slots, s.table, s.lens, out_b) is out_b
    torch.cuda.synchronize()
    assert torch.equal(bits(out_b), bits(out_d)) and torch.equal(bits(cache_b), bits(cache_d))
    check_against_reference(s, s.cache, out_b, cache_b)


@pytest.mark.parametrize("bound", [False, True], ids=["op", "bound"])
@pytest.mark.parametrize("rope, window", [(False, 0), (True, 2048)], ids=["full", "sliding"])
def test_graph_replays_with_new_lengths(bound, rope, window):
    lens = [3000, 1000, 8]
    s = make_step(lens, max_len=8192, rope=rope, window=window, capacity=24, seed=8)
    cache = s.cache.clone()
    ws = block_workspace(s)
    out = torch.empty(s.x.shape[0], 8192, dtype=BF16, device="cuda")
    block = md.AttentionBlock(s.wqkv, s.cos_sin, cache, s.kvh, s.wo, s.max_len, s.window, ws) if bound else None

    def call():
        if bound:
            block(s.x, s.pos, s.slots, s.table, s.lens, out)
        else:
            run_block(s, cache, out, ws)

    call()  # outside capture first
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    g = torch.Generator(device="cpu").manual_seed(9)
    for step in range(1, 4):
        # The next verify step: 8 more tokens per request, new hidden states, the same pages.
        set_lengths(s, [length + 8 * step for length in lens])
        s.x.copy_(torch.randn(s.x.shape, generator=g).to(BF16))
        before = cache.clone()
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check_against_reference(s, before, out, cache)
        # The replay's bits are an eager call's on the same inputs.
        cache_e, out_e = before.clone(), torch.empty_like(out)
        run_block(s, cache_e, out_e, block_workspace(s))
        torch.cuda.synchronize()
        assert torch.equal(bits(out), bits(out_e)) and torch.equal(bits(cache), bits(cache_e))


def test_a_refused_call_writes_nothing():
    s = make_step([100] * 8, seed=10)
    x9 = torch.cat((s.x, s.x[:8]))  # 9 requests' rows: one past the block's 8
    out = torch.full((72, 8192), 3.0, dtype=BF16, device="cuda")
    cache = s.cache.clone()
    args = (x9, s.wqkv, s.pos, s.cos_sin, s.slots, cache, s.kvh, s.table, s.lens, s.max_len, s.window, s.wo, out,
            block_workspace(s))
    reason = md.unsupported_attention_block_call(*args)
    assert reason == "x must be [R*8, 8192] with 1 <= R <= 8 (8 rows per request), got [72, 8192]"
    with pytest.raises(ValueError) as e:
        md.attention_block(*args)
    assert str(e.value) == reason
    torch.cuda.synchronize()
    assert (out == 3.0).all() and torch.equal(bits(cache), bits(s.cache))


def test_torch_library_op_matches_the_direct_call():
    import muse_decode.torch_ops  # noqa: F401

    s = make_step([2049, 17], rope=True, seed=11)
    cache_a, cache_b = s.cache.clone(), s.cache.clone()
    out_a = torch.empty(s.x.shape[0], 8192, dtype=BF16, device="cuda")
    out_b = torch.empty_like(out_a)
    torch.ops.muse_decode.attention_block(s.x, s.wqkv, s.pos, s.cos_sin, s.slots, cache_a, s.kvh, s.table, s.lens,
                                          s.max_len, s.window, s.wo, out_a, block_workspace(s))
    run_block(s, cache_b, out_b, block_workspace(s))
    torch.cuda.synchronize()
    assert torch.equal(bits(out_a), bits(out_b)) and torch.equal(bits(cache_a), bits(cache_b))


# ---- muse_decode.layer ----------------------------------------------------------------------

MAX_LEN, PAGES = 8192, 600
STOCK = L.Plan(False, False, False, False, "forced")


def check_layer_step(layer, step, ref, cache, ref_cache, slots, fused_ref=True):
    """The block's step against another path's: hidden within 5e-3 per row,
    the cache's new rows within bf16 rounding of the three fused ops' (the
    stock front rounds its projection before the norm and RoPE: within 2% of
    the largest, as test_layer_gpu holds it) and every other byte the same,
    routing as the formula on the step's own logits."""
    assert torch.isfinite(step.hidden.float()).all()
    assert rel_rms_rows(step.hidden, ref.hidden).max().item() <= 5e-3
    rows_a, rows_b = cache[slots // 16, :, slots % 16], ref_cache[slots // 16, :, slots % 16]
    if fused_ref:
        assert within_bf16_rounding(rows_a, rows_b)
    else:
        a, b = rows_a.float(), rows_b.float()
        assert (a - b).abs().max().item() <= 0.02 * b.abs().max().item() + 1e-3
    written = torch.zeros(cache.shape[0], 16, dtype=torch.bool, device="cuda")
    written[slots // 16, slots % 16] = True
    assert torch.equal(bits(cache.permute(0, 2, 1, 3)[~written]), bits(ref_cache.permute(0, 2, 1, 3)[~written]))
    hn = stock.rms_norm(step.hidden) * layer.post_attention_norm.float()
    logits = hn @ layer.router.weight.t()
    ids, w = stock.route(logits, layer.router.expert_bias, layer.router.route_scale)
    keys = torch.sort(torch.sigmoid(logits) + layer.router.expert_bias, dim=-1, descending=True).values
    ok = (keys[:, 7] - keys[:, 8]) > 1e-5
    assert torch.equal(step.ids[ok], ids[ok])
    assert torch.allclose(step.weights[ok], w[ok], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("layer_idx", [0, 1])  # a sliding RoPE layer, a full NoPE layer
@pytest.mark.parametrize("lens", [[4100], [4100, 9]], ids=["R1", "R2"])
def test_layer_takes_the_block(layer_idx, lens):
    layer = L.MuseSparkAttentionRouting(layer_idx, MAX_LEN, tp_rank=0, tp_size=8, device="cuda")
    layer.prepare(num_reqs=2)
    assert layer.block_reason is None and layer.unsupported_block(len(lens)) is None
    t = 8 * len(lens)
    plan = layer.plan(t, len(lens), "cuda")
    assert plan == L.Plan(True, True, True, t <= 8, block=True)
    cache_b = L.paged_cache(PAGES, layer.num_kv_heads, "cuda")
    cache_o, cache_s = cache_b.clone(), cache_b.clone()
    x, pos, slots, table, lens_t = L.verify_step_inputs(lens, MAX_LEN, PAGES, "cuda")
    block = layer(x, pos, slots, cache_b, table, lens_t, layer.new_metadata(), plan)
    assert layer.attention_path == L.AttentionPath("attention_block", None)
    assert block.qkv is None and block.attn is None
    ops = layer(x, pos, slots, cache_o, table, lens_t, layer.new_metadata(), L.Plan(True, True, True, t <= 8))
    assert layer.attention_path == L.AttentionPath("three ops", "the plan keeps the three ops")
    ref = layer(x, pos, slots, cache_s, table, lens_t, layer.new_metadata(), STOCK)
    assert layer.attention_path == L.AttentionPath("three ops", "forced")
    torch.cuda.synchronize()
    check_layer_step(layer, block, ops, cache_b, cache_o, slots)
    check_layer_step(layer, block, ref, cache_b, cache_s, slots, fused_ref=False)


def test_layer_step_with_the_block_in_one_graph():
    layer = L.MuseSparkAttentionRouting(0, MAX_LEN, tp_rank=0, tp_size=8, device="cuda", seed=3)
    layer.prepare(num_reqs=1)
    plan = layer.plan(8, 1, "cuda")
    assert plan.block
    cache = L.paged_cache(PAGES, layer.num_kv_heads, "cuda", seed=3)
    x, pos, slots, table, lens = L.verify_step_inputs([3000], MAX_LEN, PAGES, "cuda", seed=3)
    meta = layer.new_metadata()
    layer(x, pos, slots, cache, table, lens, meta, plan)  # warm-up outside capture
    assert layer.attention_path.path == "attention_block"
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layer(x, pos, slots, cache, table, lens, meta, plan)
    for step in range(3):
        _, npos, nslots, _, nlens = L.verify_step_inputs([3000 + 8 * (step + 1)], MAX_LEN, PAGES, "cuda", seed=3)
        x.copy_(torch.randn_like(x.float()).to(x.dtype))
        pos.copy_(npos)
        slots.copy_(nslots)
        lens.copy_(nlens)
        ref_cache = cache.clone()
        graph.replay()
        torch.cuda.synchronize()
        ref = layer(x, pos, slots, ref_cache, table, lens, layer.new_metadata(), STOCK)
        torch.cuda.synchronize()
        check_layer_step(layer, out, ref, cache, ref_cache, slots, fused_ref=False)


def test_layer_falls_back_where_the_block_does_not_serve():
    """A TP2 rank (8 KV heads): the three ops, with the block's reason."""
    layer = L.MuseSparkAttentionRouting(0, MAX_LEN, tp_rank=0, tp_size=2, device="cuda")
    layer.prepare(num_reqs=1)
    why = "8 KV heads per rank (the block serves 2 or 4: TP8 or TP4)"
    assert layer.block_reason == why
    plan = layer.plan(8, 1, "cuda")
    assert plan == L.Plan(True, True, True, True, block_reason=why)
    cache = L.paged_cache(PAGES, layer.num_kv_heads, "cuda")
    cache_s = cache.clone()
    x, pos, slots, table, lens = L.verify_step_inputs([2000], MAX_LEN, PAGES, "cuda")
    step = layer(x, pos, slots, cache, table, lens, layer.new_metadata(), plan)
    assert layer.attention_path == L.AttentionPath("three ops", why)
    assert step.qkv is not None and step.attn is not None
    ref = layer(x, pos, slots, cache_s, table, lens, layer.new_metadata(), STOCK)
    torch.cuda.synchronize()
    assert rel_rms_rows(step.hidden, ref.hidden).max().item() <= 5e-3
