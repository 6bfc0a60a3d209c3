"""route: MoE routing of 1..8 tokens with the TRT-LLM-gen routing metadata."""

from __future__ import annotations

from typing import NamedTuple

from . import _C
from ._attributes import attributes
from .constants import NUM_EXPERTS

# What route reads off a vLLM Muse Spark router, in the order the extension
# takes it.
_ROUTER_ATTRIBUTES = (
    "router_score_normalization",
    "top_k",
    "global_num_experts",
    "router_output_multiplier",
    "router_score_division_eps",
    "expert_bias",
    "route_scale",
)


def metadata_size(tile_n: int) -> int:
    """int32 elements of a metadata buffer for GEMM tile ``tile_n`` (8 tokens)."""
    return _C.metadata_size(tile_n)


class RoutingMetadata(NamedTuple):
    """Where a routing call writes the metadata of local experts
    ``[local_expert_offset, local_expert_offset + num_local_experts)`` for GEMM
    tile ``tile_n``: ``buffer`` is int32 with at least ``metadata_size(tile_n)``
    elements and must not overlap the ids, weights or logits."""

    buffer: object
    local_expert_offset: int = 0
    num_local_experts: int = NUM_EXPERTS
    tile_n: int = 128

    def fields(self, num_tokens: int) -> dict:
        """1-D int32 views of ``buffer`` for ``num_tokens`` tokens (1..8):
        total_num_padded_tokens [1], num_non_exiting_ctas [1],
        expanded_idx_to_permuted_idx, cta_idx_xy_to_batch_idx and
        cta_idx_xy_to_mn_limit [8 num_tokens], permuted_idx_to_token_idx
        [8 num_tokens tile_n + 1] (its last element a guard, never written)."""
        m = self.buffer
        fields = _C.metadata_fields(num_tokens, self.tile_n)  # ValueError naming num_tokens or tile_n
        if not hasattr(type(m), "__getitem__"):
            raise ValueError(f"buffer must be an int32 tensor, got {type(m).__name__}")
        return {name: m[off : off + n] for name, off, n in fields}


def unsupported_router(router) -> str | None:
    """Why route cannot reproduce ``router``'s routing (a vLLM Muse Spark
    router: router_score_normalization, top_k, global_num_experts,
    router_output_multiplier, router_score_division_eps, expert_bias,
    route_scale), or None when it can. Any object gets an answer: a missing
    or unreadable attribute is a reason too."""
    try:
        values = attributes(router, "router", _ROUTER_ATTRIBUTES)
    except ValueError as e:
        return str(e)
    return _C.unsupported_router(*values)


def fold_router_output_multiplier(router) -> None:
    """Fold ``router.router_output_multiplier`` into the fp32 router weight
    (``router.weight``) once after loading, and mark it folded (None), so that
    routing reads plain logits. A router already folded is left as it is.
    ValueError naming the attribute when the router has no such attributes,
    the multiplier is not a number or the weight is not an fp32 tensor."""
    (multiplier,) = attributes(router, "router", ("router_output_multiplier",))
    if multiplier is None:
        return
    if isinstance(multiplier, bool):
        raise ValueError(f"router.router_output_multiplier must be a number, got {multiplier}")
    try:
        # float() reads text too; a multiplier given as text is a loading bug.
        factor = None if isinstance(multiplier, (str, bytes)) else float(multiplier)
    except (TypeError, ValueError):
        factor = None
    if factor is None:
        raise ValueError(f"router.router_output_multiplier must be a number, got {type(multiplier).__name__}")
    (weight,) = attributes(router, "router", ("weight",))
    dtype = getattr(weight, "dtype", None)
    if dtype is not None and str(dtype) != "torch.float32":
        raise ValueError(f"router.weight must be float32 to fold the multiplier exactly enough, got {dtype}")
    if dtype is None or not hasattr(weight, "mul_"):
        raise ValueError(f"router.weight must be a float32 tensor, got {type(weight).__name__}")
    import torch

    with torch.no_grad():
        weight.mul_(factor)
    router.router_output_multiplier = None


# The extension's functions themselves: no Python frame on the per-call path
# (an op has 5 us of host time in all).
#   route(logits, expert_bias, route_scale, ids, weights, metadata=None, pdl=True) -> (ids, weights)
#   unsupported_route_call(the same arguments) -> the reason route would raise, or None
#   prepare_route(device=-1): one-time setup of a device, outside graph capture
route = _C.route
unsupported_route_call = _C.unsupported_route_call
prepare_route = _C.prepare_route


class MuseRouting(_C.MuseRouting):
    """The routing of one Muse Spark MoE layer for 1 to 8 tokens, bound to its
    router's expert bias and route scale when built. The router is checked
    then (ValueError naming an attribute it lacks or that does not read as
    its type, or "MuseRouting does not support <the reason of
    unsupported_router>"), and the bias's device is prepared, as
    prepare_route does.

    ``routing(logits, ids, weights, metadata=None, pdl=True)`` is ``route``
    with the bound bias and scale: it routes fp32 logits [b, 256] (1 <= b <=
    8, 16-byte aligned rows) into ``ids`` (int32 [b, 8], global expert ids)
    and ``weights`` (fp32 [b, 8]); with ``metadata`` (a RoutingMetadata) it
    also writes the routing metadata of the local experts. Returns (ids,
    weights). Any bad argument raises ValueError before anything is launched.
    A call allocates nothing, runs on the current stream and can be captured
    in a CUDA graph. ``pdl`` launches with programmatic dependent launch (the
    kernel reads the bias before waiting for the previous kernel, and
    everything else after), which is correct whatever precedes it and saves
    ~0.3 us of GPU and host time.

    The call itself is the extension's: no Python frame in between, so the
    whole host path costs a few microseconds."""

    def __init__(self, router):
        super().__init__(*attributes(router, "router", _ROUTER_ATTRIBUTES))
        self.bias = router.expert_bias
        self.route_scale = float(router.route_scale)
