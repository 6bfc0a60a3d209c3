"""CPU tests of the Python package: names and aliases, sizing, the router
check's every reason, each op's argument checks (ValueError with exact text,
the same from unsupported_<op>_call), the ops and bound forms refusing a
device not prepared, prepare_<op> refusing a device the kernels cannot run,
and integer arguments outside int32, with stand-in tensors: no GPU and no
PyTorch needed. Every call that passes its checks is on cuda:63, a device no
machine has, so nothing here can launch a kernel on a GPU machine either."""

import types

import pytest
from conftest import UNPREPARED, FakeTensor, fake_attn_layer, fake_router

import muse_decode as md


SEED_NAMES = [  # every name of the seed's module (shared/reference/seed-cute_ops.txt)
    "MuseRouting", "RoutingMetadata", "attn2_splits", "attn2_window", "attn2_workspace_bytes", "sm100_family",
    "split_qkv", "supports_call", "unavailable", "unsupported_attn2", "unsupported_projection", "unsupported_router",
]
SPEC_NAMES = [  # the contract's list of Python names beyond the seed's (docs/contract.md)
    "attn2", "prepare_attn2", "launch_qkv_front", "fold_router_output_multiplier", "metadata_size", "gpu_family",
]
OP_NAMES = [  # the API shape every op shares, by op
    "route", "unsupported_route_call", "prepare_route", "MuseRouting",
    "attn2", "unsupported_attn2_call", "prepare_attn2", "Attn2",
    "qkv_front", "unsupported_qkv_front_call", "prepare_qkv_front", "QkvFront",
    "qkv_front_supports_call", "qkv_front_supports_shape", "qkv_front_workspace_bytes",
    "qkv_front_workspace_bytes_for_device",
    "o_proj", "unsupported_o_proj_call", "prepare_o_proj", "OProj", "unsupported_o_proj",
    "attention_block", "unsupported_attention_block_call", "prepare_attention_block", "AttentionBlock",
    "unsupported_attention_block", "attention_block_splits", "attention_block_workspace_bytes",
    "attention_block_supports_kv_heads",
]


def prepare_text(op):
    return (f"{op} runs only on SM90 (H100/H200) or the SM100 family (B200/B300); "
            f"found: {md._C.describe_device(UNPREPARED)}")


def test_seed_and_spec_names():
    for name in SEED_NAMES + SPEC_NAMES + OP_NAMES:
        assert callable(getattr(md, name, None)), name
        assert name in md.__all__, name


def test_seed_names_are_aliases_of_the_op_named_ones():
    assert md.launch_qkv_front is md.qkv_front  # the seed's name for the checked op
    assert md.supports_call is md.qkv_front_supports_call
    assert md.supports_shape is md.qkv_front_supports_shape
    assert not hasattr(md, "unsupported_call")  # unsupported_qkv_front_call names its op


def test_the_seed_names_say_they_are_qkv_fronts():
    """supports_call, supports_shape and launch_qkv_front are qkv_front's: the
    objects' docstrings say so, and the documented names carry the op's."""
    for seed, documented in [("supports_call", "qkv_front_supports_call"),
                             ("supports_shape", "qkv_front_supports_shape"), ("launch_qkv_front", "qkv_front")]:
        doc = getattr(md, seed).__doc__
        assert doc.splitlines()[0].startswith(documented + "("), doc
        assert "qkv_front" in doc.split("\n\n", 1)[1] and seed in doc, doc
        assert documented in md.__all__ and seed in md.__all__
    assert "launch_qkv_front" in md.__doc__ and "supports_call" in md.__doc__ and "supports_shape" in md.__doc__


def test_docstrings_say_the_thing_itself():
    """No docstring of the package cites a SPEC section (the SPEC is not part
    of the repository)."""
    import importlib

    modules = [md] + [importlib.import_module("muse_decode." + name) for name in
                      ("_route", "_attn2", "_qkv_front", "_o_proj", "_attention_block", "constants", "platform")]
    docs = [m.__doc__ for m in modules] + [getattr(md, name).__doc__ for name in md.__all__]
    docs += [f.__doc__ for f in [md.MuseRouting.__call__, md.Attn2.__call__, md.QkvFront.__call__,
                                 md.AttentionBlock.__call__, md.RoutingMetadata.fields]]
    for doc in filter(None, docs):
        assert "SPEC" not in doc, doc


def test_each_op_has_a_module_named_after_it():
    """The wrappers live in private modules named after the ops; the package
    namespace is the API, and the seed's names are importable from it."""
    import importlib

    for op in ("route", "attn2", "qkv_front", "o_proj", "attention_block"):
        module = importlib.import_module("muse_decode._" + op)
        assert getattr(module, op) is getattr(md, op)
    for name in ("MuseRouting", "RoutingMetadata", "metadata_size", "attn2", "prepare_attn2", "attn2_splits",
                 "attn2_window", "attn2_workspace_bytes", "split_qkv", "supports_call", "launch_qkv_front",
                 "unavailable", "unsupported_attn2", "unsupported_projection", "unsupported_router",
                 "fold_router_output_multiplier"):
        assert name in md.__all__ and hasattr(md, name), name


def test_pdl_is_the_default_everywhere():
    for f in [md.route, md.attn2, md.qkv_front, md.MuseRouting.__call__, md.Attn2.__call__, md.QkvFront.__call__]:
        assert "pdl: bool = True" in f.__doc__.splitlines()[0], f.__doc__.splitlines()[0]


@pytest.mark.parametrize("op", ["route", "attn2", "qkv_front"])
def test_prepare_refuses_a_device_the_kernels_cannot_run(op):
    prepare = getattr(md, "prepare_" + op)
    with pytest.raises(ValueError) as e:
        prepare(UNPREPARED)
    assert str(e.value) == prepare_text(op)
    if not md._C.built_with_cuda():
        assert str(e.value) == (
            f"{op} runs only on SM90 (H100/H200) or the SM100 family (B200/B300); "
            "found: no CUDA device (this build has no CUDA kernels)"
        )
    with pytest.raises(ValueError) as e:
        prepare(device=UNPREPARED)
    assert str(e.value) == prepare_text(op)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: md.attn2_splits(2**40, 0, 2),
         r"max_model_len must fit in int32 \[-2147483648, 2147483647\], got 1099511627776"),
        (lambda: md.metadata_size(2.5), "tile_n must be an integer, got float"),
        (lambda: md.prepare_attn2(-(2**31) - 1),
         r"device must fit in int32 \[-2147483648, 2147483647\], got -2147483649"),
        (lambda: md.qkv_front_supports_shape(2304, 2**32),
         r"num_kv_heads must fit in int32 \[-2147483648, 2147483647\], got 4294967296"),
        (lambda: md.attn2_window(2**31, 2048),
         r"sliding_window must fit in int32 \[-2147483648, 2147483647\], got 2147483648"),
        (lambda: md.gpu_family("0"), "device must be an integer, got str"),
    ],
)
def test_integers_outside_int32_are_value_errors_naming_the_argument(call, message):
    with pytest.raises(ValueError, match="^" + message + "$"):
        call()


def test_names():
    for name in [
        "MuseRouting",
        "RoutingMetadata",
        "metadata_size",
        "unsupported_router",
        "fold_router_output_multiplier",
        "unavailable",
        "sm100_family",
        "gpu_family",
        "supported_gpu",
    ]:
        assert hasattr(md, name), name


def test_unavailable_and_family():
    assert md.unavailable("route") == "GPUs other than SM90 (H100/H200) or the SM100 family (B200/B300) (route)"
    assert md.gpu_family() in (None, "sm90", "sm100", "other")


@pytest.mark.parametrize("tile", [8, 16, 32, 64, 128, 256])
def test_metadata_size_and_fields(tile):
    assert md.metadata_size(tile) == 200 + 64 * tile + 1
    meta = md.RoutingMetadata(FakeTensor([md.metadata_size(tile)], "int32"), 96, 32, tile)
    for t in range(1, 9):
        f = meta.fields(t)
        assert list(f) == [
            "total_num_padded_tokens",
            "num_non_exiting_ctas",
            "expanded_idx_to_permuted_idx",
            "cta_idx_xy_to_batch_idx",
            "cta_idx_xy_to_mn_limit",
            "permuted_idx_to_token_idx",
        ]
        assert f["total_num_padded_tokens"] == (0, 1)
        assert f["num_non_exiting_ctas"] == (4, 5)
        assert f["expanded_idx_to_permuted_idx"] == (8, 8 + 8 * t)
        assert f["permuted_idx_to_token_idx"] == (200, 200 + 8 * t * tile + 1)
    with pytest.raises(ValueError, match=r"^num_tokens must be in \[1, 8\], got 9$"):
        meta.fields(9)


def test_metadata_size_refuses_tile_12():
    with pytest.raises(ValueError, match="^tile_n must be one of 8, 16, 32, 64, 128, 256, got 12$"):
        md.metadata_size(12)


@pytest.mark.parametrize(
    "over, reason",
    [
        ({}, None),
        (dict(router_score_normalization="softmax"), "softmax router scores (the kernel computes sigmoid scores)"),
        (dict(top_k=6), "top-6 of 256 experts (the kernel routes top-8 of 256)"),
        (dict(global_num_experts=384), "top-8 of 384 experts (the kernel routes top-8 of 256)"),
        (
            dict(router_output_multiplier=0.25),
            "router output multiplier 0.25 still to apply (fold it into the router weight first)",
        ),
        (dict(router_score_division_eps=1e-6), "router_score_division_eps 1e-06 (the kernel divides by sum + 1e-15)"),
        (dict(expert_bias=FakeTensor([256], "bfloat16")), "a bfloat16 expert bias (the kernel reads float32)"),
        (dict(expert_bias=FakeTensor([256], stride=[2])), "a non-contiguous expert bias"),
        (dict(expert_bias=FakeTensor([8, 32])), "an expert bias of shape [8, 32] (the kernel reads [256])"),
        (
            dict(expert_bias=FakeTensor([256], ptr=0x10008)),
            "an expert bias not 16-byte aligned (the kernel reads 16 bytes at a time)",
        ),
        (dict(expert_bias=FakeTensor([256], device=-1)), "an expert bias in host memory"),
    ],
)
def test_unsupported_router(over, reason):
    assert md.unsupported_router(fake_router(**over)) == reason
    if reason is not None:
        with pytest.raises(ValueError, match="^MuseRouting does not support "):
            md.MuseRouting(fake_router(**over))


def route_args(logits=None, ids=None, weights=None, meta=None, bias=None, device=0):
    return dict(
        logits=logits or FakeTensor([4, 256], ptr=0x20000, device=device),
        expert_bias=bias or FakeTensor([256], ptr=0x10000, device=device),
        route_scale=1.0,
        ids=ids or FakeTensor([4, 8], "int32", ptr=0x30000, device=device),
        weights=weights or FakeTensor([4, 8], ptr=0x40000, device=device),
        metadata=meta,
    )


def routing_check(**over):
    """The reason of unsupported_route_call; route raises the same text (or,
    with good arguments on cuda:63, that the device needs prepare_route)."""
    args = route_args(**over)
    reason = md.unsupported_route_call(**args)
    with pytest.raises(ValueError) as e:
        md.route(**args)
    if reason is None:
        assert str(e.value) == f"route on cuda:{args['logits'].get_device()} needs prepare_route(" \
                               f"{args['logits'].get_device()}) first"
    else:
        assert str(e.value) == reason
        raise ValueError(reason)


def good_meta(device=0, **over):
    args = dict(buffer=FakeTensor([md.metadata_size(64)], "int32", ptr=0x50000, device=device), local_expert_offset=0,
                num_local_experts=32, tile_n=64)
    args.update(over)
    return md.RoutingMetadata(**args)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(logits=FakeTensor([4, 256], "bfloat16", ptr=0x20000)), "logits must be float32, got bfloat16"),
        (dict(logits=FakeTensor([9, 256], ptr=0x20000)), r"logits must be \[b, 256\] with 1 <= b <= 8, got \[9, 256\]"),
        (dict(logits=FakeTensor([0, 256], ptr=0x20000)), r"logits must be \[b, 256\] with 1 <= b <= 8, got \[0, 256\]"),
        (dict(logits=FakeTensor([256], ptr=0x20000)), r"logits must be \[b, 256\] with 1 <= b <= 8, got \[256\]"),
        (
            dict(logits=FakeTensor([4, 256], ptr=0x20000, stride=[257, 1])),
            r"logits rows must be 16-byte aligned \(row stride a multiple of 4 elements, at least 256\), got row stride 257",
        ),
        (dict(logits=FakeTensor([4, 256], ptr=0x20004)), "logits must be 16-byte aligned, got address 0x20004"),
        (dict(logits=FakeTensor([4, 256], ptr=0x20000, device=-1)), "logits must be on a CUDA device, got host memory"),
        (dict(ids=FakeTensor([4, 8], "int64", ptr=0x30000)), "ids must be int32, got int64"),
        (
            dict(weights=FakeTensor([4, 16], ptr=0x40000)),
            r"weights must be a contiguous \[4, 8\] tensor \(b = the logits' rows\), got \[4, 16\]",
        ),
        (dict(weights=FakeTensor([4, 8], ptr=0x30010)), "ids and weights must not overlap in memory"),
        (dict(weights=FakeTensor([4, 8], ptr=0x10100)), "weights and expert_bias must not overlap in memory"),
        (dict(bias=FakeTensor([256], "bfloat16", ptr=0x10000)), "expert_bias must be float32, got bfloat16"),
        (dict(bias=FakeTensor([256], ptr=0x10000, device=1)),
         r"logits must be on cuda:1, got cuda:0"),
        (dict(meta=(FakeTensor([5000], "int32", ptr=0x50000), 0, 2**40, 64)),
         r"metadata.num_local_experts must fit in int32 \[-2147483648, 2147483647\], got 1099511627776"),
        (dict(meta=(FakeTensor([5000], "int32", ptr=0x50000), 0, 256)),
         r"metadata must be a RoutingMetadata \(buffer, local_expert_offset, num_local_experts, tile_n\) or None"),
        (dict(meta=good_meta(tile_n=12)), "metadata.tile_n must be one of 8, 16, 32, 64, 128, 256, got 12"),
        (
            dict(meta=good_meta(local_expert_offset=240, num_local_experts=32)),
            r"metadata.num_local_experts must be in \[1, 16\] \(offset 240 \+ count within 256 experts\), got 32",
        ),
        (
            dict(meta=good_meta(buffer=FakeTensor([64], "int32", ptr=0x50000))),
            "metadata.buffer must be at least 4297 int32 elements for tile_n 64, got 64",
        ),
        (
            dict(meta=good_meta(buffer=FakeTensor([5000], "int32", ptr=0x40000))),
            "metadata.buffer and weights must not overlap in memory",
        ),
        (
            dict(meta=good_meta(buffer=FakeTensor([5000], "float32", ptr=0x50000))),
            "metadata.buffer must be int32, got float32",
        ),
    ],
)
def test_routing_call_refusals(kwargs, message):
    with pytest.raises(ValueError, match="^" + message + "$"):
        routing_check(**kwargs)


def test_routing_call_accepts_good_arguments():
    d = UNPREPARED
    routing_check(device=d)
    routing_check(meta=good_meta(d), device=d)
    for b in range(1, 9):
        routing_check(logits=FakeTensor([b, 256], ptr=0x20000, device=d), ids=FakeTensor([b, 8], "int32", ptr=0x30000, device=d),
                      weights=FakeTensor([b, 8], ptr=0x40000, device=d), meta=good_meta(d), device=d)


def test_not_a_tensor():
    with pytest.raises(ValueError, match="^logits must be a tensor"):
        routing_check(logits=object())


def test_muse_routing_checks_the_router_then_prepares_its_device():
    with pytest.raises(ValueError, match="^MuseRouting does not support top-6 of 256 experts"):
        md.MuseRouting(fake_router(top_k=6, expert_bias=FakeTensor([256], ptr=0x10000, device=UNPREPARED)))
    with pytest.raises(ValueError) as e:
        md.MuseRouting(fake_router(expert_bias=FakeTensor([256], ptr=0x10000, device=UNPREPARED)))
    assert str(e.value) == prepare_text("route")


def test_front_names_and_shapes():
    for name in ["split_qkv", "supports_call", "supports_shape", "launch_qkv_front", "unsupported_projection",
                 "qkv_front_workspace_bytes", "prepare_qkv_front"]:
        assert hasattr(md, name), name
    assert md.qkv_front_supports_shape(2304, 2) and md.qkv_front_supports_shape(18432, 16)
    # The same sizes as C++'s: TP8 on 132 SMs, 36 tiles -> 256 bytes of counters, (36 + 131) partials of 4 KB.
    assert md.qkv_front_workspace_bytes(2, 132) == 256 + (36 + 131) * 4096
    with pytest.raises(ValueError) as e:
        md.qkv_front_workspace_bytes_for_device(2, UNPREPARED)
    assert str(e.value) == ("qkv_front_workspace_bytes_for_device needs a CUDA device to size for: "
                            f"{md._C.describe_device(UNPREPARED)}")
    assert not md.qkv_front_supports_shape(2304, 4) and not md.qkv_front_supports_shape(2300, 2)


def front_args(device=0, **over):
    args = dict(
        x=FakeTensor([8, 8192], "bfloat16", ptr=0x100000, device=device),
        weight=FakeTensor([2304, 8192], "bfloat16", ptr=0x10000000, device=device),
        positions=FakeTensor([8], "int64", ptr=0x200000, device=device),
        cos_sin=FakeTensor([4096, 64], "float32", ptr=0x300000, device=device),
        slot_mapping=FakeTensor([8], "int64", ptr=0x400000, device=device),
        kv_cache=FakeTensor([64, 2, 16, 128], "bfloat16", ptr=0x20000000, device=device),
        num_kv_heads=2,
        out=FakeTensor([8, 2304], "bfloat16", ptr=0x500000, device=device),
        workspace=FakeTensor([1 << 22], "uint8", ptr=0x30000000, device=device),
    )
    args.update(over)
    return args


def front_call(**over):
    """The reason of unsupported_qkv_front_call; qkv_front raises the same
    text (or, with good arguments on cuda:63, that the device needs
    prepare_qkv_front)."""
    args = front_args(**over)
    reason = md.unsupported_qkv_front_call(**args)
    assert md.qkv_front_supports_call(**args) == (reason is None)
    with pytest.raises(ValueError) as e:
        md.qkv_front(**args)
    device = args["x"].get_device() if hasattr(args["x"], "get_device") else 0
    assert str(e.value) == (reason or f"qkv_front on cuda:{device} needs prepare_qkv_front({device}) first")
    return reason


def test_front_call_reasons():
    assert front_call(device=UNPREPARED) is None
    assert front_call(device=UNPREPARED, cos_sin=None) is None  # a layer without RoPE
    assert front_call(x=FakeTensor([8, 8192], "float32", ptr=0x100000)) == "x must be bfloat16, got float32"
    assert front_call(x=FakeTensor([17, 8192], "bfloat16", ptr=0x100000)) == (
        "x must be [T, 8192] with 1 <= T <= 16, got [17, 8192]")
    assert front_call(cos_sin=FakeTensor([4096, 32], "float32", ptr=0x300000)) == (
        "cos_sin must be [max_pos, 64] with max_pos >= 1 (cos | sin), got [4096, 32]")
    assert front_call(weight=FakeTensor([2300, 8192], "bfloat16", ptr=0x10000000)) == (
        "weight must be [2304, 8192] for 2 KV heads, got [2300, 8192]")
    assert front_call(num_kv_heads=2**31) == (
        "num_kv_heads must fit in int32 [-2147483648, 2147483647], got 2147483648")
    assert front_call(workspace=FakeTensor([16], "uint8", ptr=0x30000000)).startswith(
        "workspace must be a contiguous 1-D buffer of at least ")
    # Without out and workspace, the check of everything else; the op needs both.
    args = front_args(device=UNPREPARED, out=None, workspace=None)
    assert md.unsupported_qkv_front_call(**args) is None and md.supports_call(**args)
    with pytest.raises(ValueError, match=r"^out is missing \(null data\)$"):
        md.qkv_front(**args)
    bad_out = front_args(out=FakeTensor([8, 2048], "bfloat16", ptr=0x500000), workspace=None)
    assert md.unsupported_qkv_front_call(**bad_out) == "out must be [8, 2304] (tokens of x, qkv width), got [8, 2048]"


def test_split_qkv_refuses_a_wrong_width():
    class T2:
        shape = (8, 2300)

        def dim(self):
            return 2

    with pytest.raises(ValueError, match=r"^qkv must be \[tokens, 2304\] for 2 KV heads, got \[8, 2300\]$"):
        md.split_qkv(T2(), 2)


@pytest.mark.parametrize(
    "over, reason",
    [
        ({}, None),
        (dict(use_o_gate=False), "the layer has no o-norm with a sigmoid o-gate"),
        (dict(head_dim=128), "head_dim 128 (the kernel has 64)"),
        (dict(num_heads=12), "12 query heads for 2 KV heads (the kernel has 8 per KV head)"),
        (dict(scaling=0.125), "softmax scale 0.125 (the kernel is built for 0.6841258107984375)"),
        (dict(rms_norm_eps=1e-6), "o-norm eps 1e-06 (the kernel is built for 1e-05)"),
    ],
)
def test_unsupported_attn2(over, reason):
    assert md.unsupported_attn2(fake_attn_layer(**over)) == reason


def test_attn2_sizing():
    assert md.attn2_window(None, 131072) == 0
    assert md.attn2_window(2048, 2048) == 0
    assert md.attn2_window(2048, 131072) == 2048
    with pytest.raises(ValueError):
        md.attn2_window(0, 131072)
    assert md.attn2_splits(2048, 0, 2) == 1
    assert md.attn2_splits(131072, 2048, 2) == 1
    assert md.attn2_splits(131072, 0, 2) > 1
    assert md.attn2_workspace_bytes(1, 2, md.attn2_splits(131072, 0, 2)) > 0


def attn2_args(device=0, **over):
    bf16 = "bfloat16"
    args = dict(
        q=FakeTensor((8, 1024), bf16, ptr=0x70000000, device=device, stride=(2304, 1)),
        gate=FakeTensor((8, 1024), bf16, ptr=0x70000000 + 2 * 1280, device=device, stride=(2304, 1)),
        kv_cache=FakeTensor((64, 2, 16, 128), bf16, ptr=0x20000000, device=device),
        block_table=FakeTensor((1, 128), "int32", ptr=0x80000000, device=device),
        seq_lens=FakeTensor((1,), "int32", ptr=0x90000000, device=device),
        out=FakeTensor((8, 1024), bf16, ptr=0x60000000, device=device),
        workspace=None,
        max_model_len=2048,
        window=0,
        num_splits=1,
    )
    args.update(over)
    return args


def test_attn2_call_reasons():
    """unsupported_attn2_call gives the text attn2 raises; good arguments on a
    device not prepared: attn2 says so."""
    cases = [
        (dict(device=UNPREPARED), None),
        (dict(q=FakeTensor((8, 1024), "float32", ptr=0x70000000)), "q must be bfloat16, got float32"),
        (dict(max_model_len=4), "max_model_len must be at least 8, got 4"),
        (dict(num_splits=2**33), r"num_splits must fit in int32 [-2147483648, 2147483647], got 8589934592"),
        (dict(num_splits=7, max_model_len=131072, block_table=FakeTensor((1, 8192), "int32", ptr=0x80000000)),
         "workspace is missing (null data)"),
        (dict(out=FakeTensor((8, 1024), "bfloat16", ptr=0x70000000)), "out and q must not overlap in memory"),
    ]
    for over, reason in cases:
        args = attn2_args(**over)
        assert md.unsupported_attn2_call(**args) == reason, over
        with pytest.raises(ValueError) as e:
            md.attn2(**args)
        assert str(e.value) == (reason or "attn2 on cuda:63 needs prepare_attn2(63) first"), over


def test_bound_ops_check_their_tensors_then_prepare_their_device():
    """QkvFront and Attn2 check a layer's static tensors once (ValueError
    naming the one that is wrong) and prepare their device when built."""
    bf16, d = "bfloat16", UNPREPARED
    w = FakeTensor((2304, 8192), bf16, ptr=0x10000000, device=d)
    cache = FakeTensor((64, 2, 16, 128), bf16, ptr=0x20000000, device=d)
    ws = FakeTensor((1 << 22,), "uint8", ptr=0x30000000, device=d)
    with pytest.raises(ValueError, match="^weight must be a tensor"):
        md.QkvFront(object(), None, cache, 2, ws)
    with pytest.raises(ValueError, match=r"^num_kv_heads must be one of 1, 2, 4, 8, 16, got 3$"):
        md.QkvFront(w, None, cache, 3, ws)
    with pytest.raises(ValueError, match=r"^kv_cache must be bfloat16, got float32$"):
        md.QkvFront(w, None, FakeTensor((64, 2, 16, 128), ptr=0x20000000, device=d), 2, ws)
    with pytest.raises(ValueError) as e:
        md.QkvFront(w, None, cache, 2, ws)
    assert str(e.value) == prepare_text("qkv_front")
    with pytest.raises(ValueError, match="^max_model_len must be at least 8, got 4$"):
        md.Attn2(cache, None, 4, 0, 1)
    with pytest.raises(ValueError, match=r"^workspace is missing \(null data\)$"):
        md.Attn2(cache, None, 131072, 0, 7)
    with pytest.raises(ValueError) as e:
        md.Attn2(cache, None, 2048, 0, 1)
    assert str(e.value) == prepare_text("attn2")


def test_without_a_driver_every_prepare_says_no_driver_was_found():
    """On a machine with no NVIDIA driver at all (libcuda.so.1 does not load)
    a CUDA build's reason names the missing driver, where the CUDA runtime's
    own error would say the driver is too old."""
    import ctypes

    if not md._C.built_with_cuda():
        pytest.skip("this build has no CUDA kernels, so it never looks for a driver")
    try:
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("this machine has an NVIDIA driver (libcuda.so.1 loads)")
    except OSError:
        pass
    found = "no CUDA device (no NVIDIA driver found: the CUDA runtime could not load libcuda.so.1)"
    assert md._C.describe_device() == found
    for op in ["route", "attn2", "qkv_front", "o_proj", "attention_block"]:
        with pytest.raises(ValueError) as e:
            getattr(md, "prepare_" + op)()
        assert str(e.value) == f"{op} runs only on SM90 (H100/H200) or the SM100 family (B200/B300); found: {found}"


def test_the_package_summary_names_every_op():
    """pyproject.toml's description (pip show's summary) names each op the
    library has, as unavailable()'s refusal of an unknown name lists them."""
    import pathlib
    import re

    with pytest.raises(ValueError) as e:
        md.unavailable("?")
    ops = re.fullmatch(r"kernel must be one of (.*), got '\?'", str(e.value)).group(1).split(", ")
    assert len(ops) >= 4, ops
    pyproject = pathlib.Path(__file__).resolve().parents[2] / "pyproject.toml"
    description = re.search(r'^description = "(.*)"$', pyproject.read_text(), re.M).group(1)
    for op in ops:
        assert re.search(rf"\b{op}\b", description), (op, description)
