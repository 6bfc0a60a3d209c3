"""muse-decode: fused CUDA kernels of the Muse Spark speculative-decode verify step.

Takes PyTorch tensors at run time, runs on torch's current CUDA stream,
allocates nothing per call and is capturable under ``torch.cuda.graph``.
Imports without a GPU and without PyTorch (the pure host functions work;
the ops need CUDA tensors).

Every op has the same shape as in the C++ library (include/muse_decode/<op>.h),
with the same names: the op, checked then launched, taking its arguments as
keyword arguments (``route``, ``attn2``, ``qkv_front``, ``o_proj``,
``attention_block``; ``pdl=True`` by default everywhere it applies:
attention_block is one cooperative launch and has no pdl); the check that
returns the reason the op would raise (``unsupported_route_call``,
``unsupported_attn2_call``, ``unsupported_qkv_front_call``,
``unsupported_o_proj_call``, ``unsupported_attention_block_call``); the
one-time setup of a device, raising on failure (``prepare_route``,
``prepare_attn2``, ``prepare_qkv_front``, ``prepare_o_proj``,
``prepare_attention_block``); and a bound form over a layer's static tensors
that prepares their device (``MuseRouting``, ``Attn2``, ``QkvFront``,
``OProj``, ``AttentionBlock``). attention_block is qkv_front, attn2 and
o_proj of one layer in one launch; where it does not serve a layer or a call,
the caller keeps the three ops. Each op's wrapper lives in a private module
named after it (``_route``, ``_attn2``, ``_qkv_front``, ``_o_proj``,
``_attention_block``); the package namespace is the API. The C++ library's
internal unchecked launch has no Python counterpart: Python passes tensors,
and every call is checked. The seed's names stay as aliases, the same
objects: ``launch_qkv_front`` is ``qkv_front``, ``supports_call`` is
``qkv_front_supports_call``, ``supports_shape`` is
``qkv_front_supports_shape``; all three are qkv_front's.

Every function answers a bad argument (a wrong type, True or False where
an integer or a number goes, an integer out of range, an unknown name) with
a ValueError naming it, the expected and the actual value. The "why not" checks (``unsupported_router``,
``unsupported_attn2``, ``unsupported_projection``, ``unsupported_o_proj``,
``unsupported_attention_block``, ``unsupported_<op>_call``)
return the reason as text for any object they are given, never raise for
it; the contract is in docs/contract.md.
"""

from . import _C
from ._C import unavailable
from ._attention_block import (
    AttentionBlock,
    attention_block,
    attention_block_splits,
    attention_block_supports_kv_heads,
    attention_block_workspace_bytes,
    prepare_attention_block,
    unsupported_attention_block,
    unsupported_attention_block_call,
)
from ._attn2 import (
    Attn2,
    attn2,
    attn2_splits,
    attn2_window,
    attn2_workspace_bytes,
    prepare_attn2,
    unsupported_attn2,
    unsupported_attn2_call,
)
from .constants import (
    DIVISION_EPS,
    HEAD_DIM,
    HEADS_PER_KV_HEAD,
    HIDDEN_SIZE,
    NUM_EXPERTS,
    ROUTER_OUTPUT_MULTIPLIER,
    ROUTING_MAX_TOKENS,
    TOP_K,
)
from ._o_proj import OProj, o_proj, prepare_o_proj, unsupported_o_proj, unsupported_o_proj_call
from ._route import (
    MuseRouting,
    RoutingMetadata,
    fold_router_output_multiplier,
    metadata_size,
    prepare_route,
    route,
    unsupported_route_call,
    unsupported_router,
)
from ._qkv_front import (
    QkvFront,
    launch_qkv_front,
    prepare_qkv_front,
    qkv_front,
    qkv_front_supports_call,
    qkv_front_supports_shape,
    qkv_front_workspace_bytes,
    qkv_front_workspace_bytes_for_device,
    split_qkv,
    supports_call,
    supports_shape,
    unsupported_projection,
    unsupported_qkv_front_call,
)
from .platform import gpu_family, sm90, sm100_family, supported_gpu

# muse_decode.stock (the stock PyTorch path), muse_decode.layer (a Muse Spark
# layer's attention + routing with the planner) and muse_decode.torch_ops (the
# torch.library registrations) import PyTorch, so they are imported on demand.

__version__ = "0.1.0"

__all__ = [
    # route
    "MuseRouting",
    "RoutingMetadata",
    "fold_router_output_multiplier",
    "metadata_size",
    "prepare_route",
    "route",
    "unsupported_route_call",
    "unsupported_router",
    # attn2
    "Attn2",
    "attn2",
    "attn2_splits",
    "attn2_window",
    "attn2_workspace_bytes",
    "prepare_attn2",
    "unsupported_attn2",
    "unsupported_attn2_call",
    # qkv_front
    "QkvFront",
    "prepare_qkv_front",
    "qkv_front",
    "qkv_front_supports_call",
    "qkv_front_supports_shape",
    "qkv_front_workspace_bytes",
    "qkv_front_workspace_bytes_for_device",
    "split_qkv",
    "unsupported_projection",
    "unsupported_qkv_front_call",
    # o_proj
    "OProj",
    "o_proj",
    "prepare_o_proj",
    "unsupported_o_proj",
    "unsupported_o_proj_call",
    # attention_block: qkv_front, attn2 and o_proj of one layer in one launch
    "AttentionBlock",
    "attention_block",
    "attention_block_splits",
    "attention_block_supports_kv_heads",
    "attention_block_workspace_bytes",
    "prepare_attention_block",
    "unsupported_attention_block",
    "unsupported_attention_block_call",
    # the seed's names for qkv_front's
    "launch_qkv_front",
    "supports_call",
    "supports_shape",
    # constants
    "DIVISION_EPS",
    "HEAD_DIM",
    "HEADS_PER_KV_HEAD",
    "HIDDEN_SIZE",
    "NUM_EXPERTS",
    "ROUTER_OUTPUT_MULTIPLIER",
    "ROUTING_MAX_TOKENS",
    "TOP_K",
    # the GPU
    "gpu_family",
    "sm90",
    "sm100_family",
    "supported_gpu",
    "unavailable",
]
