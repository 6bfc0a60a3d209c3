"""attn2 through the Python package against a PyTorch fp64 path from the same
bf16 inputs (relative RMS per row and head <= 5e-3), with shuffled pages,
NaN in unused pages, a window, and a graph replay with new lengths. The C++
GPU suite covers the full matrix of lengths, windows, KV heads and requests."""

import pytest

torch = pytest.importorskip("torch")
import muse_decode as md  # noqa: E402

pytestmark = pytest.mark.gpu
SCALE = 0.6841258107984375


def reference(q, gate, cache, table, lens, kvh, window):
    outs = []
    for r, L in enumerate(lens.tolist()):
        pages = table[r, : (L + 15) // 16].long()
        kv = cache[pages].double()  # [p, KVH, 16, 128]
        kv = kv.permute(1, 0, 2, 3).reshape(kvh, -1, 128)[:, :L]
        qr = q[r * 8 : r * 8 + 8].double().view(8, kvh, 8, 64)
        g = gate[r * 8 : r * 8 + 8].double().view(8, kvh, 8, 64)
        s = SCALE * torch.einsum("ihgd,hjd->ihgj", qr, kv[..., :64])
        pos = torch.arange(L - 8, L, device=q.device)[:, None]
        j = torch.arange(L, device=q.device)[None, :]
        visible = (j <= pos) & ((window == 0) | (j > pos - window))
        s = s.masked_fill(~visible[:, None, None, :], float("-inf"))
        o = torch.einsum("ihgj,hjd->ihgd", torch.softmax(s, -1), kv[..., 64:])
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-5) * torch.sigmoid(g)
        outs.append(o.reshape(8, -1))
    return torch.cat(outs)


def check(out, ref, kvh):
    got = out.double().view(-1, kvh * 8, 64)
    ref = ref.view(-1, kvh * 8, 64)
    err = ((got - ref).pow(2).sum(-1) / ref.pow(2).sum(-1)).sqrt()
    assert torch.isfinite(got).all()
    assert err.max().item() <= 5e-3, err.max().item()


@pytest.mark.parametrize("max_len, window, lens", [(8192, 0, [4097, 8, 2049]), (2048, 0, [2048, 17]),
                                                   (131072, 100, [50000])])
def test_attn2_matches_reference(max_len, window, lens):
    torch.manual_seed(len(lens) + window)
    kvh, R = 2, len(lens)
    max_pages = (max_len + 15) // 16
    num_pages = sum((L + 15) // 16 for L in lens) + 7
    cache = torch.randn(num_pages, kvh, 16, 128, device="cuda").to(torch.bfloat16)
    perm = torch.randperm(num_pages, device="cuda")
    table = torch.full((R, max_pages), 10**6, dtype=torch.int32, device="cuda")  # out of range past L
    used = 0
    for r, L in enumerate(lens):
        n = (L + 15) // 16
        table[r, :n] = perm[used : used + n].int()
        used += n
    cache[perm[used:]] = float("nan")  # pages no request uses
    lens_t = torch.tensor(lens, dtype=torch.int32, device="cuda")
    q = torch.randn(R * 8, kvh * 512, device="cuda").to(torch.bfloat16)
    gate = torch.randn(R * 8, kvh * 512, device="cuda").to(torch.bfloat16)
    out = torch.empty_like(q)
    w = md.attn2_window(window or None, max_len)
    splits = md.attn2_splits(max_len, w, kvh)
    ws = torch.zeros(md.attn2_workspace_bytes(R, kvh, splits), dtype=torch.uint8, device="cuda")
    md.prepare_attn2()
    md.attn2(q, gate, cache, table, lens_t, out, ws, max_len, w, splits)
    torch.cuda.synchronize()
    check(out, reference(q, gate, cache, table, lens_t, kvh, w), kvh)
    # The bound op (cache, workspace and sizes read once) gives the same bits.
    bound_out = torch.empty_like(out)
    md.Attn2(cache, ws, max_len, w, splits)(q, gate, table, lens_t, bound_out)
    torch.cuda.synchronize()
    assert torch.equal(bound_out.view(torch.int16), out.view(torch.int16))
    # Graph: capture once, replay with new lengths.
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        md.attn2(q, gate, cache, table, lens_t, out, ws, max_len, w, splits)
    lens_t.sub_(5).clamp_(min=8)
    graph.replay()
    torch.cuda.synchronize()
    check(out, reference(q, gate, cache, table, lens_t, kvh, w), kvh)


def test_attn2_refuses_bad_lengths_dtype():
    q = torch.zeros(8, 1024, device="cuda", dtype=torch.bfloat16)
    cache = torch.zeros(4, 2, 16, 128, device="cuda", dtype=torch.bfloat16)
    table = torch.zeros(1, 128, dtype=torch.int32, device="cuda")
    out = torch.full_like(q, 3.0)
    with pytest.raises(ValueError, match="seq_lens"):
        md.attn2(q, q, cache, table, torch.zeros(1, dtype=torch.int64, device="cuda"), out, None, 2048, 0, 1)
    torch.cuda.synchronize()
    assert (out == 3.0).all()
