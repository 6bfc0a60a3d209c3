"""True and False in the place of every integer argument of every public
function of the package: each raises ValueError "<argument> must be an
integer, got True" (or False), and each "why not" check returns that text as
its reason. Python counts True as the integer 1, so without the check
attn2_window(True, 131072) would answer 1.

The functions and their integer arguments are read off the package itself
(muse_decode.__all__, the extension's functions, the signatures' `int`
annotations, the layer objects' integer attributes as the extension reads
them), and the table below must cover each one: an integer argument added
later without a case here fails test_every_integer_argument_has_a_case.
Stand-in tensors on cuda:63 (a device no machine has): no GPU, no PyTorch,
nothing launched anywhere."""

from __future__ import annotations

import inspect
import re
import types
import typing

import pytest
from conftest import UNPREPARED, FakeTensor, fake_attn_layer, fake_router

import muse_decode as md
from muse_decode import _C

D = UNPREPARED
BF16 = "bfloat16"


# ---- good arguments, one call per op ---------------------------------------------------

def meta(**over):
    args = dict(buffer=FakeTensor([md.metadata_size(64)], "int32", ptr=0x50000, device=D), local_expert_offset=0,
                num_local_experts=32, tile_n=64)
    return md.RoutingMetadata(**{**args, **over})


def route_args(**over):
    args = dict(logits=FakeTensor([4, 256], ptr=0x20000, device=D), expert_bias=FakeTensor([256], ptr=0x10000, device=D),
                route_scale=1.0, ids=FakeTensor([4, 8], "int32", ptr=0x30000, device=D),
                weights=FakeTensor([4, 8], ptr=0x40000, device=D), metadata=meta(), pdl=True)
    return {**args, **over}


def attn2_args(**over):
    args = dict(q=FakeTensor((8, 1024), BF16, ptr=0x70000000, device=D, stride=(2304, 1)),
                gate=FakeTensor((8, 1024), BF16, ptr=0x70000000 + 2 * 1280, device=D, stride=(2304, 1)),
                kv_cache=FakeTensor((64, 2, 16, 128), BF16, ptr=0x20000000, device=D),
                block_table=FakeTensor((1, 128), "int32", ptr=0x80000000, device=D),
                seq_lens=FakeTensor((1,), "int32", ptr=0x90000000, device=D),
                out=FakeTensor((8, 1024), BF16, ptr=0x60000000, device=D), workspace=None, max_model_len=2048,
                window=0, num_splits=1, pdl=True)
    return {**args, **over}


def bound_attn2_args(**over):
    args = attn2_args()
    return {k: args[k] for k in ("kv_cache", "workspace", "max_model_len", "window", "num_splits")} | over


def front_args(**over):
    args = dict(x=FakeTensor([8, 8192], BF16, ptr=0x100000, device=D),
                weight=FakeTensor([2304, 8192], BF16, ptr=0x10000000, device=D),
                positions=FakeTensor([8], "int64", ptr=0x200000, device=D),
                cos_sin=FakeTensor([4096, 64], "float32", ptr=0x300000, device=D),
                slot_mapping=FakeTensor([8], "int64", ptr=0x400000, device=D),
                kv_cache=FakeTensor([64, 2, 16, 128], BF16, ptr=0x20000000, device=D), num_kv_heads=2,
                out=FakeTensor([8, 2304], BF16, ptr=0x500000, device=D),
                workspace=FakeTensor([1 << 22], "uint8", ptr=0x30000000, device=D), pdl=True)
    return {**args, **over}


def bound_front_args(**over):
    args = front_args()
    return {k: args[k] for k in ("weight", "cos_sin", "kv_cache", "num_kv_heads", "workspace")} | over


def block_args(**over):
    """A TP8 attention_block call of one request, max_model_len 2048."""
    args = dict(x=FakeTensor([8, 8192], BF16, ptr=0x100000, device=D),
                qkv_weight=FakeTensor([2304, 8192], BF16, ptr=0x10000000, device=D),
                positions=FakeTensor([8], "int64", ptr=0x200000, device=D),
                cos_sin=FakeTensor([4096, 64], "float32", ptr=0x300000, device=D),
                slot_mapping=FakeTensor([8], "int64", ptr=0x400000, device=D),
                kv_cache=FakeTensor([64, 2, 16, 128], BF16, ptr=0x20000000, device=D), num_kv_heads=2,
                block_table=FakeTensor([1, 128], "int32", ptr=0x80000000, device=D),
                seq_lens=FakeTensor([1], "int32", ptr=0x90000000, device=D), max_model_len=2048, window=0,
                o_proj_weight=FakeTensor([8192, 1024], BF16, ptr=0x40000000, device=D),
                out=FakeTensor([8, 8192], BF16, ptr=0x60000000, device=D),
                workspace=FakeTensor([md.attention_block_workspace_bytes(1, 2, 2048, 0)], "uint8", ptr=0x30000000,
                                     device=D))
    return {**args, **over}


def bound_block_args(**over):
    args = block_args()
    return {k: args[k] for k in ("qkv_weight", "cos_sin", "kv_cache", "num_kv_heads", "o_proj_weight",
                                 "max_model_len", "window", "workspace")} | over


def block_layer():
    """A TP8 attention layer as unsupported_attention_block reads it: the
    three ops' attributes on one object."""
    attn = projection_layer()
    attn.o_proj = o_proj_layer().o_proj
    for name, value in vars(fake_attn_layer()).items():
        setattr(attn, name, value)
    return attn


def projection_layer(**over):
    """A TP8 attention layer as unsupported_projection reads it; keys
    "qkv_proj.<attr>" and "rotary_emb.<attr>" replace the parts' attributes."""
    proj = types.SimpleNamespace(weight=FakeTensor([2304, 8192], BF16, ptr=0x10000000), bias=None, quant_method=None,
                                 gather_output=False, tp_size=8)
    emb = types.SimpleNamespace(rotary_dim=64, is_neox_style=False,
                                cos_sin_cache=FakeTensor([4096, 64], "float32", ptr=0x300000))
    attn = types.SimpleNamespace(qkv_proj=proj, num_heads=16, num_kv_heads=2, head_dim=64, use_rope=True,
                                 rotary_emb=emb)
    for key, value in over.items():
        part, _, name = key.rpartition(".")
        setattr(getattr(attn, part) if part else attn, name, value)
    return attn


def o_proj_layer(**over):
    """A TP8 attention layer as unsupported_o_proj reads it; keys
    "o_proj.<attr>" replace the projection's attributes."""
    proj = types.SimpleNamespace(weight=FakeTensor([8192, 1024], BF16, ptr=0x10000000), bias=None, quant_method=None,
                                 input_is_parallel=True, tp_size=8)
    attn = types.SimpleNamespace(o_proj=proj, num_heads=16, head_dim=64)
    for key, value in over.items():
        part, _, name = key.rpartition(".")
        setattr(getattr(attn, part) if part else attn, name, value)
    return attn


# ---- the cases: (function, argument as the message names it, call with the value) -------
# "raises": the call raises the ValueError. "reason": a why-not check, which
# returns the text instead. "false": a yes/no check, which answers False (its
# reason comes from the why-not check, tested beside it).

RAISES, REASON, FALSE = "raises", "reason", "false"

CASES = [
    # route
    ("metadata_size", "tile_n", RAISES, lambda v: md.metadata_size(v)),
    ("_C.metadata_fields", "num_tokens", RAISES, lambda v: _C.metadata_fields(v, 64)),
    ("_C.metadata_fields", "tile_n", RAISES, lambda v: _C.metadata_fields(8, v)),
    ("RoutingMetadata.fields", "num_tokens", RAISES, lambda v: meta().fields(v)),
    ("RoutingMetadata.fields", "tile_n", RAISES, lambda v: meta(tile_n=v).fields(8)),
    ("prepare_route", "device", RAISES, lambda v: md.prepare_route(v)),
    *[(f, "metadata." + a, kind, lambda v, f=f, a=a: getattr(md, f)(**route_args(metadata=meta(**{a: v}))))
      for f, kind in (("route", RAISES), ("unsupported_route_call", REASON))
      for a in ("local_expert_offset", "num_local_experts", "tile_n")],
    *[(f, "router." + a, kind, lambda v, f=f, a=a: getattr(md, f)(fake_router(device=D, **{a: v})))
      for f, kind in (("MuseRouting", RAISES), ("unsupported_router", REASON))
      for a in ("top_k", "global_num_experts")],
    # attn2
    ("attn2_window", "sliding_window", RAISES, lambda v: md.attn2_window(v, 131072)),
    ("attn2_window", "max_model_len", RAISES, lambda v: md.attn2_window(2048, v)),
    ("attn2_splits", "max_model_len", RAISES, lambda v: md.attn2_splits(v, 0, 2)),
    ("attn2_splits", "window", RAISES, lambda v: md.attn2_splits(131072, v, 2)),
    ("attn2_splits", "num_kv_heads", RAISES, lambda v: md.attn2_splits(131072, 0, v)),
    ("attn2_workspace_bytes", "num_reqs", RAISES, lambda v: md.attn2_workspace_bytes(v, 2, 4)),
    ("attn2_workspace_bytes", "num_kv_heads", RAISES, lambda v: md.attn2_workspace_bytes(1, v, 4)),
    ("attn2_workspace_bytes", "num_splits", RAISES, lambda v: md.attn2_workspace_bytes(1, 2, v)),
    ("prepare_attn2", "device", RAISES, lambda v: md.prepare_attn2(v)),
    *[(f, a, kind, lambda v, f=f, a=a: getattr(md, f)(**attn2_args(**{a: v})))
      for f, kind in (("attn2", RAISES), ("unsupported_attn2_call", REASON))
      for a in ("max_model_len", "window", "num_splits")],
    *[("Attn2", a, RAISES, lambda v, a=a: md.Attn2(**bound_attn2_args(**{a: v})))
      for a in ("max_model_len", "window", "num_splits")],
    *[("unsupported_attn2", "layer." + a, REASON, lambda v, a=a: md.unsupported_attn2(fake_attn_layer(**{a: v})))
      for a in ("head_dim", "num_heads", "num_kv_heads")],
    # qkv_front
    *[(f, "num_kv_heads", kind, lambda v, f=f: getattr(md, f)(**front_args(num_kv_heads=v)))
      for f, kind in (("qkv_front", RAISES), ("unsupported_qkv_front_call", REASON),
                      ("qkv_front_supports_call", FALSE))],
    ("QkvFront", "num_kv_heads", RAISES, lambda v: md.QkvFront(**bound_front_args(num_kv_heads=v))),
    ("qkv_front_supports_shape", "n", RAISES, lambda v: md.qkv_front_supports_shape(v, 2)),
    ("qkv_front_supports_shape", "num_kv_heads", RAISES, lambda v: md.qkv_front_supports_shape(2304, v)),
    ("qkv_front_workspace_bytes", "num_kv_heads", RAISES, lambda v: md.qkv_front_workspace_bytes(v, 132)),
    ("qkv_front_workspace_bytes", "sm_count", RAISES, lambda v: md.qkv_front_workspace_bytes(2, v)),
    ("qkv_front_workspace_bytes_for_device", "num_kv_heads", RAISES,
     lambda v: md.qkv_front_workspace_bytes_for_device(v, D)),
    ("qkv_front_workspace_bytes_for_device", "device", RAISES, lambda v: md.qkv_front_workspace_bytes_for_device(2, v)),
    ("_C.qkv_front_columns", "num_kv_heads", RAISES, lambda v: _C.qkv_front_columns(v)),
    ("split_qkv", "num_kv_heads", RAISES, lambda v: md.split_qkv(FakeTensor([8, 2304], BF16), v)),
    ("prepare_qkv_front", "device", RAISES, lambda v: md.prepare_qkv_front(v)),
    *[("unsupported_projection", "attn." + a, REASON, lambda v, a=a: md.unsupported_projection(projection_layer(**{a: v})))
      for a in ("qkv_proj.tp_size", "num_heads", "num_kv_heads", "head_dim", "rotary_emb.rotary_dim")],
    # o_proj
    ("prepare_o_proj", "device", RAISES, lambda v: md.prepare_o_proj(v)),
    *[("unsupported_o_proj", "attn." + a, REASON, lambda v, a=a: md.unsupported_o_proj(o_proj_layer(**{a: v})))
      for a in ("o_proj.tp_size", "num_heads", "head_dim")],
    # attention_block
    ("attention_block_supports_kv_heads", "num_kv_heads", RAISES, lambda v: md.attention_block_supports_kv_heads(v)),
    *[(f, a, RAISES, lambda v, f=f, i=i: getattr(md, f)(*[v if j == i else g for j, g in enumerate((1, 2, 32768, 0))]))
      for f in ("attention_block_splits", "attention_block_workspace_bytes")
      for i, a in enumerate(("num_reqs", "num_kv_heads", "max_model_len", "window"))],
    ("prepare_attention_block", "device", RAISES, lambda v: md.prepare_attention_block(v)),
    *[(f, a, kind, lambda v, f=f, a=a: getattr(md, f)(**block_args(**{a: v})))
      for f, kind in (("attention_block", RAISES), ("unsupported_attention_block_call", REASON))
      for a in ("num_kv_heads", "max_model_len", "window")],
    *[("AttentionBlock", a, RAISES, lambda v, a=a: md.AttentionBlock(**bound_block_args(**{a: v})))
      for a in ("num_kv_heads", "max_model_len", "window")],
    *[("unsupported_attention_block", a, REASON,
       lambda v, a=a: md.unsupported_attention_block(block_layer(), **{"max_model_len": 4096, a: v}))
      for a in ("max_model_len", "max_reqs")],
    # the GPU
    *[(f, "device", RAISES, lambda v, f=f: getattr(md, f)(v)) for f in ("gpu_family", "sm90", "sm100_family",
                                                                          "supported_gpu")],
    ("_C.describe_device", "device", RAISES, lambda v: _C.describe_device(v)),
]

# What each why-not check of a layer object reads as an integer: the
# extension function it passes the attributes to, and the names they have on
# the object, in the extension's order.
OBJECT_READERS = {
    "MuseRouting": ("router.", _C.MuseRouting.__init__,
                    dict(top_k="top_k", global_num_experts="global_num_experts")),
    "unsupported_router": ("router.", _C.unsupported_router,
                           dict(top_k="top_k", global_num_experts="global_num_experts")),
    "unsupported_attn2": ("layer.", _C.unsupported_attn2,
                          dict(head_dim="head_dim", num_heads="num_heads", num_kv_heads="num_kv_heads")),
    "unsupported_projection": ("attn.", _C.unsupported_projection,
                               dict(tp_size="qkv_proj.tp_size", num_heads="num_heads", num_kv_heads="num_kv_heads",
                                    head_dim="head_dim", rotary_dim="rotary_emb.rotary_dim")),
    "unsupported_o_proj": ("attn.", _C.unsupported_o_proj,
                           dict(tp_size="o_proj.tp_size", num_heads="num_heads", head_dim="head_dim")),
}
# Functions that take a RoutingMetadata: its integer fields are theirs too.
TAKES_METADATA = {"route", "unsupported_route_call", "MuseRouting.__call__"}
# Public callables whose every integer argument is checked elsewhere in this
# file, and why not in CASES.
ELSEWHERE = {
    # Builds only on a prepared GPU: test_bound_routing_refuses_bool_metadata.
    "MuseRouting.__call__": {"metadata.local_expert_offset", "metadata.num_local_experts", "metadata.tile_n"},
    # A record of a routing call's integers, read (and checked) by route and fields().
    "RoutingMetadata": {"local_expert_offset", "num_local_experts", "tile_n"},
}


# ---- what the package has -----------------------------------------------------------------

INT = re.compile(r"(\w+): int(?: \| None)?(?=[,)= ])")


def int_parameters(f) -> list[str]:
    """The parameters f's signature annotates int (or int | None): from the
    first line of an extension function's docstring (its signature), else
    from inspect.signature."""
    if type(f).__name__ in ("nb_func", "nb_method"):
        return INT.findall(f.__doc__.splitlines()[0])
    return [p.name for p in inspect.signature(f).parameters.values() if p.annotation in ("int", "int | None", int)]


# The extension's functions that the package calls for its public ones
# (RoutingMetadata.fields, split_qkv) or that its tests use: cased here too.
EXTENSION = ["metadata_fields", "qkv_front_columns", "describe_device"]


def public_callables() -> dict:
    """Label -> callable for every public function of the package: the names
    of muse_decode.__all__ (an alias, the same object, once), the
    constructors and public methods of its classes (a Python subclass of an
    extension class with the extension's methods), and EXTENSION."""
    found, seen = {}, set()
    for name in md.__all__:
        obj = getattr(md, name)
        if not callable(obj) or id(obj) in seen:
            continue
        seen.add(id(obj))
        if not isinstance(obj, type):
            found[name] = obj
            continue
        found[name] = obj.__init__ if "__init__" in vars(obj) else obj
        for cls in reversed(obj.__mro__):
            if cls.__module__.startswith("muse_decode"):
                for m, f in vars(cls).items():
                    if callable(f) and (m == "__call__" or not m.startswith("_")):
                        found[f"{name}.{m}"] = f
    for name in EXTENSION:
        found["_C." + name] = getattr(_C, name)
    return found


def expected_arguments(label: str, f) -> set[str]:
    """The integer arguments of `label`, as its ValueError names them."""
    if label in OBJECT_READERS:
        prefix, reader, names = OBJECT_READERS[label]
        read = set(int_parameters(reader))
        assert read == set(names), f"{label}: the extension reads the integers {sorted(read)}; update OBJECT_READERS"
        return {prefix + names[p] for p in read}
    if label == "RoutingMetadata":
        return {k for k, t in typing.get_type_hints(md.RoutingMetadata).items() if t is int}
    args = set(int_parameters(f))
    if label in TAKES_METADATA:
        args |= {"metadata." + a for a in expected_arguments("RoutingMetadata", None)}
    if label == "RoutingMetadata.fields":
        args.add("tile_n")  # the record's own, read here
    return args


def test_every_integer_argument_has_a_case():
    covered = {}
    for label, arg, _, _ in CASES:
        covered.setdefault(label, set()).add(arg)
    for label, args in ELSEWHERE.items():
        covered.setdefault(label, set()).update(args)
    callables = public_callables()
    assert len(callables) >= 40, sorted(callables)
    missing = {}
    for label, f in callables.items():
        want = expected_arguments(label, f)
        if want != covered.get(label, set()):
            missing[label] = (sorted(want), sorted(covered.get(label, set())))
    assert not missing, f"function: (its integer arguments, the cases here): {missing}"
    assert set(covered) <= set(callables), sorted(set(covered) - set(callables))


@pytest.mark.parametrize("value", [True, False])
@pytest.mark.parametrize("label, arg, kind, call", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_a_bool_for_an_integer_is_refused_by_name(label, arg, kind, call, value):
    message = f"{arg} must be an integer, got {value}"
    if kind == RAISES:
        with pytest.raises(ValueError) as e:
            call(value)
        assert str(e.value) == message
    elif kind == REASON:
        assert call(value) == message
    else:
        assert call(value) is False


def test_the_integers_themselves_still_pass():
    """The same calls with 1 and 0 in place of True and False reach another
    answer: so the refusal above is of the bool, not of the value."""
    assert md.attn2_window(1, 131072) == 1
    assert md.attn2_splits(131072, 0, 2) >= 1
    with pytest.raises(ValueError, match=r"^num_kv_heads must be (?!an integer).*, got 0$"):
        md.attn2_splits(131072, 0, 0)  # the range check, not the type check
    with pytest.raises(ValueError, match=r"^tile_n must be one of 8, 16, 32, 64, 128, 256, got 1$"):
        md.metadata_size(1)
    assert md.unsupported_attn2(fake_attn_layer(head_dim=1)) == "head_dim 1 (the kernel has 64)"
    assert md.attention_block_splits(1, 2, 32768, 0) == 66
    assert md.attention_block_supports_kv_heads(1) is False
    assert md.unsupported_attention_block(block_layer(), 4096, 0) == "max_reqs 0 (the block serves 1 to 8 requests)"


# ---- numbers ---------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [True, False])
@pytest.mark.parametrize(
    "arg, kind, call",
    [
        ("route_scale", RAISES, lambda v: md.route(**route_args(route_scale=v))),
        ("route_scale", REASON, lambda v: md.unsupported_route_call(**route_args(route_scale=v))),
        ("router.route_scale", REASON, lambda v: md.unsupported_router(fake_router(route_scale=v))),
        ("router.router_score_division_eps", REASON,
         lambda v: md.unsupported_router(fake_router(router_score_division_eps=v))),
        ("router.router_output_multiplier", REASON,
         lambda v: md.unsupported_router(fake_router(router_output_multiplier=v))),
        ("router.router_output_multiplier", RAISES,
         lambda v: md.fold_router_output_multiplier(fake_router(router_output_multiplier=v))),
        ("layer.scaling", REASON, lambda v: md.unsupported_attn2(fake_attn_layer(scaling=v))),
        ("layer.rms_norm_eps", REASON, lambda v: md.unsupported_attn2(fake_attn_layer(rms_norm_eps=v))),
    ],
)
def test_a_bool_for_a_number_is_refused_by_name(arg, kind, call, value):
    message = f"{arg} must be a number, got {value}"
    if kind == RAISES:
        with pytest.raises(ValueError) as e:
            call(value)
        assert str(e.value) == message
    else:
        assert call(value) == message


def test_a_switch_still_takes_a_bool():
    """pdl is a switch: True and False are its values."""
    assert md.unsupported_attn2_call(**attn2_args(pdl=False)) is None
    assert md.unsupported_qkv_front_call(**front_args(pdl=True)) is None


def test_the_good_block_arguments_pass():
    """The calls above with a bool in one place, without it: no reason."""
    assert md.unsupported_attention_block_call(**block_args()) is None
    assert md.unsupported_attention_block(block_layer(), 4096, 1) is None


# ---- the modules that import PyTorch ---------------------------------------------------------

def torch_module_cases():
    """(module, function, argument, call) for muse_decode.layer and
    muse_decode.stock, whose integer arguments are checked before any tensor
    is touched. (muse_decode.torch_ops is left out: torch reads its ops'
    arguments against their schemas before the package's code runs.)"""
    from muse_decode import layer, stock

    model = object.__new__(layer.MuseSparkAttentionRouting)  # plan and prepare check their integers first
    good = dict(layer_idx=0, max_model_len=4096, tp_rank=0, tp_size=8, seed=0, tile_n=128)
    return [
        (layer, "rope_table", "max_pos", lambda v: layer.rope_table(v)),
        (layer, "paged_cache", "num_pages", lambda v: layer.paged_cache(v, 2)),
        (layer, "paged_cache", "num_kv_heads", lambda v: layer.paged_cache(4, v)),
        (layer, "paged_cache", "seed", lambda v: layer.paged_cache(4, 2, seed=v)),
        (layer, "verify_step_inputs", "seq_lens[0]", lambda v: layer.verify_step_inputs([v], 4096, 8)),
        (layer, "verify_step_inputs", "max_model_len", lambda v: layer.verify_step_inputs([64], v, 8)),
        (layer, "verify_step_inputs", "num_pages", lambda v: layer.verify_step_inputs([64], 4096, v)),
        (layer, "verify_step_inputs", "seed", lambda v: layer.verify_step_inputs([64], 4096, 8, seed=v)),
        *[(layer, "MuseSparkAttentionRouting", a,
           lambda v, a=a: layer.MuseSparkAttentionRouting(**{**good, a: v})) for a in good],
        (layer, "MuseSparkAttentionRouting.plan", "num_tokens", lambda v: model.plan(v, 1, "cpu")),
        (layer, "MuseSparkAttentionRouting.plan", "num_reqs", lambda v: model.plan(8, v, "cpu")),
        (layer, "MuseSparkAttentionRouting.prepare", "num_reqs", lambda v: model.prepare(v)),
        (layer, "MuseSparkAttentionRouting.unsupported_block", "num_reqs", lambda v: model.unsupported_block(v)),
        (stock, "routing_metadata", "local_expert_offset", lambda v: stock.routing_metadata(None, v, 32, 64, None)),
        (stock, "routing_metadata", "num_local_experts", lambda v: stock.routing_metadata(None, 0, v, 64, None)),
        (stock, "routing_metadata", "tile_n", lambda v: stock.routing_metadata(None, 0, 32, v, None)),
        (stock, "qkv_front", "num_kv_heads", lambda v: stock.qkv_front(None, None, None, None, None, None, v)),
        (stock, "attn2", "window", lambda v: stock.attn2(None, None, None, None, None, v, 4096)),
        (stock, "attn2", "max_len", lambda v: stock.attn2(None, None, None, None, None, 0, v)),
    ]


def test_the_torch_modules_refuse_a_bool_for_every_integer():
    pytest.importorskip("torch")
    cases = torch_module_cases()
    covered = {}
    for module, label, arg, call in cases:
        covered.setdefault((module.__name__, label), set()).add(arg)
        for value in (True, False):
            with pytest.raises(ValueError) as e:
                call(value)
            assert str(e.value) == f"{arg} must be an integer, got {value}", (label, arg)
    # Every public function of the two modules, and the layer's methods.
    for module in {m for m, _, _, _ in cases}:
        functions = {n: f for n, f in vars(module).items()
                     if inspect.isfunction(f) and f.__module__ == module.__name__ and not n.startswith("_")}
        for n, cls in vars(module).items():
            if inspect.isclass(cls) and cls.__module__ == module.__name__ and "__init__" in vars(cls):
                functions[n] = cls.__init__
                functions |= {f"{n}.{m}": f for m, f in vars(cls).items()
                              if inspect.isfunction(f) and not m.startswith("_")}
        for label, f in functions.items():
            params = inspect.signature(f).parameters.values()
            want = {p.name for p in params if p.annotation in ("int", "int | None")}
            want |= {p.name + "[0]" for p in params if p.annotation == "list[int]"}
            assert want == covered.get((module.__name__, label), set()), (module.__name__, label, want)


@pytest.mark.gpu
def test_bound_routing_refuses_bool_metadata():
    import torch

    from muse_decode import layer

    routing = md.MuseRouting(layer.router(torch.zeros(256, device="cuda")))
    logits = torch.zeros(1, 256, device="cuda")
    ids = torch.empty(1, 8, dtype=torch.int32, device="cuda")
    weights = torch.empty(1, 8, device="cuda")
    buffer = torch.empty(md.metadata_size(64), dtype=torch.int32, device="cuda")
    for arg in ("local_expert_offset", "num_local_experts", "tile_n"):
        fields = {"local_expert_offset": 0, "num_local_experts": 32, "tile_n": 64, arg: True}
        with pytest.raises(ValueError) as e:
            routing(logits, ids, weights, md.RoutingMetadata(buffer, **fields))
        assert str(e.value) == f"metadata.{arg} must be an integer, got True"
