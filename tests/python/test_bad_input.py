"""Bad input to every public function of the package, on the CPU (no GPU and
no PyTorch needed; stand-in tensors from conftest): each answers with a
ValueError whose message names the argument, the expected and the actual
value (integers out of range, beyond int32, of the wrong type, None, unknown
names), and the "why not" checks return their reason as text for any object
instead of raising. Calls that pass their checks stay on cuda:63, a device no
machine has, so nothing here launches a kernel on a GPU machine either."""

import re
import types

import pytest
from conftest import UNPREPARED, FakeTensor, fake_attn_layer, fake_router

import muse_decode as md

INT32 = r"must fit in int32 \[-2147483648, 2147483647\], got "
NOT_INT = "must be an integer, got "
KV_HEADS = r"num_kv_heads must be one of 1, 2, 4, 8, 16, got "
ATTN2_KV_HEADS = r"num_kv_heads must be in \[1, 16\], got "
DEVICE = r"device must be -1 \(the current device\) or an ordinal >= 0, got "


def raises(call, message):
    """call() raises ValueError whose whole text matches the regex `message`."""
    with pytest.raises(ValueError, match="^" + message + "$"):
        call()


# ---- sizing functions: every argument checked ---------------------------------------

@pytest.mark.parametrize(
    "args, message",
    [
        ((-5, 0, 2), "max_model_len must be at least 8, got -5"),
        ((0, 0, 2), "max_model_len must be at least 8, got 0"),
        ((7, 0, 2), "max_model_len must be at least 8, got 7"),
        ((32768, -1, 2), r"window must be 0 or in \[1, max_model_len\) \(see attn2_window\), got -1"),
        ((2048, 2048, 2), r"window must be 0 or in \[1, max_model_len\) \(see attn2_window\), got 2048"),
        ((32768, 0, 17), ATTN2_KV_HEADS + "17"),
        ((32768, 0, 0), ATTN2_KV_HEADS + "0"),
        ((32768, 0, -2), ATTN2_KV_HEADS + "-2"),
        ((32768, 0, 32), ATTN2_KV_HEADS + "32"),
        ((2048, 0, 17), ATTN2_KV_HEADS + "17"),  # the one-slice path checks it too
        ((2**31, 0, 2), "max_model_len " + INT32 + "2147483648"),
        ((32768, -(2**31) - 1, 2), "window " + INT32 + "-2147483649"),
        ((32768, 0, 2**64), "num_kv_heads " + INT32 + "18446744073709551616"),
        (("32768", 0, 2), "max_model_len " + NOT_INT + "str"),
        ((32768.0, 0, 2), "max_model_len " + NOT_INT + "float"),
        ((32768, None, 2), "window " + NOT_INT + "NoneType"),
        ((32768, 0, "2"), "num_kv_heads " + NOT_INT + "str"),
    ],
)
def test_attn2_splits(args, message):
    raises(lambda: md.attn2_splits(*args), message)


@pytest.mark.parametrize(
    "args, message",
    [
        ((2048, -5), "max_model_len must be at least 8, got -5"),
        ((None, 0), "max_model_len must be at least 8, got 0"),
        ((0, 2048), r"sliding_window must be at least 1 \(or none\), got 0"),
        ((-1, 2048), r"sliding_window must be at least 1 \(or none\), got -1"),
        ((2**31, 2048), "sliding_window " + INT32 + "2147483648"),
        ((2048, -(2**40)), "max_model_len " + INT32 + "-1099511627776"),
        (("2048", 4096), "sliding_window " + NOT_INT + "str"),
        ((2048, None), "max_model_len " + NOT_INT + "NoneType"),
        ((2048.5, 4096), "sliding_window " + NOT_INT + "float"),
    ],
)
def test_attn2_window(args, message):
    raises(lambda: md.attn2_window(*args), message)


@pytest.mark.parametrize(
    "args, message",
    [
        ((1, 17, 8), ATTN2_KV_HEADS + "17"),
        ((1, 17, 1), ATTN2_KV_HEADS + "17"),  # checked even where the answer would be 0
        ((1, 0, 8), ATTN2_KV_HEADS + "0"),
        ((0, 2, 4), r"num_reqs must be in \[1, 65535\], got 0"),
        ((-1, 2, 4), r"num_reqs must be in \[1, 65535\], got -1"),
        ((65536, 2, 4), r"num_reqs must be in \[1, 65535\], got 65536"),
        ((1, 2, 0), r"num_splits must be in \[1, 32\], got 0"),
        ((1, 2, 33), r"num_splits must be in \[1, 32\], got 33"),
        ((1, 2, -1), r"num_splits must be in \[1, 32\], got -1"),
        ((2**32, 2, 4), "num_reqs " + INT32 + "4294967296"),
        ((1, 2, 2**31), "num_splits " + INT32 + "2147483648"),
        ((1, "2", 4), "num_kv_heads " + NOT_INT + "str"),
        ((1, 2, None), "num_splits " + NOT_INT + "NoneType"),
        ((None, 2, 4), "num_reqs " + NOT_INT + "NoneType"),
    ],
)
def test_attn2_workspace_bytes(args, message):
    raises(lambda: md.attn2_workspace_bytes(*args), message)


@pytest.mark.parametrize(
    "tile_n, message",
    [
        (12, "tile_n must be one of 8, 16, 32, 64, 128, 256, got 12"),
        (0, "tile_n must be one of 8, 16, 32, 64, 128, 256, got 0"),
        (-8, "tile_n must be one of 8, 16, 32, 64, 128, 256, got -8"),
        (2**31, "tile_n " + INT32 + "2147483648"),
        ("128", "tile_n " + NOT_INT + "str"),
        (None, "tile_n " + NOT_INT + "NoneType"),
        (128.0, "tile_n " + NOT_INT + "float"),
    ],
)
def test_metadata_size(tile_n, message):
    raises(lambda: md.metadata_size(tile_n), message)


@pytest.mark.parametrize(
    "meta, num_tokens, message",
    [
        (md.RoutingMetadata(FakeTensor([5000], "int32")), 0, r"num_tokens must be in \[1, 8\], got 0"),
        (md.RoutingMetadata(FakeTensor([5000], "int32")), 9, r"num_tokens must be in \[1, 8\], got 9"),
        (md.RoutingMetadata(FakeTensor([5000], "int32")), -1, r"num_tokens must be in \[1, 8\], got -1"),
        (md.RoutingMetadata(FakeTensor([5000], "int32")), 2**40, "num_tokens " + INT32 + "1099511627776"),
        (md.RoutingMetadata(FakeTensor([5000], "int32")), "8", "num_tokens " + NOT_INT + "str"),
        (md.RoutingMetadata(FakeTensor([5000], "int32"), tile_n=12), 8,
         "tile_n must be one of 8, 16, 32, 64, 128, 256, got 12"),
        (md.RoutingMetadata(FakeTensor([5000], "int32"), tile_n=None), 8, "tile_n " + NOT_INT + "NoneType"),
        (md.RoutingMetadata(None), 8, "buffer must be an int32 tensor, got NoneType"),
        (md.RoutingMetadata(3), 8, "buffer must be an int32 tensor, got int"),
    ],
)
def test_metadata_fields(meta, num_tokens, message):
    raises(lambda: meta.fields(num_tokens), message)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: md.qkv_front_workspace_bytes(3, 132), KV_HEADS + "3"),
        (lambda: md.qkv_front_workspace_bytes(0, 132), KV_HEADS + "0"),
        (lambda: md.qkv_front_workspace_bytes(2, 0), "sm_count must be at least 1, got 0"),
        (lambda: md.qkv_front_workspace_bytes(2, -1), "sm_count must be at least 1, got -1"),
        (lambda: md.qkv_front_workspace_bytes(2, 2**31), "sm_count " + INT32 + "2147483648"),
        (lambda: md.qkv_front_workspace_bytes("2", 132), "num_kv_heads " + NOT_INT + "str"),
        (lambda: md.qkv_front_workspace_bytes_for_device(3, UNPREPARED), KV_HEADS + "3"),
        (lambda: md.qkv_front_workspace_bytes_for_device(2, -2), DEVICE + "-2"),
        (lambda: md.qkv_front_workspace_bytes_for_device(2, "0"), "device " + NOT_INT + "str"),
        (lambda: md.qkv_front_workspace_bytes_for_device(2, 2**31), "device " + INT32 + "2147483648"),
        (lambda: md.qkv_front_workspace_bytes_for_device(2, UNPREPARED),
         "qkv_front_workspace_bytes_for_device needs a CUDA device to size for: "
         + re.escape(md._C.describe_device(UNPREPARED))),
        (lambda: md.qkv_front_supports_shape("2304", 2), "n " + NOT_INT + "str"),
        (lambda: md.qkv_front_supports_shape(2304, None), "num_kv_heads " + NOT_INT + "NoneType"),
        (lambda: md.supports_shape(2**31, 2), "n " + INT32 + "2147483648"),
    ],
)
def test_qkv_front_sizing(call, message):
    raises(call, message)


def test_a_device_query_says_the_device_once():
    with pytest.raises(ValueError) as e:
        md.qkv_front_workspace_bytes_for_device(2, UNPREPARED)
    assert str(e.value).count("no CUDA device") <= 1, str(e.value)
    assert str(e.value).count("63") <= 1, str(e.value)


@pytest.mark.parametrize(
    "qkv, kvh, message",
    [
        (FakeTensor([8, 2304], "bfloat16"), 3, KV_HEADS + "3"),
        (FakeTensor([8, 2304], "bfloat16"), 0, KV_HEADS + "0"),
        (FakeTensor([8, 2304], "bfloat16"), "2", "num_kv_heads " + NOT_INT + "str"),
        (FakeTensor([8, 2304], "bfloat16"), 2**40, "num_kv_heads " + INT32 + "1099511627776"),
        (FakeTensor([8, 2300], "bfloat16"), 2, r"qkv must be \[tokens, 2304\] for 2 KV heads, got \[8, 2300\]"),
        (FakeTensor([2304], "bfloat16"), 2, r"qkv must be \[tokens, 2304\] for 2 KV heads, got \[2304\]"),
        (None, 2, "qkv must be a tensor, got NoneType"),
        ("qkv", 2, "qkv must be a tensor, got str"),
    ],
)
def test_split_qkv(qkv, kvh, message):
    raises(lambda: md.split_qkv(qkv, kvh), message)


# ---- the GPU and the devices ----------------------------------------------------------

@pytest.mark.parametrize("query", [md.gpu_family, md.sm90, md.sm100_family, md.supported_gpu, md._C.describe_device])
@pytest.mark.parametrize(
    "device, message",
    [(-2, DEVICE + "-2"), (-(2**31), DEVICE + "-2147483648"), (2**31, "device " + INT32 + "2147483648"),
     ("0", "device " + NOT_INT + "str"), (None, "device " + NOT_INT + "NoneType"),
     (1.5, "device " + NOT_INT + "float")],
)
def test_device_queries(query, device, message):
    raises(lambda: query(device), message)


@pytest.mark.parametrize("op", ["route", "attn2", "qkv_front", "attention_block"])
@pytest.mark.parametrize(
    "device, message",
    [(-2, DEVICE + "-2"), (2**31, "device " + INT32 + "2147483648"), ("0", "device " + NOT_INT + "str"),
     (None, "device " + NOT_INT + "NoneType")],
)
def test_prepare(op, device, message):
    raises(lambda: getattr(md, "prepare_" + op)(device), message)


@pytest.mark.parametrize("op", ["route", "attn2", "qkv_front", "attention_block"])
def test_prepare_names_the_op_once_and_says_what_it_found(op):
    """Without a GPU (here, or a device no machine has) every prepare_<op>
    says the same thing: the op once, the GPUs it runs on, what it found."""
    with pytest.raises(ValueError) as e:
        getattr(md, "prepare_" + op)(UNPREPARED)
    why = str(e.value)
    assert why == (f"{op} runs only on SM90 (H100/H200) or the SM100 family (B200/B300); "
                   f"found: {md._C.describe_device(UNPREPARED)}")
    assert len(re.findall(rf"\b{op}\b", why)) == 1, why
    if not md.supported_gpu():  # the current device, as prepare_<op>() takes it
        with pytest.raises(ValueError, match=rf"^{op} runs only on SM90 .*; found: "):
            getattr(md, "prepare_" + op)()


@pytest.mark.parametrize(
    "kernel, message",
    [
        ("bogus", "kernel must be one of route, attn2, qkv_front, o_proj, attention_block, got 'bogus'"),
        ("", "kernel must be one of route, attn2, qkv_front, o_proj, attention_block, got ''"),
        ("ATTN2", "kernel must be one of route, attn2, qkv_front, o_proj, attention_block, got 'ATTN2'"),
        (None, "kernel must be a string, got NoneType"),
        (3, "kernel must be a string, got int"),
        (object(), "kernel must be a string, got object"),
    ],
)
def test_unavailable_knows_its_kernels(kernel, message):
    raises(lambda: md.unavailable(kernel), message)


# ---- the router -----------------------------------------------------------------------

GARBAGE = [None, 3, "x", object(), types.SimpleNamespace(), [1, 2]]


@pytest.mark.parametrize("garbage", GARBAGE)
def test_why_not_checks_answer_any_object(garbage):
    assert md.unsupported_router(garbage) == "router has no attribute 'router_score_normalization'"
    assert md.unsupported_attn2(garbage) == "layer has no attribute 'use_o_norm'"
    assert md.unsupported_projection(garbage) == "attn has no attribute 'qkv_proj'"


class Raising:
    """An attribute value that cannot even be read as a truth value."""

    def __bool__(self):
        raise RuntimeError("no truth value")


@pytest.mark.parametrize(
    "over, reason",
    [
        (dict(expert_bias=None),
         re.escape("a router without an expert bias (the kernel selects by score + an fp32 [256] bias)")),
        (dict(expert_bias=3), re.escape("router.expert_bias must be a tensor (no shape)")),
        (dict(top_k="8"), "router.top_k " + NOT_INT + "str"),
        (dict(top_k=None), "router.top_k " + NOT_INT + "NoneType"),
        (dict(top_k=2**40), "router.top_k " + INT32 + "1099511627776"),
        (dict(global_num_experts=1.5), "router.global_num_experts " + NOT_INT + "float"),
        (dict(router_output_multiplier="0.25"), "router.router_output_multiplier must be a number, got str"),
        (dict(router_score_division_eps=None), "router.router_score_division_eps must be a number, got NoneType"),
        (dict(route_scale=None), "router.route_scale must be a number, got NoneType"),
        (dict(route_scale="1"), "router.route_scale must be a number, got str"),
        (dict(route_scale=10**400),
         "router.route_scale must be a number within the range of a double, got 1" + "0" * 400),
    ],
)
def test_router_attributes_that_do_not_read(over, reason):
    got = md.unsupported_router(fake_router(UNPREPARED, **over))  # text, never an exception
    assert isinstance(got, str) and re.fullmatch(reason, got), got
    # MuseRouting raises it: the translation's text as it is, a reason of the
    # router's values after "MuseRouting does not support".
    prefix = "MuseRouting does not support " if got.startswith("a router") else ""
    raises(lambda: md.MuseRouting(fake_router(UNPREPARED, **over)), re.escape(prefix + got))


class Unreadable:
    """A layer whose attribute's read raises (a failing property)."""

    @property
    def route_scale(self):
        raise RuntimeError("not loaded")

    @property
    def use_o_norm(self):
        raise KeyError("use_o_norm")

    @property
    def qkv_proj(self):
        raise RuntimeError("not loaded")


def test_an_attribute_whose_read_raises_is_a_reason():
    r = Unreadable()
    for name in ("router_score_normalization", "top_k", "global_num_experts", "router_output_multiplier",
                 "router_score_division_eps", "expert_bias"):
        setattr(r, name, getattr(fake_router(UNPREPARED), name))
    assert md.unsupported_router(r) == "router.route_scale cannot be read: RuntimeError: not loaded"
    raises(lambda: md.MuseRouting(r), re.escape("router.route_scale cannot be read: RuntimeError: not loaded"))
    assert md.unsupported_attn2(Unreadable()) == "layer.use_o_norm cannot be read: KeyError: 'use_o_norm'"
    assert md.unsupported_projection(Unreadable()) == "attn.qkv_proj cannot be read: RuntimeError: not loaded"


def test_a_router_missing_one_attribute():
    r = fake_router(UNPREPARED)
    del r.route_scale
    assert md.unsupported_router(r) == "router has no attribute 'route_scale'"
    raises(lambda: md.MuseRouting(r), "router has no attribute 'route_scale'")
    raises(lambda: md.MuseRouting(None), "router has no attribute 'router_score_normalization'")


@pytest.mark.parametrize(
    "r, message",
    [
        (None, "router has no attribute 'router_output_multiplier'"),
        (object(), "router has no attribute 'router_output_multiplier'"),
        (fake_router(UNPREPARED, router_output_multiplier="0.25"), "router.router_output_multiplier must be a number, got str"),
        (fake_router(UNPREPARED, router_output_multiplier=object()), "router.router_output_multiplier must be a number, got object"),
        (fake_router(UNPREPARED, router_output_multiplier=0.25), "router has no attribute 'weight'"),
        (fake_router(UNPREPARED, router_output_multiplier=0.25, weight=None), "router.weight must be a float32 tensor, got NoneType"),
        (fake_router(UNPREPARED, router_output_multiplier=0.25, weight=FakeTensor([256, 8192], "bfloat16")),
         "router.weight must be float32 to fold the multiplier exactly enough, got torch.bfloat16"),
    ],
)
def test_fold_router_output_multiplier(r, message):
    raises(lambda: md.fold_router_output_multiplier(r), message)


# ---- the layers' why-not checks -------------------------------------------------------

@pytest.mark.parametrize(
    "over, reason",
    [
        (dict(num_kv_heads=17, num_heads=136), re.escape("17 KV heads per rank (the kernel serves 1 to 16)")),
        (dict(num_kv_heads=0, num_heads=0), re.escape("0 KV heads per rank (the kernel serves 1 to 16)")),
        (dict(head_dim="64"), "layer.head_dim " + NOT_INT + "str"),
        (dict(num_heads=None), "layer.num_heads " + NOT_INT + "NoneType"),
        (dict(num_kv_heads=2**31), "layer.num_kv_heads " + INT32 + "2147483648"),
        (dict(scaling="0.68"), "layer.scaling must be a number, got str"),
        (dict(rms_norm_eps=None), "layer.rms_norm_eps must be a number, got NoneType"),
        (dict(use_o_norm=Raising()),
         r"layer.use_o_norm must have a truth value \(True or False\), got (test_bad_input\.)?Raising"),
    ],
)
def test_unsupported_attn2_reads_any_layer(over, reason):
    got = md.unsupported_attn2(fake_attn_layer(**over))
    assert re.fullmatch(reason, got), got


def test_unsupported_attn2_names_a_missing_attribute():
    layer = fake_attn_layer()
    del layer.rms_norm_eps
    assert md.unsupported_attn2(layer) == "layer has no attribute 'rms_norm_eps'"


def projection_layer(**over):
    proj = types.SimpleNamespace(weight=FakeTensor([2304, 8192], "bfloat16", ptr=0x10000000), bias=None,
                                 quant_method=None, gather_output=False, tp_size=8)
    emb = types.SimpleNamespace(rotary_dim=64, is_neox_style=False,
                                cos_sin_cache=FakeTensor([4096, 64], "float32", ptr=0x300000))
    attn = types.SimpleNamespace(qkv_proj=proj, num_heads=16, num_kv_heads=2, head_dim=64, use_rope=True,
                                 rotary_emb=emb)
    for k, v in over.items():
        target, name = (proj, k[5:]) if k.startswith("proj_") else (emb, k[4:]) if k.startswith("emb_") else (attn, k)
        setattr(target, name, v)
    return attn


@pytest.mark.parametrize(
    "over, reason",
    [
        ({}, None),
        (dict(qkv_proj=None), "no QKV weight"),
        (dict(num_heads="16"), "attn.num_heads " + NOT_INT + "str"),
        (dict(num_kv_heads=2**33), "attn.num_kv_heads " + INT32 + "8589934592"),
        (dict(head_dim=None), "attn.head_dim " + NOT_INT + "NoneType"),
        (dict(num_kv_heads=3, num_heads=24), r"3 KV heads per rank \(the front serves 1, 2, 4, 8 or 16\)"),
        (dict(proj_tp_size="8"), "attn.qkv_proj.tp_size " + NOT_INT + "str"),
        (dict(proj_weight=3), r"attn.qkv_proj.weight must be a tensor \(no shape\)"),
        (dict(proj_gather_output=Raising()),
         r"attn.qkv_proj.gather_output must have a truth value \(True or False\), got (test_bad_input\.)?Raising"),
        (dict(emb_rotary_dim=None), "attn.rotary_emb.rotary_dim " + NOT_INT + "NoneType"),
        (dict(emb_cos_sin_cache="table"), r"attn.rotary_emb.cos_sin_cache must be a tensor \(no shape\)"),
        (dict(rotary_emb=3), None),  # an object without the attributes: the defaults, so a table is missing
    ],
)
def test_unsupported_projection_reads_any_layer(over, reason):
    got = md.unsupported_projection(projection_layer(**over))
    if over == dict(rotary_emb=3):
        assert got == "a rotary embedding without a cos_sin table"
    elif reason is None:
        assert got is None
    else:
        assert isinstance(got, str) and re.fullmatch(reason, got), got


def test_unsupported_projection_names_a_missing_attribute():
    attn = projection_layer()
    del attn.head_dim
    assert md.unsupported_projection(attn) == "attn has no attribute 'head_dim'"


def o_proj_layer(**over):
    proj = types.SimpleNamespace(weight=FakeTensor([8192, 1024], "bfloat16", ptr=0x10000000), bias=None,
                                 quant_method=None, input_is_parallel=True, tp_size=8)
    attn = types.SimpleNamespace(o_proj=proj, num_heads=16, head_dim=64)
    for k, v in over.items():
        target, name = (proj, k[5:]) if k.startswith("proj_") else (attn, k)
        setattr(target, name, v)
    return attn


@pytest.mark.parametrize(
    "over, reason",
    [
        ({}, None),
        (dict(o_proj=None), "no output-projection weight"),
        (dict(num_heads="16"), "attn.num_heads " + NOT_INT + "str"),
        (dict(num_heads=12), re.escape("12 query heads per rank (o_proj serves 8, 16, 32, 64 or 128: K ") + ".*"),
        (dict(head_dim=128), re.escape("head_dim 128 (o_proj is built for 64)")),
        (dict(proj_bias=FakeTensor([8192], "bfloat16", ptr=0x500)), re.escape("an output projection with a bias") + ".*"),
        (dict(proj_quant_method=object()), "a quantized output projection.*"),
        (dict(proj_input_is_parallel=False), "an output projection whose input is not parallel over TP 8.*"),
        (dict(proj_weight=FakeTensor([8192, 1024], "float32", ptr=0x10000000)), "a float32 output-projection weight.*"),
        (dict(proj_weight=FakeTensor([1024, 8192], "bfloat16", ptr=0x10000000)),
         re.escape("an output-projection weight of shape [1024, 8192] (o_proj reads [8192, 1024] for 16 query heads)")),
        (dict(proj_weight="w"), "attn.o_proj.weight .*"),
    ],
)
def test_unsupported_o_proj_reads_any_layer(over, reason):
    got = md.unsupported_o_proj(o_proj_layer(**over))
    if reason is None:
        assert got is None
    else:
        assert isinstance(got, str) and re.fullmatch(reason, got), got


@pytest.mark.parametrize("garbage", [None, 3, "x", object()])
def test_unsupported_o_proj_answers_any_object(garbage):
    got = md.unsupported_o_proj(garbage)
    assert isinstance(got, str) and got.startswith("attn has no attribute"), got


# ---- the ops and their call checks ----------------------------------------------------

def route_call():
    d = UNPREPARED
    return dict(logits=FakeTensor([4, 256], ptr=0x20000, device=d),
                expert_bias=FakeTensor([256], ptr=0x10000, device=d), route_scale=1.0, ids=FakeTensor([4, 8], "int32", ptr=0x30000, device=d),
                weights=FakeTensor([4, 8], ptr=0x40000, device=d), metadata=None, pdl=True)


def attn2_call():
    d, bf16 = UNPREPARED, "bfloat16"
    return dict(q=FakeTensor((8, 1024), bf16, ptr=0x70000000, device=d, stride=(2304, 1)),
                gate=FakeTensor((8, 1024), bf16, ptr=0x70000000 + 2 * 1280, device=d, stride=(2304, 1)),
                kv_cache=FakeTensor((64, 2, 16, 128), bf16, ptr=0x20000000, device=d),
                block_table=FakeTensor((1, 128), "int32", ptr=0x80000000, device=d),
                seq_lens=FakeTensor((1,), "int32", ptr=0x90000000, device=d),
                out=FakeTensor((8, 1024), bf16, ptr=0x60000000, device=d), workspace=None, max_model_len=2048,
                window=0, num_splits=1, pdl=True)


def front_call():
    d = UNPREPARED
    return dict(x=FakeTensor([8, 8192], "bfloat16", ptr=0x100000, device=d),
                weight=FakeTensor([2304, 8192], "bfloat16", ptr=0x10000000, device=d),
                positions=FakeTensor([8], "int64", ptr=0x200000, device=d),
                cos_sin=FakeTensor([4096, 64], "float32", ptr=0x300000, device=d),
                slot_mapping=FakeTensor([8], "int64", ptr=0x400000, device=d),
                kv_cache=FakeTensor([64, 2, 16, 128], "bfloat16", ptr=0x20000000, device=d), num_kv_heads=2,
                out=FakeTensor([8, 2304], "bfloat16", ptr=0x500000, device=d),
                workspace=FakeTensor([1 << 22], "uint8", ptr=0x30000000, device=d), pdl=True)



def o_proj_call():
    d, bf16 = UNPREPARED, "bfloat16"
    return dict(x=FakeTensor((8, 1024), bf16, ptr=0x70000000, device=d),
                weight=FakeTensor((8192, 1024), bf16, ptr=0x10000000, device=d),
                out=FakeTensor((8, 8192), bf16, ptr=0x60000000, device=d), pdl=True)


OPS = [
    (md.route, md.unsupported_route_call, route_call, "route on cuda:63 needs prepare_route(63) first"),
    (md.attn2, md.unsupported_attn2_call, attn2_call, "attn2 on cuda:63 needs prepare_attn2(63) first"),
    (md.qkv_front, md.unsupported_qkv_front_call, front_call,
     "qkv_front on cuda:63 needs prepare_qkv_front(63) first"),
    (md.o_proj, md.unsupported_o_proj_call, o_proj_call, "o_proj on cuda:63 needs prepare_o_proj(63) first"),
]
OP_IDS = ["route", "attn2", "qkv_front", "o_proj"]
# Values no argument of any op accepts: not a tensor, an integer, a number, a
# switch or a RoutingMetadata.
CALL_GARBAGE = ["x", object(), [1, 2]]


@pytest.mark.parametrize("op, why_not, good, unprepared", OPS, ids=OP_IDS)
def test_good_calls_reach_the_device_check(op, why_not, good, unprepared):
    assert why_not(**good()) is None
    raises(lambda: op(**good()), re.escape(unprepared))


@pytest.mark.parametrize("garbage", CALL_GARBAGE, ids=["str", "object", "list"])
@pytest.mark.parametrize("op, why_not, good, unprepared", OPS, ids=OP_IDS)
def test_every_argument_of_every_op(op, why_not, good, unprepared, garbage):
    """Each argument in turn replaced by garbage: the why-not check returns a
    reason that starts with the argument's name, and the op raises it."""
    for name in good():
        args = good()
        args[name] = garbage
        reason = why_not(**args)
        assert isinstance(reason, str) and reason.startswith(name + " "), (name, reason)
        raises(lambda: op(**args), re.escape(reason))


@pytest.mark.parametrize("value", [2**31, -(2**31) - 1, 2**64])
@pytest.mark.parametrize(
    "good, name",
    [(attn2_call, "max_model_len"), (attn2_call, "window"), (attn2_call, "num_splits"),
     (front_call, "num_kv_heads")],
)
def test_integer_arguments_beyond_int32(good, name, value):
    args = good()
    args[name] = value
    op, why_not = {attn2_call: (md.attn2, md.unsupported_attn2_call),
                   front_call: (md.qkv_front, md.unsupported_qkv_front_call)}[good]
    message = f"{name} must fit in int32 [-2147483648, 2147483647], got {value}"
    assert why_not(**args) == message
    raises(lambda: op(**args), re.escape(message))


@pytest.mark.parametrize(
    "call, message",
    [
        (dict(pdl="no"), "pdl must be True or False, got str"),
        (dict(pdl=None), "pdl must be True or False, got NoneType"),
        (dict(pdl=2), "pdl must be True or False, got 2"),
        (dict(route_scale="1.0"), "route_scale must be a number, got str"),
        (dict(route_scale=None), "route_scale must be a number, got NoneType"),
        (dict(route_scale=float("nan")), "route_scale must be finite, got nan"),
        (dict(metadata=(FakeTensor([5000], "int32", ptr=0x50000, device=UNPREPARED), 0, 32)),
         r"metadata must be a RoutingMetadata \(buffer, local_expert_offset, num_local_experts, tile_n\) or None"),
        (dict(metadata=md.RoutingMetadata(FakeTensor([5000], "int32", ptr=0x50000, device=UNPREPARED), "0")),
         "metadata.local_expert_offset " + NOT_INT + "str"),
        (dict(metadata=md.RoutingMetadata(FakeTensor([5000], "int32", ptr=0x50000, device=UNPREPARED), 0, 2**31)),
         "metadata.num_local_experts " + INT32 + "2147483648"),
        (dict(metadata=md.RoutingMetadata(FakeTensor([5000], "int32", ptr=0x50000, device=UNPREPARED), -1)),
         r"metadata.local_expert_offset must be in \[0, 256\), got -1"),
        (dict(logits=None), r"logits is missing \(null data\)"),
    ],
)
def test_route_scalars(call, message):
    args = {**route_call(), **call}
    assert re.fullmatch(message, md.unsupported_route_call(**args))
    raises(lambda: md.route(**args), message)


def test_pdl_is_checked_by_every_op():
    for op, why_not, good in [(md.attn2, md.unsupported_attn2_call, attn2_call),
                              (md.qkv_front, md.unsupported_qkv_front_call, front_call),
                              (md.o_proj, md.unsupported_o_proj_call, o_proj_call)]:
        for pdl, shown in [("yes", "str"), (None, "NoneType"), (-1, "-1"), (1.0, "float")]:
            args = {**good(), "pdl": pdl}
            message = f"pdl must be True or False, got {shown}"
            assert why_not(**args) == message
            raises(lambda: op(**args), re.escape(message))
            assert md.qkv_front_supports_call(**{**front_call(), "pdl": pdl}) is False
    # 1 and 0 read as the switch they spell.
    assert md.unsupported_attn2_call(**{**attn2_call(), "pdl": 0}) is None


@pytest.mark.parametrize("garbage", [None, 3, "x", object()])
def test_qkv_front_supports_call_answers_any_object(garbage):
    args = front_call()
    for name in args:
        if name in ("cos_sin", "out", "workspace"):
            continue  # None is a valid value of these (no RoPE; the check without out and workspace)
        bad = {**args, name: garbage}
        assert md.qkv_front_supports_call(**bad) is False, name
        assert md.supports_call(**bad) is False, name


def test_qkv_front_refuses_kv_heads_it_does_not_serve():
    for kvh in (3, 0, -1, 32):
        args = {**front_call(), "num_kv_heads": kvh}
        assert md.unsupported_qkv_front_call(**args) == f"num_kv_heads must be one of 1, 2, 4, 8, 16, got {kvh}"


def test_attn2_refuses_a_cache_of_kv_heads_it_does_not_serve():
    args = {**attn2_call(), "kv_cache": FakeTensor((64, 17, 16, 128), "bfloat16", ptr=0x20000000, device=UNPREPARED)}
    message = "kv_cache KV heads must be in [1, 16], got 17"
    assert md.unsupported_attn2_call(**args) == message
    raises(lambda: md.attn2(**args), re.escape(message))


# ---- the bound forms ------------------------------------------------------------------

@pytest.mark.parametrize(
    "args, message",
    [
        (dict(max_model_len="2048"), "max_model_len " + NOT_INT + "str"),
        (dict(max_model_len=2**31), "max_model_len " + INT32 + "2147483648"),
        (dict(max_model_len=4), "max_model_len must be at least 8, got 4"),
        (dict(window=-1), r"window must be 0 or in \[1, max_model_len\) \(see attn2_window\), got -1"),
        (dict(window=None), "window " + NOT_INT + "NoneType"),
        (dict(num_splits=0), r"num_splits must be in \[1, 32\], got 0"),
        (dict(num_splits=33), r"num_splits must be in \[1, 32\], got 33"),
        (dict(kv_cache=FakeTensor((64, 17, 16, 128), "bfloat16", ptr=0x20000000, device=UNPREPARED)),
         r"kv_cache KV heads must be in \[1, 16\], got 17"),
        (dict(kv_cache="cache"), r"kv_cache must be a tensor \(no shape\)"),
    ],
)
def test_attn2_bound_form(args, message):
    a = dict(kv_cache=FakeTensor((64, 2, 16, 128), "bfloat16", ptr=0x20000000, device=UNPREPARED), workspace=None,
             max_model_len=2048, window=0, num_splits=1)
    a.update(args)
    raises(lambda: md.Attn2(**a), message)


@pytest.mark.parametrize(
    "args, message",
    [
        (dict(num_kv_heads=3), KV_HEADS + "3"),
        (dict(num_kv_heads="2"), "num_kv_heads " + NOT_INT + "str"),
        (dict(num_kv_heads=2**33), "num_kv_heads " + INT32 + "8589934592"),
        (dict(weight=None), r"weight is missing \(null data\)"),
        (dict(workspace=object()), r"workspace must be a tensor \(no shape\)"),
    ],
)
def test_qkv_front_bound_form(args, message):
    d = UNPREPARED
    a = dict(weight=FakeTensor((2304, 8192), "bfloat16", ptr=0x10000000, device=d), cos_sin=None,
             kv_cache=FakeTensor((64, 2, 16, 128), "bfloat16", ptr=0x20000000, device=d), num_kv_heads=2,
             workspace=FakeTensor((1 << 22,), "uint8", ptr=0x30000000, device=d))
    a.update(args)
    raises(lambda: md.QkvFront(**a), message)
