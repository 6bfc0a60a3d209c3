"""qkv_front through the Python package: the result against a PyTorch fp32
path from the same bf16 inputs (relative RMS per token and head), cache bits
equal to out's k and v, slots -1 untouched, and a refused call writes
nothing. The C++ GPU suite covers every T, KVH, RoPE/NoPE and graphs."""

import pytest

torch = pytest.importorskip("torch")
import muse_decode as md  # noqa: E402

pytestmark = pytest.mark.gpu


def reference(x, w, positions, cos_sin, kvh):
    t, h = x.shape[0], 8 * kvh
    y = x.double() @ w.double().t()
    heads = y.view(t, -1, 64)
    qk = heads[:, : h + kvh]
    qk = qk * torch.rsqrt(qk.pow(2).mean(-1, keepdim=True) + 1e-5)
    if cos_sin is not None:
        cs = cos_sin.double()[positions]
        c, s = cs[:, None, :32], cs[:, None, 32:]
        a0, a1 = qk[..., 0::2], qk[..., 1::2]
        qk = torch.stack((a0 * c - a1 * s, a0 * s + a1 * c), -1).flatten(-2)
    heads = heads.clone()
    heads[:, : h + kvh] = qk
    return heads.view(t, -1)


@pytest.mark.parametrize("kvh", [2, 16])
@pytest.mark.parametrize("rope", [True, False])
@pytest.mark.parametrize("t", [1, 8, 16])
def test_matches_reference_and_cache(kvh, rope, t):
    torch.manual_seed(t * 100 + kvh)
    n = 18 * kvh * 64
    x = torch.randn(t, 8192, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(n, 8192, device="cuda") * 0.02).to(torch.bfloat16)
    cos_sin = torch.randn(4096, 64, device="cuda") if rope else None
    pos = torch.randint(0, 4096, (t,), device="cuda")
    pos[0] = 4095
    pages = 64
    slots = torch.randperm(pages * 16, device="cuda")[:t]
    slots[-1] = -1
    cache = torch.full((pages, kvh, 16, 128), float("nan"), device="cuda", dtype=torch.bfloat16)
    before = cache.clone()
    out = torch.empty(t, n, device="cuda", dtype=torch.bfloat16)
    ws = torch.zeros(md.qkv_front_workspace_bytes_for_device(kvh), dtype=torch.uint8, device="cuda")
    assert md.supports_call(x, w, pos, cos_sin, slots, cache, kvh, out)
    assert md.qkv_front_supports_call(x, w, pos, cos_sin, slots, cache, kvh, out, ws)
    md.prepare_qkv_front()
    md.launch_qkv_front(x, w, pos, cos_sin, slots, cache, kvh, out, ws)
    torch.cuda.synchronize()
    ref = reference(x, w, pos, cos_sin, kvh).view(t, -1, 64)
    got = out.double().view(t, -1, 64)
    err = ((got - ref).pow(2).sum(-1) / ref.pow(2).sum(-1)).sqrt()
    assert torch.isfinite(got).all()
    assert err.max().item() <= 5e-3
    h = 8 * kvh
    # Slot s lives at cache[s // 16, :, s % 16, :] (pages, KV heads, 16 rows, 128).
    rows = cache.permute(0, 2, 1, 3).reshape(-1, kvh, 128)
    rows_before = before.permute(0, 2, 1, 3).reshape(-1, kvh, 128)
    k = out[:, h * 64 : (h + kvh) * 64].view(t, kvh, 64)
    v = out[:, (h + kvh) * 64 : (h + 2 * kvh) * 64].view(t, kvh, 64)
    for i in range(t - 1):
        s = slots[i].item()
        assert torch.equal(rows[s, :, :64].view(torch.int16), k[i].view(torch.int16))
        assert torch.equal(rows[s, :, 64:].view(torch.int16), v[i].view(torch.int16))
    written = torch.zeros(pages * 16, dtype=torch.bool, device="cuda")
    written[slots[:-1]] = True
    assert torch.equal(rows[~written].view(torch.int16), rows_before[~written].view(torch.int16))
    # The bound front (static tensors read once) and the op by keyword (its
    # own name; pdl off) give the same bits.
    bound_out = torch.empty_like(out)
    md.QkvFront(w, cos_sin, cache, kvh, ws)(x, pos, slots, bound_out)
    kw_out = torch.empty_like(out)
    md.qkv_front(x=x, weight=w, positions=pos, cos_sin=cos_sin, slot_mapping=slots, kv_cache=cache, num_kv_heads=kvh,
                 out=kw_out, workspace=ws, pdl=False)
    torch.cuda.synchronize()
    assert torch.equal(bound_out.view(torch.int16), out.view(torch.int16))
    assert torch.equal(kw_out.view(torch.int16), out.view(torch.int16))


def test_refusal_writes_nothing():
    kvh, t = 2, 4
    x = torch.randn(t, 8192, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2304, 8192, device="cuda", dtype=torch.bfloat16)
    pos = torch.zeros(t, dtype=torch.int64, device="cuda")
    slots = torch.arange(t, device="cuda")
    cache = torch.zeros(8, kvh, 16, 128, device="cuda", dtype=torch.bfloat16)
    out = torch.full((t, 2304), 7.0, device="cuda", dtype=torch.bfloat16)
    ws = torch.zeros(md.qkv_front_workspace_bytes_for_device(kvh), dtype=torch.uint8, device="cuda")
    assert not md.supports_call(x.float(), w, pos, None, slots, cache, kvh, out)
    assert md.unsupported_qkv_front_call(x.float(), w, pos, None, slots, cache, kvh, out) == (
        "x must be bfloat16, got float32")
    with pytest.raises(ValueError, match="^x must be"):
        md.launch_qkv_front(x.float(), w, pos, None, slots, cache, kvh, out, ws)
    with pytest.raises(ValueError, match="slot_mapping"):
        md.launch_qkv_front(x, w, pos, None, slots.int(), cache, kvh, out, ws)
    torch.cuda.synchronize()
    assert (out == 7.0).all() and (cache == 0).all()
