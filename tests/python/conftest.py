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
        return "needs a CUDA GPU (torch sees none)"
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
