"""Shared pieces of the Python suites: stand-in tensors for the CPU tests and
the `gpu` marker, whose tests skip (and say why) without torch and a GPU."""

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs torch and an SM90/SM100 GPU")


def gpu_skip_reason():
    try:
        import torch
    except ImportError:
        return "needs PyTorch (not installed)"
    import muse_decode

    if not torch.cuda.is_available():
        return f"needs a CUDA GPU, torch sees none: {muse_decode._C.describe_device()}"
    if not muse_decode.supported_gpu():
        return f"needs an SM90 or SM100 GPU, this one is {muse_decode._C.describe_device()}"
    return None


def pytest_collection_modifyitems(config, items):
    reason = None
    for item in items:
        if "gpu" in item.keywords:
            reason = reason or gpu_skip_reason() or ""
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


class FakeDtype:
    def __init__(self, name):
        self.name = name

    def __str__(self):
        return "torch." + self.name


class FakeTensor:
    """Just the attributes the checks read: shape, stride(), dtype,
    data_ptr(), get_device(); slicing a 1-D one gives (start, stop)."""

    def __init__(self, shape, dtype="float32", ptr=0x100000, device=0, stride=None):
        self.shape = tuple(shape)
        if stride is None:
            stride, acc = [], 1
            for s in reversed(self.shape):
                stride.insert(0, acc)
                acc *= s
        self._stride = tuple(stride)
        self.dtype = FakeDtype(dtype)
        self._ptr = ptr
        self._device = device

    def stride(self):
        return self._stride

    def data_ptr(self):
        return self._ptr

    def get_device(self):
        return self._device

    def __getitem__(self, sl):
        return (sl.start, sl.stop)


# ---- the layers' objects, as vLLM carries them (the why-not checks' input) -----------

UNPREPARED = 63  # a device ordinal no test prepares and no machine has


def fake_router(device=0, **over):
    """A Muse Spark router as the routing checks read it; `over` replaces attributes."""
    import types

    r = types.SimpleNamespace(
        router_score_normalization="sigmoid",
        top_k=8,
        global_num_experts=256,
        router_output_multiplier=None,
        router_score_division_eps=1e-15,
        expert_bias=FakeTensor([256], ptr=0x10000, device=device),
        route_scale=1.0,
    )
    for k, v in over.items():
        setattr(r, k, v)
    return r


def fake_attn_layer(**over):
    """A TP8 MuseSpark1xAttention layer as unsupported_attn2 reads it."""
    import types

    layer = types.SimpleNamespace(use_o_norm=True, use_o_gate=True, head_dim=64, num_heads=16, num_kv_heads=2,
                                  scaling=0.6841258107984375, rms_norm_eps=1e-5)
    for k, v in over.items():
        setattr(layer, k, v)
    return layer
