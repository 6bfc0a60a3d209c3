"""route: MoE routing of 1..8 tokens with the TRT-LLM-gen routing metadata."""

from __future__ import annotations

from typing import NamedTuple

from . import _C
from .constants import NUM_EXPERTS


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
        m = self.buffer  # metadata_fields checks num_tokens (ValueError)
        return {name: m[off : off + n] for name, off, n in _C.metadata_fields(num_tokens, self.tile_n)}


def unsupported_router(router) -> str | None:
    """Why route cannot reproduce ``router``'s routing (a vLLM Muse Spark
    router: router_score_normalization, top_k, global_num_experts,
    router_output_multiplier, router_score_division_eps, expert_bias,
    route_scale), or None when it can."""
    multiplier = router.router_output_multiplier
    return _C.unsupported_router(
        str(router.router_score_normalization),
        int(router.top_k),
        int(router.global_num_experts),
        None if multiplier is None else float(multiplier),
        float(router.router_score_division_eps),
        router.expert_bias,
        float(router.route_scale),
    )


def fold_router_output_multiplier(router) -> None:
    """Fold ``router.router_output_multiplier`` into the fp32 router weight
    (``router.weight``) once after loading, and mark it folded (None), so that
    routing reads plain logits. A router already folded is left as it is."""
    multiplier = router.router_output_multiplier
    if multiplier is None:
        return
    weight = router.weight
    if str(weight.dtype) != "torch.float32":
        raise ValueError(f"router.weight must be float32 to fold the multiplier exactly enough, got {weight.dtype}")
    import torch

    with torch.no_grad():
        weight.mul_(float(multiplier))
    router.router_output_multiplier = None


# The extension's functions themselves: no Python frame on the per-call path
# (host cost, SPEC section 7).
#   route(logits, expert_bias, route_scale, ids, weights, metadata=None, pdl=True) -> (ids, weights)
#   unsupported_route_call(the same arguments) -> the reason route would raise, or None
#   prepare_route(device=-1): one-time setup of a device, outside graph capture
route = _C.route
unsupported_route_call = _C.unsupported_route_call
prepare_route = _C.prepare_route


class MuseRouting(_C.MuseRouting):
    """The routing of one Muse Spark MoE layer for 1 to 8 tokens, bound to its
    router's expert bias and route scale when built (the router is checked
    then: ValueError with the reason; and the bias's device is prepared, as
    prepare_route does).

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

    The call itself is the extension's (no Python frame in between: the whole
    host path costs a few microseconds, SPEC section 7)."""

    def __init__(self, router):
        reason = unsupported_router(router)
        if reason is not None:
            raise ValueError(f"MuseRouting does not support {reason}")
        super().__init__(router.expert_bias, float(router.route_scale))
        self.bias = router.expert_bias
        self.route_scale = float(router.route_scale)
