"""Which GPU this is, as the kernels see it."""

from __future__ import annotations

from . import _C


def gpu_family(device: int = -1) -> str | None:
    """'sm90' (H100/H200), 'sm100' (B200/B300 family), 'other', or None when no
    CUDA device is visible (or the package was built without CUDA). ValueError
    naming device unless it is -1 (the current device) or an ordinal >= 0."""
    family = _C.gpu_family(device)
    return None if family == "none" else family


def supported_gpu(device: int = -1) -> bool:
    """Whether the kernels run on this GPU (SM90 or the SM100 family)."""
    return gpu_family(device) in ("sm90", "sm100")


def sm90(device: int = -1) -> bool:
    """Whether this is an SM90 GPU (H100/H200, the tested target)."""
    return gpu_family(device) == "sm90"


def sm100_family(device: int = -1) -> bool:
    """Whether this is an SM100-family GPU (the seed's only target)."""
    return gpu_family(device) == "sm100"
