"""CPU tests of the Python package: names, sizing, the router check's every
reason, and the routing call's argument checks (ValueError with exact text),
with stand-in tensors: no GPU and no PyTorch needed."""

import types

import pytest
from conftest import FakeTensor

import muse_decode as md


def router(**over):
    r = types.SimpleNamespace(
        router_score_normalization="sigmoid",
        top_k=8,
        global_num_experts=256,
        router_output_multiplier=None,
        router_score_division_eps=1e-15,
        expert_bias=FakeTensor([256], ptr=0x10000),
        route_scale=1.0,
    )
    for k, v in over.items():
        setattr(r, k, v)
    return r


SEED_NAMES = [  # every name of the seed's module (shared/reference/seed-cute_ops.txt)
    "MuseRouting", "RoutingMetadata", "attn2_splits", "attn2_window", "attn2_workspace_bytes", "sm100_family",
    "split_qkv", "supports_call", "unavailable", "unsupported_attn2", "unsupported_projection", "unsupported_router",
]
SPEC_NAMES = [  # SPEC section 7's list beyond the seed's
    "attn2", "prepare_attn2", "launch_qkv_front", "fold_router_output_multiplier", "metadata_size", "gpu_family",
]


def test_seed_and_spec_names():
    for name in SEED_NAMES + SPEC_NAMES:
        assert callable(getattr(md, name, None)), name
        assert name in md.__all__, name


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
    assert md.unsupported_router(router(**over)) == reason
    if reason is not None:
        with pytest.raises(ValueError, match="^MuseRouting does not support "):
            md.MuseRouting(router(**over))


def routing_check(logits=None, ids=None, weights=None, meta=None):
    r = md.MuseRouting(router())
    logits = logits or FakeTensor([4, 256], ptr=0x20000)
    ids = ids or FakeTensor([4, 8], "int32", ptr=0x30000)
    weights = weights or FakeTensor([4, 8], ptr=0x40000)
    if meta is None:
        r.check(logits, ids, weights)
    else:
        r.check(logits, ids, weights, meta.buffer, meta.local_expert_offset, meta.num_local_experts, meta.tile_n)


def good_meta(**over):
    args = dict(buffer=FakeTensor([md.metadata_size(64)], "int32", ptr=0x50000), local_expert_offset=0,
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
    routing_check()
    routing_check(meta=good_meta())
    for b in range(1, 9):
        routing_check(FakeTensor([b, 256], ptr=0x20000), FakeTensor([b, 8], "int32", ptr=0x30000),
                      FakeTensor([b, 8], ptr=0x40000), good_meta())


def test_not_a_tensor():
    with pytest.raises(ValueError, match="^logits must be a tensor"):
        routing_check(logits=object())


def test_front_names_and_shapes():
    for name in ["split_qkv", "supports_call", "supports_shape", "launch_qkv_front", "unsupported_projection",
                 "qkv_front_workspace_bytes", "prepare_qkv_front"]:
        assert hasattr(md, name), name
    assert md.supports_shape(2304, 2) and md.supports_shape(18432, 16)
    assert not md.supports_shape(2304, 4) and not md.supports_shape(2300, 2)


def front_call(**over):
    args = dict(
        x=FakeTensor([8, 8192], "bfloat16", ptr=0x100000),
        weight=FakeTensor([2304, 8192], "bfloat16", ptr=0x10000000),
        positions=FakeTensor([8], "int64", ptr=0x200000),
        cos_sin=FakeTensor([4096, 64], "float32", ptr=0x300000),
        slot_mapping=FakeTensor([8], "int64", ptr=0x400000),
        kv_cache=FakeTensor([64, 2, 16, 128], "bfloat16", ptr=0x20000000),
        num_kv_heads=2,
        out=FakeTensor([8, 2304], "bfloat16", ptr=0x500000),
    )
    args.update(over)
    return md.unsupported_call(args["x"], args["weight"], args["positions"], args["cos_sin"], args["slot_mapping"],
                               args["kv_cache"], args["num_kv_heads"], args["out"])


def test_front_call_reasons():
    # Without a GPU the last check (the GPU family) refuses even a good call.
    good = front_call()
    assert good is None or "GPU" in good or "SM90" in good
    assert front_call(x=FakeTensor([8, 8192], "float32", ptr=0x100000)).startswith("x must be")
    assert "x" in front_call(x=FakeTensor([17, 8192], "bfloat16", ptr=0x100000))
    assert "x" in front_call(x=FakeTensor([0, 8192], "bfloat16", ptr=0x100000))
    assert "cos_sin" in front_call(cos_sin=FakeTensor([4096, 32], "float32", ptr=0x300000))
    assert "weight" in front_call(weight=FakeTensor([2300, 8192], "bfloat16", ptr=0x10000000))


def test_split_qkv_refuses_a_wrong_width():
    class T2:
        shape = (8, 2300)

        def dim(self):
            return 2

    with pytest.raises(ValueError, match=r"^qkv must be \[tokens, 2304\] for 2 KV heads, got \[8, 2300\]$"):
        md.split_qkv(T2(), 2)


def attn_layer(**over):
    layer = types.SimpleNamespace(use_o_norm=True, use_o_gate=True, head_dim=64, num_heads=16, num_kv_heads=2,
                                  scaling=0.6841258107984375, rms_norm_eps=1e-5)
    for k, v in over.items():
        setattr(layer, k, v)
    return layer


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
    assert md.unsupported_attn2(attn_layer(**over)) == reason


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


def test_bound_ops_read_their_tensors_once_and_check_every_call():
    """QkvFront and Attn2 bind a layer's static tensors; a call with a bad
    per-call tensor is refused naming it, before any launch."""
    bf16 = "bfloat16"
    w = FakeTensor((2304, 8192), bf16, ptr=0x10000000)
    cache = FakeTensor((64, 2, 16, 128), bf16, ptr=0x20000000)
    ws = FakeTensor((1 << 20,), "uint8", ptr=0x30000000)
    front = md.QkvFront(w, None, cache, 2, ws)
    x = FakeTensor((8, 8192), "float32", ptr=0x40000000)
    pos = FakeTensor((8,), "int64", ptr=0x50000000)
    out = FakeTensor((8, 2304), bf16, ptr=0x60000000)
    with pytest.raises(ValueError, match="^x must be bfloat16, got float32$"):
        front(x, pos, pos, out)
    attn = md.Attn2(cache, ws, 2048, 0, 1)
    q = FakeTensor((8, 1024), "float32", ptr=0x70000000)
    table = FakeTensor((1, 128), "int32", ptr=0x80000000)
    lens = FakeTensor((1,), "int32", ptr=0x90000000)
    with pytest.raises(ValueError, match="^q must be bfloat16, got float32$"):
        attn(q, q, table, lens, out)
    with pytest.raises(ValueError, match="^weight must be a tensor"):
        md.QkvFront(object(), None, cache, 2, ws)
