"""The ``rocm`` backend: the shared Triton backend with AMD's device facts.

Everything vendor-neutral (verbs, planes validation in front of each of them, kernels,
conversions) is :class:`nvfp4_triton.backend.TritonKernels`; this class adds the ROCm
specifics:

* :func:`nvfp4_rocm.device.detect` - a ROCm build of torch and the GPU's ``gfx``
  architecture, or the Triton interpreter with one AMD architecture's tiles, or why
  neither;
* :mod:`nvfp4_rocm.configs` - tiles per architecture family (CDNA3, CDNA4: 64-lane
  wavefronts; RDNA3, RDNA4: 32-lane);
* :mod:`nvfp4_rocm.dispatch` - decode GEMV for small M, dequantize + ``torch.matmul``
  (hipBLASLt) for prefill, and the ``NVFP4_ROCM_PATH`` / ``NVFP4_ROCM_GATHER_PATH``
  overrides;
* :mod:`nvfp4_rocm.w4a4` - W4A4 *emulated* (activations quantized to NVFP4, decoded,
  then the W4A16 path), declared as such in :attr:`BackendInfo.notes`;
* W4A8 (spec 1.1): the shared kernels' int8 ``tl.dot`` (``w4a8``, declared on CDNA3 /
  CDNA4, int8 MFMA) and FP8 ``tl.dot`` (``w4a8_fp8``, declared on gfx942 / gfx950), both
  under the interpreter whatever architecture it imitates (:mod:`nvfp4_triton.hardware`).
"""

from __future__ import annotations

from typing import Any

from nvfp4_triton import hardware
from nvfp4_triton.backend import Platform, TritonBackend, TritonKernels
from nvfp4_triton.weights import DeviceWeight

from . import configs, device, dispatch, w4a4
from ._version import __version__

__all__ = ["PRIORITY", "ROCmBackend", "ROCmKernels", "backend"]

#: Above ``cpu`` (50) and ``reference`` (0): chosen automatically where an AMD GPU is usable.
PRIORITY = 100


class ROCmKernels(TritonKernels):
    """NVFP4 on AMD GPUs (or on the CPU under the Triton interpreter)."""

    NAME = "rocm"
    PRIORITY = PRIORITY
    PACKAGE = "nvfp4-rocm"
    #: The spec versions this backend is certified for, named here (never
    #: ``nvfp4.SUPPORTED_SPEC_VERSIONS``); a version is added when it passes its conformance run.
    SPEC_VERSIONS = ("1.0", "1.1")
    VERSION = __version__
    NOTES = (
        "Triton kernels shared with nvfp4-cuda (package nvfp4-triton); AMD tiles per "
        "architecture family, 64-lane wavefronts on CDNA, 32-lane on RDNA",
        "W4A16: E2M1/E4M3 decoded in registers, float32 accumulation, global applied after "
        "accumulation; decode GEMV for small M, dequantize + torch.matmul (hipBLASLt) for "
        "prefill",
        "AMD tiles and dispatch crossovers are provisional: nothing measured on AMD hardware",
        w4a4.NOTE,
    )
    W4A8_DECLARED_ON = "CDNA3 / CDNA4 (int8 MFMA)"
    W4A8_FP8_NEEDS = "FP8 MFMA (gfx942, gfx950)"

    def detect(self) -> Platform:
        return device.detect()

    def qmm_path(self, m: int, n: int, k: int, x_dtype: Any, platform: Platform) -> str:
        return dispatch.qmm_path(m, x_dtype, platform.arch)

    def gather_path(
        self, m: int, n: int, k: int, experts: int, sorted_indices: bool, platform: Platform
    ) -> str:
        return dispatch.gather_path(m, sorted_indices, platform.arch)

    def w4a4_supported(self, platform: Platform) -> bool:
        """Emulated on every AMD platform (see :mod:`nvfp4_rocm.w4a4`)."""
        return platform.ok

    def w4a4_matmul(
        self, x: Any, w: DeviceWeight, input_scale: Any, out_dtype: Any, platform: Platform
    ) -> Any:
        assert platform.config is not None
        path = dispatch.w4a4_path(x.shape[0], platform.arch)
        return w4a4.matmul(x, w, input_scale, out_dtype, platform.config, path)

    def w4a8_supported(self, platform: Platform) -> bool:
        """int8 MFMA (CDNA3, CDNA4), or the interpreter."""
        return platform.ok and (platform.interpreter or hardware.hip_has_int8(platform.arch))

    def w4a8_fp8_supported(self, platform: Platform) -> bool:
        """FP8 MFMA (gfx942, gfx950), or the interpreter; never emulated on a GPU."""
        return platform.ok and (platform.interpreter or hardware.hip_has_fp8(platform.arch))

    def platform_notes(self, platform: Platform) -> tuple[str, ...]:
        if not platform.ok or platform.config is None:
            return ()
        match = configs.match_arch(platform.arch)
        notes = [
            f"tiles: {platform.config.describe()}",
            *platform.config.notes,
            *self.w4a8_notes(platform),
        ]
        if platform.interpreter:
            notes.insert(
                0,
                f"Triton interpreter on CPU with the {match.family.title} configuration of "
                f"{match.arch}: the kernels' logic is certified, not their speed",
            )
        return tuple(notes)


class ROCmBackend(TritonBackend):
    """The ``rocm`` verbs: :class:`~nvfp4_triton.backend.TritonBackend` over :class:`ROCmKernels`."""

    KERNELS = ROCmKernels


#: Entry-point factory (``rocm = "nvfp4_rocm:backend"``): cheap, never raises.
backend = ROCmBackend
