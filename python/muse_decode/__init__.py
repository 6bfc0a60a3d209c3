"""muse-decode: fused CUDA kernels of the Muse Spark speculative-decode verify step.

Takes PyTorch tensors at run time, runs on torch's current CUDA stream,
allocates nothing per call and is capturable under ``torch.cuda.graph``.
Imports without a GPU and without PyTorch (the pure host functions work;
the ops need CUDA tensors).
"""

from . import _C
from ._C import unavailable
from .attention import Attn2, attn2, attn2_splits, attn2_window, attn2_workspace_bytes, prepare_attn2, unsupported_attn2
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
from .routing import (
    MuseRouting,
    RoutingMetadata,
    fold_router_output_multiplier,
    metadata_size,
    unsupported_router,
)
from .front import (
    QkvFront,
    launch_qkv_front,
    prepare_qkv_front,
    qkv_front_workspace_bytes,
    split_qkv,
    supports_call,
    supports_shape,
    unsupported_call,
    unsupported_projection,
)
from .platform import gpu_family, sm90, sm100_family, supported_gpu

# muse_decode.stock (the stock PyTorch path), muse_decode.layer (a Muse Spark
# layer's attention + routing with the planner) and muse_decode.torch_ops (the
# torch.library registrations) import PyTorch, so they are imported on demand.

__version__ = "0.1.0"

__all__ = [
    "Attn2",
    "QkvFront",
    "attn2",
    "attn2_splits",
    "attn2_window",
    "attn2_workspace_bytes",
    "prepare_attn2",
    "unsupported_attn2",
    "DIVISION_EPS",
    "HEAD_DIM",
    "HEADS_PER_KV_HEAD",
    "HIDDEN_SIZE",
    "NUM_EXPERTS",
    "ROUTER_OUTPUT_MULTIPLIER",
    "ROUTING_MAX_TOKENS",
    "TOP_K",
    "MuseRouting",
    "RoutingMetadata",
    "fold_router_output_multiplier",
    "gpu_family",
    "launch_qkv_front",
    "prepare_qkv_front",
    "qkv_front_workspace_bytes",
    "split_qkv",
    "supports_call",
    "supports_shape",
    "unsupported_call",
    "unsupported_projection",
    "metadata_size",
    "sm90",
    "sm100_family",
    "supported_gpu",
    "unavailable",
    "unsupported_router",
]
