"""CPU tests of attention_block's Python surface: names, signatures and the
module named after it, the sizing values, every argument's check (ValueError
with the exact text, the same from unsupported_attention_block_call), the
bound form checking its tensors then preparing its device, the layer check
composed of the three ops' own, and muse_decode.layer choosing the block or
falling back to the three ops with the reason. Stand-in tensors on cuda:63 (a
device no machine has): no GPU needed, nothing launched anywhere. The layer's
tests need PyTorch (skipped without it)."""

import re
import types

import pytest
from conftest import UNPREPARED, FakeTensor, fake_attn_layer

import muse_decode as md

D, BF16 = UNPREPARED, "bfloat16"
INT32 = r"must fit in int32 \[-2147483648, 2147483647\], got "
NOT_INT = "must be an integer, got "
KV_HEADS = r"num_kv_heads must be 2 or 4 \(TP8 or TP4\), got "
PREPARE = ("attention_block runs only on SM90 (H100/H200) or the SM100 family (B200/B300); found: "
           + md._C.describe_device(UNPREPARED))
UNPREPARED_CALL = "attention_block on cuda:63 needs prepare_attention_block(63) first"

NAMES = ["AttentionBlock", "attention_block", "attention_block_splits", "attention_block_supports_kv_heads",
         "attention_block_workspace_bytes", "prepare_attention_block", "unsupported_attention_block",
         "unsupported_attention_block_call"]


def raises(call, message):
    """call() raises ValueError whose whole text matches the regex `message`."""
    with pytest.raises(ValueError, match="^" + message + "$"):
        call()


# ---- the arguments of good calls ----------------------------------------------------------

def tp_shape(kvh):
    """(N, K): the QKV projection's and o_proj's widths of a rank of kvh KV heads."""
    return 2 * 9 * kvh * 64, 8 * kvh * 64


def call_args(reqs=1, kvh=2, max_len=2048, win=0, **over):
    """A call of `reqs` requests at a rank of kvh KV heads, a deployment of
    max_len and window win, every tensor on cuda:63 and apart from the
    others; `over` replaces arguments."""
    n, k = tp_shape(kvh)
    t = 8 * reqs
    pages = -(-max_len // 16)
    args = dict(x=FakeTensor([t, 8192], BF16, ptr=0x100000, device=D),
                qkv_weight=FakeTensor([n, 8192], BF16, ptr=0x10000000, device=D),
                positions=FakeTensor([t], "int64", ptr=0x200000, device=D),
                cos_sin=FakeTensor([max_len, 64], "float32", ptr=0x300000, device=D),
                slot_mapping=FakeTensor([t], "int64", ptr=0x2000000, device=D),
                kv_cache=FakeTensor([reqs * pages, kvh, 16, 128], BF16, ptr=0x100000000, device=D),
                num_kv_heads=kvh,
                block_table=FakeTensor([reqs, pages], "int32", ptr=0x80000000, device=D),
                seq_lens=FakeTensor([reqs], "int32", ptr=0x90000000, device=D),
                max_model_len=max_len, window=win,
                o_proj_weight=FakeTensor([8192, k], BF16, ptr=0x40000000, device=D),
                out=FakeTensor([t, 8192], BF16, ptr=0x60000000, device=D),
                workspace=FakeTensor([md.attention_block_workspace_bytes(reqs, kvh, max_len, win)], "uint8",
                                     ptr=0xA0000000, device=D))
    args.update(over)
    return args


BOUND = ("qkv_weight", "cos_sin", "kv_cache", "num_kv_heads", "o_proj_weight", "max_model_len", "window",
         "workspace")
STEP = ("x", "positions", "slot_mapping", "block_table", "seq_lens", "out")


def bound_args(**over):
    args = call_args()
    return {k: args[k] for k in BOUND} | over


def block_layer(kvh=2, device=0, **over):
    """A Muse Spark attention layer of a rank of kvh KV heads as the three
    ops' checks and unsupported_attention_block read it, its tensors stand-ins
    on `device`; keys "qkv_proj.<attr>", "o_proj.<attr>" and
    "rotary_emb.<attr>" replace the parts' attributes."""
    n, k = tp_shape(kvh)
    layer = fake_attn_layer(num_heads=8 * kvh, num_kv_heads=kvh)
    layer.qkv_proj = types.SimpleNamespace(weight=FakeTensor([n, 8192], BF16, ptr=0x10000000, device=device),
                                           bias=None, quant_method=None, gather_output=False, tp_size=16 // kvh)
    layer.o_proj = types.SimpleNamespace(weight=FakeTensor([8192, k], BF16, ptr=0x40000000, device=device), bias=None,
                                         quant_method=None, input_is_parallel=True, tp_size=16 // kvh)
    layer.rotary_emb = types.SimpleNamespace(rotary_dim=64, is_neox_style=False,
                                             cos_sin_cache=FakeTensor([32768, 64], "float32", ptr=0x300000,
                                                                      device=device))
    layer.use_rope, layer.sliding_window, layer.max_model_len = True, 2048, 32768
    for key, value in over.items():
        part, _, name = key.rpartition(".")
        setattr(getattr(layer, part) if part else layer, name, value)
    return layer


def call_check(**over):
    """The reason of unsupported_attention_block_call; attention_block raises
    the same text (or, with good arguments on cuda:63, that the device needs
    prepare_attention_block)."""
    args = call_args(**over)
    reason = md.unsupported_attention_block_call(**args)
    with pytest.raises(ValueError) as e:
        md.attention_block(**args)
    assert str(e.value) == (reason or UNPREPARED_CALL)
    return reason


# ---- names and signatures -----------------------------------------------------------------

def test_names_are_exported_from_the_op_named_module():
    import importlib

    module = importlib.import_module("muse_decode._attention_block")
    for name in NAMES:
        assert name in md.__all__ and callable(getattr(md, name)), name
        assert getattr(module, name) is getattr(md, name), name


def test_arguments_come_in_the_order_of_the_cpp_args():
    """AttentionBlockArgs' order, as every op's Python function takes its
    args struct's; no pdl (one cooperative launch)."""
    order = ["x", "qkv_weight", "positions", "cos_sin", "slot_mapping", "kv_cache", "num_kv_heads", "block_table",
             "seq_lens", "max_model_len", "window", "o_proj_weight", "out", "workspace"]
    for f in (md.attention_block, md.unsupported_attention_block_call):
        head = f.__doc__.splitlines()[0]
        assert re.findall(r"(\w+): ", head) == order, head
        assert "pdl" not in head
    assert "out: torch.Tensor | None = None, workspace: torch.Tensor | None = None" in (
        md.unsupported_attention_block_call.__doc__.splitlines()[0])
    assert re.findall(r"(\w+): ", md.AttentionBlock.__init__.__doc__.splitlines()[0]) == list(BOUND)
    assert re.findall(r"(\w+): ", md.AttentionBlock.__call__.__doc__.splitlines()[0]) == list(STEP)
    assert md.AttentionBlock.__call__.__doc__.splitlines()[0].endswith("-> torch.Tensor")


def test_the_package_docs_name_the_block():
    assert "attention_block" in md.__doc__ and "AttentionBlock" in md.__doc__
    for name in NAMES:
        assert "SPEC" not in (getattr(md, name).__doc__ or ""), name


# ---- sizing --------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "args, splits",
    [
        ((1, 2, 32768, 0), 66),     # TP8, one request, full layer: 132 shares over 2 KV heads
        ((1, 2, 32768, 2048), 17),  # sliding 2048 at 32k: 2055 keys, 129 pages, 17 groups of 8
        ((1, 2, 131072, 0), 66),
        ((1, 2, 2048, 0), 16),      # 128 pages, 16 groups
        ((2, 2, 32768, 0), 33),
        ((8, 2, 131072, 0), 8),
        ((8, 4, 32768, 0), 4),      # TP4, 8 requests: 132 / 32
        ((1, 2, 8, 0), 1),          # one page
    ],
)
def test_splits(args, splits):
    assert md.attention_block_splits(*args) == splits


def test_kv_heads_it_serves():
    assert md.attention_block_supports_kv_heads(2) and md.attention_block_supports_kv_heads(4)
    for kvh in (-1, 0, 1, 3, 8, 16, 2**31 - 1):
        assert md.attention_block_supports_kv_heads(kvh) is False, kvh


def test_workspace_bytes():
    """The workspace holds at least the projection's and the attention's rows
    and the attention's partials, and exactly what a call checks for."""
    for reqs, kvh, max_len, window in [(1, 2, 32768, 0), (1, 2, 32768, 2048), (8, 2, 131072, 0), (3, 4, 4096, 0)]:
        nbytes = md.attention_block_workspace_bytes(reqs, kvh, max_len, window)
        n, k = tp_shape(kvh)
        splits = md.attention_block_splits(reqs, kvh, max_len, window)
        assert nbytes % 16 == 0
        assert nbytes >= 8 * reqs * (n + k) * 2 + reqs * kvh * splits * 64 * 66 * 4
        args = call_args(reqs, kvh, max_len, window)
        assert md.unsupported_attention_block_call(**args) is None
        short = FakeTensor([nbytes - 1], "uint8", ptr=0xA0000000, device=D)
        assert md.unsupported_attention_block_call(**{**args, "workspace": short}) == (
            f"workspace must be a contiguous 1-D buffer of at least {nbytes} bytes (attention_block_workspace_bytes("
            f"{reqs}, {kvh}, {max_len}, {window})), got [{nbytes - 1}] of uint8, {nbytes - 1} bytes")


@pytest.mark.parametrize("f", [md.attention_block_splits, md.attention_block_workspace_bytes])
@pytest.mark.parametrize(
    "args, message",
    [
        ((0, 2, 32768, 0), r"num_reqs must be in \[1, 8\], got 0"),
        ((9, 2, 32768, 0), r"num_reqs must be in \[1, 8\], got 9"),
        ((-1, 2, 32768, 0), r"num_reqs must be in \[1, 8\], got -1"),
        ((1, 16, 32768, 0), KV_HEADS + "16"),
        ((1, 3, 32768, 0), KV_HEADS + "3"),
        ((1, 0, 32768, 0), KV_HEADS + "0"),
        ((1, 2, 7, 0), "max_model_len must be at least 8, got 7"),
        ((1, 2, 32768, -1), r"window must be 0 or in \[1, max_model_len\) \(see attn2_window\), got -1"),
        ((1, 2, 2048, 2048), r"window must be 0 or in \[1, max_model_len\) \(see attn2_window\), got 2048"),
        ((2**31, 2, 32768, 0), "num_reqs " + INT32 + "2147483648"),
        ((1, 2**40, 32768, 0), "num_kv_heads " + INT32 + "1099511627776"),
        ((1, 2, -(2**31) - 1, 0), "max_model_len " + INT32 + "-2147483649"),
        (("1", 2, 32768, 0), "num_reqs " + NOT_INT + "str"),
        ((1, 2.0, 32768, 0), "num_kv_heads " + NOT_INT + "float"),
        ((1, 2, None, 0), "max_model_len " + NOT_INT + "NoneType"),
        ((1, 2, 32768, None), "window " + NOT_INT + "NoneType"),
    ],
)
def test_sizing_refusals(f, args, message):
    raises(lambda: f(*args), message)


@pytest.mark.parametrize("kvh, message", [(None, NOT_INT + "NoneType"), ("2", NOT_INT + "str"),
                                          (2**31, INT32 + "2147483648")])
def test_supports_kv_heads_refuses_what_is_not_an_int32(kvh, message):
    raises(lambda: md.attention_block_supports_kv_heads(kvh), "num_kv_heads " + message)


# ---- the op and its call check --------------------------------------------------------------

@pytest.mark.parametrize("reqs", [1, 2, 5, 8])
@pytest.mark.parametrize("kvh", [2, 4])
def test_good_calls_reach_the_device_check(reqs, kvh):
    assert call_check(reqs=reqs, kvh=kvh) is None
    assert call_check(reqs=reqs, kvh=kvh, max_len=32768, win=2048) is None
    assert call_check(reqs=reqs, kvh=kvh, cos_sin=None) is None  # a layer without RoPE


def test_without_out_and_workspace_the_check_of_everything_else():
    args = call_args(out=None, workspace=None)
    assert md.unsupported_attention_block_call(**args) is None
    a = call_args()
    assert md.unsupported_attention_block_call(*(a[k] for k in list(a)[:-2])) is None  # their defaults
    raises(lambda: md.attention_block(**args), r"out is missing \(null data\)")
    raises(lambda: md.attention_block(**call_args(workspace=None)), r"workspace is missing \(null data\)")


@pytest.mark.parametrize(
    "over, reason",
    [
        (dict(x=FakeTensor([12, 8192], BF16, ptr=0x100000, device=D)),
         "x must be [R*8, 8192] with 1 <= R <= 8 (8 rows per request), got [12, 8192]"),
        (dict(x=FakeTensor([72, 8192], BF16, ptr=0x100000, device=D)),
         "x must be [R*8, 8192] with 1 <= R <= 8 (8 rows per request), got [72, 8192]"),
        (dict(x=FakeTensor([8, 8192], "float32", ptr=0x100000, device=D)), "x must be bfloat16, got float32"),
        (dict(x=FakeTensor([8, 8192], BF16, ptr=0x100000, device=-1)), "x must be on a CUDA device, got host memory"),
        (dict(num_kv_heads=16), "num_kv_heads must be 2 or 4 (TP8 or TP4), got 16"),
        (dict(num_kv_heads=4), None),  # the tensors then are TP8's: the weight says so
        (dict(max_model_len=4), "max_model_len must be at least 8, got 4"),
        (dict(window=2048), "window must be 0 or in [1, max_model_len) (see attn2_window), got 2048"),
        (dict(out=FakeTensor([8, 8192], BF16, ptr=0x100000, device=D)), "out and x must not overlap in memory"),
        (dict(out=FakeTensor([16, 8192], BF16, ptr=0x60000000, device=D)),
         "out must be [8, 8192] (rows of x, hidden size), got [16, 8192]"),
        (dict(seq_lens=FakeTensor([2], "int32", ptr=0x90000000, device=D)), "seq_lens .*"),
        (dict(o_proj_weight=FakeTensor([8192, 2048], BF16, ptr=0x40000000, device=D)), "o_proj_weight .*"),
        (dict(qkv_weight=FakeTensor([2300, 8192], BF16, ptr=0x10000000, device=D)), "qkv_weight .*"),
        (dict(kv_cache=FakeTensor([128, 4, 16, 128], BF16, ptr=0x100000000, device=D)), "kv_cache .*"),
        (dict(max_model_len=2**31), "max_model_len must fit in int32 [-2147483648, 2147483647], got 2147483648"),
    ],
)
def test_call_refusals(over, reason):
    got = call_check(**over)
    if over == dict(num_kv_heads=4):
        assert got is not None and got.startswith("qkv_weight "), got
    elif reason is None:
        assert got is None
    elif reason.endswith(".*"):
        assert got is not None and re.fullmatch(reason, got), got
    else:
        assert got == reason


@pytest.mark.parametrize("garbage", ["x", object(), [1, 2]], ids=["str", "object", "list"])
def test_every_argument_of_the_op(garbage):
    """Each argument in turn replaced by garbage: the why-not check returns a
    reason that starts with the argument's name, and the op raises it."""
    for name in call_args():
        args = call_args(**{name: garbage})
        reason = md.unsupported_attention_block_call(**args)
        assert isinstance(reason, str) and reason.startswith(name + " "), (name, reason)
        raises(lambda: md.attention_block(**args), re.escape(reason))


# ---- prepare and the bound form -------------------------------------------------------------

def test_prepare_refuses_a_device_the_kernel_cannot_run():
    with pytest.raises(ValueError) as e:
        md.prepare_attention_block(UNPREPARED)
    assert str(e.value) == PREPARE
    raises(lambda: md.prepare_attention_block(-2),
           r"device must be -1 \(the current device\) or an ordinal >= 0, got -2")
    raises(lambda: md.prepare_attention_block("0"), "device " + NOT_INT + "str")
    if not md.supported_gpu():
        with pytest.raises(ValueError, match=r"^attention_block runs only on SM90 .*; found: "):
            md.prepare_attention_block()


def test_bound_form_checks_its_tensors_then_prepares_its_device():
    with pytest.raises(ValueError) as e:
        md.AttentionBlock(**bound_args())
    assert str(e.value) == PREPARE
    with pytest.raises(ValueError) as e:
        md.AttentionBlock(*bound_args().values())  # positionally, in the documented order
    assert str(e.value) == PREPARE
    assert md.AttentionBlock.__init__.__doc__ and md.AttentionBlock.__doc__


@pytest.mark.parametrize(
    "over, message",
    [
        (dict(num_kv_heads=16), KV_HEADS + "16"),
        (dict(num_kv_heads="2"), "num_kv_heads " + NOT_INT + "str"),
        (dict(max_model_len=4), "max_model_len must be at least 8, got 4"),
        (dict(max_model_len=2**33), "max_model_len " + INT32 + "8589934592"),
        (dict(window=-1), r"window must be 0 or in \[1, max_model_len\) \(see attn2_window\), got -1"),
        (dict(window=None), "window " + NOT_INT + "NoneType"),
        (dict(qkv_weight=None), r"qkv_weight is missing \(null data\)"),
        (dict(qkv_weight="w"), r"qkv_weight must be a tensor \(no shape\)"),
        (dict(kv_cache=object()), r"kv_cache must be a tensor \(no shape\)"),
        (dict(o_proj_weight=FakeTensor([8192, 2048], BF16, ptr=0x40000000, device=D)), "o_proj_weight .*"),
        (dict(workspace=FakeTensor([16], "uint8", ptr=0xA0000000, device=D)),
         r"workspace must be a contiguous 1-D buffer of at least \d+ bytes \(attention_block_workspace_bytes\(1, 2, "
         r"2048, 0\)\), got \[16\] of uint8, 16 bytes"),
        (dict(workspace=None), r"workspace is missing \(null data\)"),
    ],
)
def test_bound_form_refusals(over, message):
    raises(lambda: md.AttentionBlock(**bound_args(**over)), message)


def test_bound_form_names_the_first_bad_argument():
    """Two bad arguments: the one that comes first is named."""
    raises(lambda: md.AttentionBlock(**bound_args(qkv_weight="w", workspace="w")),
           r"qkv_weight must be a tensor \(no shape\)")


# ---- the layer check -----------------------------------------------------------------------

def test_a_layer_it_serves():
    for kvh in (2, 4):
        assert md.unsupported_attention_block(block_layer(kvh)) is None
        assert md.unsupported_attention_block(block_layer(kvh), 131072, 8) is None
        assert md.unsupported_attention_block(block_layer(kvh, use_rope=False, rotary_emb=None,
                                                          sliding_window=None)) is None  # a full NoPE layer


@pytest.mark.parametrize(
    "layer, args, reason",
    [
        # The three ops' reasons, as their own checks give them.
        (dict(**{"qkv_proj.quant_method": object()}), (), "a quantized QKV projection.*"),
        (dict(head_dim=128), (), "head_dim 128.*"),
        (dict(use_o_gate=False), (), "the layer has no o-norm with a sigmoid o-gate"),
        (dict(**{"o_proj.bias": FakeTensor([8192], BF16, ptr=0x500)}), (), "an output projection with a bias.*"),
        (dict(**{"qkv_proj.weight": FakeTensor([2304, 8192], BF16, ptr=0x10000000, device=-1)}), (),
         "a QKV weight in host memory"),
        # The block's own.
        (dict(), (32768, 9), re.escape("max_reqs 9 (the block serves 1 to 8 requests)")),
        (dict(), (32768, 0), re.escape("max_reqs 0 (the block serves 1 to 8 requests)")),
        (dict(), (4, 1), "max_model_len 4.*"),
        (dict(sliding_window=0), (), re.escape("sliding_window must be at least 1 (or none), got 0")),
        (dict(sliding_window="2048"), (), "layer.sliding_window " + NOT_INT + "str"),
        (dict(), (True, 1), "max_model_len " + NOT_INT + "True"),
        (dict(), (32768, "8"), "max_reqs " + NOT_INT + "str"),
        (dict(max_model_len=None), (), "max_model_len " + NOT_INT + "NoneType"),
    ],
)
def test_layer_refusals(layer, args, reason):
    got = md.unsupported_attention_block(block_layer(**layer), *args)
    assert isinstance(got, str) and re.fullmatch(reason, got), got


@pytest.mark.parametrize("kvh", [1, 8, 16])
def test_a_rank_of_kv_heads_it_does_not_serve(kvh):
    """The three ops serve TP16, TP2 and TP1 ranks; the block says why not."""
    layer = block_layer(kvh)
    assert md.unsupported_projection(layer) is None and md.unsupported_attn2(layer) is None
    assert md.unsupported_o_proj(layer) is None
    assert md.unsupported_attention_block(layer) == f"{kvh} KV heads per rank (the block serves 2 or 4: TP8 or TP4)"


def test_the_layer_check_answers_any_object():
    for garbage in (None, 3, "x", object(), types.SimpleNamespace()):
        assert md.unsupported_attention_block(garbage) == "attn has no attribute 'qkv_proj'"
    layer = block_layer()
    del layer.max_model_len
    assert md.unsupported_attention_block(layer) == "layer has no attribute 'max_model_len'"
    assert md.unsupported_attention_block(layer, 32768) is None  # given, it need not be the layer's
    layer = block_layer()
    del layer.sliding_window  # a layer without one: full attention
    assert md.unsupported_attention_block(layer) is None

    class Unloaded(types.SimpleNamespace):
        @property
        def sliding_window(self):
            raise RuntimeError("not loaded")

    layer = Unloaded(**vars(block_layer()))
    assert md.unsupported_attention_block(layer) == "layer.sliding_window cannot be read: RuntimeError: not loaded"


# ---- muse_decode.layer ----------------------------------------------------------------------

def stand_in_tensors(layer):
    """The layer's weights, rotary table and expert bias replaced by
    stand-ins of the same shapes on cuda:0, so that the checks read them as a
    GPU layer's."""
    layer.qkv_proj.weight = FakeTensor(list(layer.qkv_proj.weight.shape), BF16, ptr=0x10000000)
    layer.o_proj.weight = FakeTensor(list(layer.o_proj.weight.shape), BF16, ptr=0x80000000)
    if layer.rotary_emb is not None:
        layer.rotary_emb.cos_sin_cache = FakeTensor(list(layer.rotary_emb.cos_sin_cache.shape), "float32",
                                                    ptr=0x300000)
    layer.router.expert_bias = FakeTensor([256], ptr=0x10000)
    return layer


def test_the_layer_takes_the_block_where_it_serves(monkeypatch):
    torch = pytest.importorskip("torch")  # noqa: F841
    from muse_decode import layer as L

    monkeypatch.setattr(L, "supported_gpu", lambda device=-1: True)
    for layer_idx in (0, 1):  # a sliding RoPE layer, a full NoPE layer
        layer = stand_in_tensors(L.MuseSparkAttentionRouting(layer_idx, max_model_len=4096, tp_size=8))
        assert layer.unsupported() is None and layer.unsupported_block(1) is None
        assert layer.plan(8, 1, "cuda:0") == L.Plan(True, True, True, True, block=True)
        assert layer.plan(64, 8, "cuda:0") == L.Plan(False, True, True, False, block=True)
    layer = stand_in_tensors(L.MuseSparkAttentionRouting(0, max_model_len=4096, tp_size=4))
    assert layer.plan(8, 1, "cuda:0").block


@pytest.mark.parametrize("tp_size, kvh", [(1, 16), (2, 8)])
def test_the_layer_falls_back_with_the_reason(monkeypatch, tp_size, kvh):
    torch = pytest.importorskip("torch")  # noqa: F841
    from muse_decode import layer as L

    monkeypatch.setattr(L, "supported_gpu", lambda device=-1: True)
    layer = stand_in_tensors(L.MuseSparkAttentionRouting(0, max_model_len=4096, tp_size=tp_size))
    assert layer.num_kv_heads == kvh and layer.unsupported() is None
    why = f"{kvh} KV heads per rank (the block serves 2 or 4: TP8 or TP4)"
    assert layer.unsupported_block(1) == why
    assert layer.plan(8, 1, "cuda:0") == L.Plan(True, True, True, True, block_reason=why)


def test_the_layer_says_which_path_its_step_took():
    torch = pytest.importorskip("torch")
    from muse_decode import layer as L

    layer = L.MuseSparkAttentionRouting(0, max_model_len=128, tp_size=8)
    assert layer.attention_path is None and layer.block_reason == "prepare() has not run"
    cache = L.paged_cache(32, 2)
    x, pos, slots, table, lens = L.verify_step_inputs([70], 128, 32)
    step = layer(x, pos, slots, cache, table, lens, layer.new_metadata())
    assert layer.attention_path == L.AttentionPath("three ops", "not an SM90/SM100 GPU")
    assert step.qkv is not None and step.attn is not None
    # A plan for the block whose call the block refuses (host tensors here): the three ops, with the reason.
    layer._fused_ready, layer._bind = True, lambda kv_cache: None
    layer._block, layer.block_ws = object(), torch.zeros(16, dtype=torch.uint8)
    cache_b = L.paged_cache(32, 2)
    stock = layer(x, pos, slots, cache, table, lens, layer.new_metadata(), L.Plan(False, False, False, False, "f"))
    fell_back = layer(x, pos, slots, cache_b, table, lens, layer.new_metadata(),
                      L.Plan(False, False, False, False, block=True))
    assert layer.attention_path == L.AttentionPath("three ops", "x must be on a CUDA device, got host memory")
    assert torch.equal(fell_back.hidden, stock.hidden) and torch.equal(cache_b, cache)
    layer._block = None  # prepare() left the block out: it says why
    layer.block_reason = "16 KV heads per rank (the block serves 2 or 4: TP8 or TP4)"
    layer(x, pos, slots, cache_b, table, lens, layer.new_metadata(), L.Plan(False, False, False, False, block=True))
    assert layer.attention_path == L.AttentionPath(
        "three ops", "attention_block is not prepared for this layer: 16 KV heads per rank (the block serves 2 or 4: "
        "TP8 or TP4)")


def test_the_torch_library_op_is_registered():
    torch = pytest.importorskip("torch")
    import muse_decode.torch_ops  # noqa: F401
    from torch._subclasses.fake_tensor import FakeTensorMode

    schema = str(torch.ops.muse_decode.attention_block.default._schema)
    for written in ("kv_cache", "out", "workspace"):
        assert re.search(rf"Tensor\(\w+!\) {written}\b", schema), (written, schema)
    assert not re.search(r"Tensor\(\w+!\) x\b", schema), schema
    a = {k: v for k, v in call_args().items()}
    with FakeTensorMode():
        shapes = {k: (torch.empty(v.shape, dtype=getattr(torch, str(v.dtype)[6:])) if isinstance(v, FakeTensor) else v)
                  for k, v in a.items()}
        assert torch.ops.muse_decode.attention_block(*shapes.values()) is None
