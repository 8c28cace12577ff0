"""What the adapters over GPU-only engines (FlashInfer, vLLM, Transformer Engine) share: the
availability probe that says "needs CUDA", with what to install, wherever no CUDA device is
present, before the engine is imported (importing these engines without a GPU is slow or
fails). The engine's own check runs only where a device is there."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

from nvfp4.contract import Availability

from ._common import dist_version

__all__ = ["NEEDS_CUDA", "cuda_device", "probe"]

#: Every reason a GPU-only adapter gives on a machine without CUDA starts with this.
NEEDS_CUDA = "needs CUDA"


def cuda_device() -> str:
    """The name of CUDA device 0 as torch sees it, or ``""`` when torch is missing or sees
    none."""
    if importlib.util.find_spec("torch") is None:
        return ""
    import torch

    if not torch.cuda.is_available():
        return ""
    return str(torch.cuda.get_device_name(0))


def probe(engine: str, distribution: str, install: str, check: Callable[[], None]) -> Availability:
    """Availability of a GPU-only engine: ``check()`` (the engine's own smallest NVFP4
    call) runs only when the engine is installed and a CUDA device is present."""
    version = dist_version(distribution)
    device = cuda_device()
    if not device:
        have = (
            f"{distribution} {version} is installed"
            if version
            else f"on a machine with an NVIDIA GPU: {install}"
        )
        return Availability(
            False,
            f"{NEEDS_CUDA}: {engine}'s NVFP4 kernels run on NVIDIA GPUs only and this machine "
            f"has no CUDA device (torch sees none); {have}",
        )
    if not version:
        return Availability(False, f"{NEEDS_CUDA} and {engine}: {install}")
    try:
        check()
    except Exception as exc:
        return Availability(
            False,
            f"{engine} {version} cannot run its NVFP4 kernels on {device} "
            f"({type(exc).__name__}: {exc}): {install}",
        )
    return Availability(True, device=f"{device} ({distribution} {version})")
