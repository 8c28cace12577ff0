"""The ``cuda`` backend: the shared Triton backend with NVIDIA's device facts.

Everything vendor-neutral (verbs, validation, kernels, conversions) is
:class:`nvfp4_triton.backend.TritonKernels`; this class adds the CUDA specifics:

* :func:`nvfp4_cuda.device.detect` - the GPU and its compute capability, or the Triton
  interpreter (``TRITON_INTERPRET=1``), or why neither;
* :mod:`nvfp4_cuda.configs` - tiles per compute capability;
* :mod:`nvfp4_cuda.dispatch` - the (M, N, K, capability) -> path table and its
  ``NVFP4_CUDA_PATH`` / ``NVFP4_CUDA_GATHER_PATH`` overrides;
* :mod:`nvfp4_cuda.w4a4` - W4A4 through torch's FP4 scaled matmul on capability 10.x /
  12.x; elsewhere (and under the interpreter) the ``w4a4`` capability is not declared;
* W4A8 (spec 1.1): the shared kernels' int8 ``tl.dot`` (``w4a8``, int8 tensor cores,
  declared on capability 8.x / 9.x) and FP8 ``tl.dot`` (``w4a8_fp8``, declared from 8.9 on),
  both under the interpreter (:mod:`nvfp4_triton.hardware`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nvfp4_triton import hardware
from nvfp4_triton.backend import Platform, TritonBackend, TritonKernels
from nvfp4_triton.weights import DeviceWeight

from . import device, dispatch, w4a4
from ._version import __version__

__all__ = ["PRIORITY", "CUDABackend", "CUDAKernels", "backend"]

#: Above ``cpu`` (50) and ``reference`` (0): chosen automatically where a GPU is usable.
PRIORITY = 100


class CUDAKernels(TritonKernels):
    """NVFP4 on NVIDIA GPUs (or on the CPU under the Triton interpreter)."""

    NAME = "cuda"
    PRIORITY = PRIORITY
    PACKAGE = "nvfp4-cuda"
    #: The spec versions this backend is certified for, named here (never
    #: ``nvfp4.SUPPORTED_SPEC_VERSIONS``); a version is added when it passes its conformance run.
    SPEC_VERSIONS = ("1.0", "1.1")
    VERSION = __version__
    NOTES = (
        "Triton kernels shared with nvfp4-rocm (package nvfp4-triton)",
        "W4A16: E2M1/E4M3 decoded in registers, float32 accumulation, global applied after "
        "accumulation; decode GEMV with deterministic split-K",
        "dispatch crossovers and GPU tiles are provisional: not yet measured on a GPU",
    )
    W4A8_DECLARED_ON = "compute capability 8.x / 9.x (int8 tensor cores)"
    W4A8_FP8_NEEDS = "FP8 tensor cores (compute capability 8.9 and later)"

    def detect(self) -> Platform:
        return device.detect()

    def qmm_path(self, m: int, n: int, k: int, x_dtype: Any, platform: Platform) -> str:
        return dispatch.qmm_path(m, n, k, x_dtype, platform.capability)

    def gather_path(
        self, m: int, n: int, k: int, experts: int, sorted_indices: bool, platform: Platform
    ) -> str:
        return dispatch.gather_path(m, n, k, experts, sorted_indices, platform.capability)

    def w4a4_supported(self, platform: Platform) -> bool:
        return w4a4.supported(platform)

    def w4a4_matmul(
        self, x: Any, w: DeviceWeight, input_scale: Any, out_dtype: Any, platform: Platform
    ) -> Any:
        assert platform.config is not None
        return w4a4.matmul(x, w, input_scale, out_dtype, platform.config)

    def w4a8_supported(self, platform: Platform) -> bool:
        return _has(platform, hardware.cuda_has_int8)

    def w4a8_fp8_supported(self, platform: Platform) -> bool:
        return _has(platform, hardware.cuda_has_fp8)

    def platform_notes(self, platform: Platform) -> tuple[str, ...]:
        if not platform.ok:
            return ()
        if platform.interpreter:
            return (
                "Triton interpreter on CPU: the kernels' logic is certified, not their speed",
                "W4A4 not declared: it needs FP4 tensor cores (compute capability 10.x / 12.x)",
                *self.w4a8_notes(platform),
            )
        assert platform.config is not None
        notes = [f"tiles: {platform.config.describe()}"]
        if self.w4a4_supported(platform):
            notes.append(
                "W4A4: torch._scaled_mm with float4_e2m1fn_x2 operands and 128x4-swizzled "
                "E4M3 scales (cuBLASLt NVFP4), globals applied after accumulation"
            )
        else:
            notes.append(
                f"W4A4 not declared: compute capability {platform.arch} has no FP4 tensor "
                "cores (10.x / 12.x do)"
            )
        notes.extend(self.w4a8_notes(platform))
        return tuple(notes)


def _has(platform: Platform, has: Callable[[tuple[int, int]], bool]) -> bool:
    """A W4A8 decision: the interpreter runs the kernels; a GPU of a known compute capability
    runs them where it ``has`` the tensor cores (a :mod:`nvfp4_triton.hardware` predicate)."""
    if not platform.ok:
        return False
    if platform.interpreter or platform.capability is None:
        return platform.interpreter
    return has(platform.capability)


class CUDABackend(TritonBackend):
    """The ``cuda`` verbs: :class:`~nvfp4_triton.backend.TritonBackend` over :class:`CUDAKernels`."""

    KERNELS = CUDAKernels


#: Entry-point factory (``cuda = "nvfp4_cuda:backend"``): cheap, never raises.
backend = CUDABackend
