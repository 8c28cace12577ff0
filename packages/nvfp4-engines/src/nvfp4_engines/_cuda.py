"""What the adapters over GPU-only engines (FlashInfer, vLLM, Transformer Engine) share: the
availability probe that says "needs CUDA", with what to install, wherever no CUDA device is
present, before the engine is imported (importing these engines without a GPU is slow or
fails). The engine's own check runs only where a device is there. :class:`CudaKernels`
is the start of such an adapter's kernels object: its "GPU only" note, its availability
and the error its kernels raise where it cannot run."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import ClassVar

from nvfp4.contract import Availability

from ._common import EngineKernels, dist_version, require

__all__ = ["GPU_ONLY_NOTE", "NEEDS_CUDA", "CudaKernels", "cuda_device", "probe"]

#: Every reason a GPU-only adapter gives on a machine without CUDA starts with this.
NEEDS_CUDA = "needs CUDA"
#: The first note (after the engine's) of every GPU-only adapter's certificate.
GPU_ONLY_NOTE = "GPU only: needs a CUDA device"


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


class CudaKernels(EngineKernels):
    """The start of a GPU-only adapter's kernels object: beyond :class:`EngineKernels`'
    facts, the class names ``ENGINE`` (as the adapter's messages spell it) and ``INSTALL``
    (what to run) and supplies :meth:`check`. The notes start with :data:`GPU_ONLY_NOTE`;
    :meth:`availability` is :func:`probe`; :meth:`ready` raises every kernel's "cannot run
    here" error."""

    ENGINE: ClassVar[str]
    INSTALL: ClassVar[str]

    def notes(self) -> tuple[str, ...]:
        return (GPU_ONLY_NOTE, *self.NOTES)

    def check(self) -> None:
        """The engine's smallest NVFP4 call (run only on a CUDA machine with the engine)."""
        raise NotImplementedError

    def availability(self) -> Availability:
        return probe(self.ENGINE, self.DISTRIBUTION, self.INSTALL, self.check)

    def ready(self) -> None:
        """Raise ``NVFP4 backend '<name>' cannot run here: <reason>`` unless available."""
        require(self.NAME, self.availability())
