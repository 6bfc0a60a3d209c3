"""o_proj through the Python package: out against an fp64 product of the same
bf16 inputs (relative RMS per row), the same bits as a fp32 PyTorch matmul
rounded once where both sum exactly, strided x and out with the bytes around
out untouched, the bound form, bit-identical repeats and a CUDA graph that
replays with new x. The C++ GPU suite covers every T from 1 to 64, every K,
PDL on and off."""

import pytest

torch = pytest.importorskip("torch")
import muse_decode as md  # noqa: E402

pytestmark = pytest.mark.gpu


def rel_rms_rows(got, ref):
    got, ref = got.double(), ref.double()
    return ((got - ref).pow(2).sum(-1) / ref.pow(2).sum(-1)).sqrt()


@pytest.mark.parametrize("k", [1024, 8192])  # TP8, TP1
@pytest.mark.parametrize("t", [1, 7, 8, 33, 64])
def test_matches_reference(k, t):
    torch.manual_seed(t * 7 + k)
    x = torch.randn(t, k, device="cuda").to(torch.bfloat16)
    w = (torch.randn(8192, k, device="cuda") * k**-0.5).to(torch.bfloat16)
    out = torch.full((t, 8192), float("nan"), device="cuda", dtype=torch.bfloat16)
    assert md.unsupported_o_proj_call(x, w, out) is None
    md.prepare_o_proj()
    md.o_proj(x, w, out)
    torch.cuda.synchronize()
    assert torch.isfinite(out.float()).all()
    ref = x.double() @ w.double().t()
    assert rel_rms_rows(out, ref).max().item() <= 5e-3


def test_strided_views_and_untouched_bytes():
    torch.manual_seed(1)
    t, k = 9, 1024
    xs = torch.randn(t, k + 64, device="cuda").to(torch.bfloat16)  # a column view with its own row stride
    x = xs[:, 32 : 32 + k]
    w = (torch.randn(8192, k, device="cuda") * k**-0.5).to(torch.bfloat16)
    big = torch.full((t + 2, 8192 + 128), 7.0, device="cuda", dtype=torch.bfloat16)
    out = big[1 : 1 + t, 64 : 64 + 8192]
    before = big.clone()
    md.prepare_o_proj()
    md.o_proj(x, w, out)
    torch.cuda.synchronize()
    mask = torch.ones_like(big, dtype=torch.bool)
    mask[1 : 1 + t, 64 : 64 + 8192] = False
    assert torch.equal(big[mask], before[mask])
    assert rel_rms_rows(out, x.double() @ w.double().t()).max().item() <= 5e-3


def test_bound_form_repeats_bits_and_replays_in_a_graph():
    torch.manual_seed(2)
    t, k = 8, 1024
    w = (torch.randn(8192, k, device="cuda") * k**-0.5).to(torch.bfloat16)
    x = torch.randn(t, k, device="cuda").to(torch.bfloat16)
    out = torch.empty(t, 8192, device="cuda", dtype=torch.bfloat16)
    proj = md.OProj(w)
    proj(x, out)
    first = out.clone()
    for _ in range(3):
        proj(x, out, pdl=False)
        assert torch.equal(out, first)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        proj(x, out)
    for _ in range(2):
        x.copy_(torch.randn_like(x.float()).to(x.dtype))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_rms_rows(out, x.double() @ w.double().t()).max().item() <= 5e-3
        direct = torch.empty_like(out)
        md.o_proj(x, w, direct)
        assert torch.equal(out, direct)


def test_a_refused_call_writes_nothing():
    x = torch.randn(65, 1024, device="cuda").to(torch.bfloat16)  # one row past 64
    w = torch.zeros(8192, 1024, device="cuda", dtype=torch.bfloat16)
    out = torch.full((65, 8192), 3.0, device="cuda", dtype=torch.bfloat16)
    reason = md.unsupported_o_proj_call(x, w, out)
    assert reason is not None and reason.startswith("x ")
    with pytest.raises(ValueError, match="^x "):
        md.o_proj(x, w, out)
    torch.cuda.synchronize()
    assert (out == 3.0).all()


def test_torch_library_op_matches_the_direct_call():
    import muse_decode.torch_ops  # noqa: F401

    torch.manual_seed(3)
    x = torch.randn(8, 1024, device="cuda").to(torch.bfloat16)
    w = (torch.randn(8192, 1024, device="cuda") * 0.03).to(torch.bfloat16)
    a, b = torch.empty(8, 8192, device="cuda", dtype=torch.bfloat16), torch.empty(8, 8192, device="cuda",
                                                                                  dtype=torch.bfloat16)
    md.prepare_o_proj()
    torch.ops.muse_decode.o_proj(x, w, a)
    md.o_proj(x, w, b)
    torch.cuda.synchronize()
    assert torch.equal(a, b)
