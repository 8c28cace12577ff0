"""The ``reference`` backend: the numpy reference (:mod:`nvfp4.reference`) as kernels of
the contract (:mod:`nvfp4.contract`). Core registers it itself, so every machine has a
backend and the conformance suite certifies the numpy path like any other.

It is also the smallest complete adapter there is: each kernel is one call into the
reference's 2-D arithmetic, because core has checked every operand already.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from . import reference
from .activations import FP8Activations, Q8Activations
from .backend import Frontend
from .contract import CAPABILITIES, Availability, BackendInfo
from .planes import NVFP4Planes

__all__ = ["SPEC_VERSIONS", "ReferenceKernels", "backend"]

#: The NVFP4 spec versions the reference backend is certified for, named here: never
#: ``nvfp4.SUPPORTED_SPEC_VERSIONS``, which would make it claim every version a newer
#: nvfp4-core adds. A version is added here when it passes its conformance run.
SPEC_VERSIONS: tuple[str, ...] = ("1.0", "1.1", "1.2", "1.3", "1.4", "1.5")


class _Weight:
    """Prepared reference weight: the planes, and their exactly decoded float64 operand,
    made on the first matmul (8 bytes per weight) and kept while the handle lives."""

    __slots__ = ("_operand", "planes")

    def __init__(self, planes: NVFP4Planes) -> None:
        self.planes = planes
        self._operand: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]] | None = None

    def operand(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        if self._operand is None:
            self._operand = reference.decoded_operand(self.planes)
        return self._operand


def _gather_kernel(
    arithmetic: Callable[
        [npt.NDArray[Any], NVFP4Planes, npt.NDArray[np.int64]], npt.NDArray[np.float64]
    ],
) -> Callable[..., npt.NDArray[Any]]:
    """A MoE kernel (``gather_qmm``, ``gather_qmm_w4a8``): the reference's 2-D
    ``arithmetic`` on the expert stack, as ``out_dtype``; the result does not depend on
    ``sorted_indices``."""

    def kernel(
        self: ReferenceKernels,
        x: npt.NDArray[Any],
        w: _Weight,
        expert_ids: npt.NDArray[np.int64],
        *,
        sorted_indices: bool,
        out_dtype: str,
    ) -> npt.NDArray[Any]:
        return reference.output(arithmetic(x, w.planes, expert_ids), out_dtype)

    return kernel


def _scaled_kernel(
    arithmetic: Callable[[npt.NDArray[Any], NVFP4Planes, float | None], npt.NDArray[np.float64]],
) -> Callable[..., npt.NDArray[Any]]:
    """A matmul on activations quantized with a static or dynamic input scale
    (``qmm_w4a4``, ``qmm_w4a8_fp8``): the reference's 2-D ``arithmetic``, as ``out_dtype``."""

    def kernel(
        self: ReferenceKernels,
        x: npt.NDArray[Any],
        w: _Weight,
        *,
        input_scale: float | None,
        out_dtype: str,
    ) -> npt.NDArray[Any]:
        return reference.output(arithmetic(x, w.planes, input_scale), out_dtype)

    return kernel


class ReferenceKernels:
    """Numpy, float64 accumulation, bit-exact decoding. Slow and always available."""

    def __init__(self) -> None:
        from ._version import __version__

        self.info = BackendInfo(
            name="reference",
            spec_versions=SPEC_VERSIONS,
            priority=0,
            # the reference defines every capability of the contract
            capabilities=frozenset(CAPABILITIES),
            version=__version__,
            package="nvfp4-core",
            notes=(
                "numpy on the CPU; float64 accumulation; W4A4 emulated exactly",
                "W4A8 (int8 and FP8 activations) emulated exactly: float64 accumulation",
            ),
        )

    def availability(self) -> Availability:
        return Availability(True, device="numpy on the CPU")

    def prepare(self, planes: NVFP4Planes) -> _Weight:
        return _Weight(planes)

    def qmm(self, x: npt.NDArray[Any], w: _Weight, *, out_dtype: str) -> npt.NDArray[Any]:
        return reference.output(reference.qmm_2d(x, w.operand()), out_dtype)

    gather_qmm = _gather_kernel(reference.gather_qmm_2d)

    def dequantize(self, w: _Weight, *, dtype: str) -> npt.NDArray[Any]:
        return reference.dequantize(w.planes, dtype)

    def quantize_activations(
        self, x: npt.NDArray[Any], *, input_scale: float | None
    ) -> NVFP4Planes:
        return reference.quantize_activations_2d(x, input_scale)

    qmm_w4a4 = _scaled_kernel(reference.qmm_w4a4_2d)

    def quantize_activations_q8(self, x: npt.NDArray[Any]) -> Q8Activations:
        return reference.quantize_activations_q8_2d(x)

    def qmm_w4a8(self, x: npt.NDArray[Any], w: _Weight, *, out_dtype: str) -> npt.NDArray[Any]:
        return reference.output(reference.qmm_w4a8_2d(x, w.planes), out_dtype)

    gather_qmm_w4a8 = _gather_kernel(reference.gather_qmm_w4a8_2d)

    def quantize_activations_fp8(
        self, x: npt.NDArray[Any], *, input_scale: float | None
    ) -> FP8Activations:
        return reference.quantize_activations_fp8_2d(x, input_scale)

    qmm_w4a8_fp8 = _scaled_kernel(reference.qmm_w4a8_fp8_2d)

    def to_planes(self, w: _Weight) -> NVFP4Planes:
        return w.planes

    def from_numpy(self, a: npt.NDArray[Any]) -> npt.NDArray[Any]:
        return np.asarray(a)

    def to_numpy(self, a: Any) -> npt.NDArray[Any]:
        return np.asarray(a)


def backend() -> Frontend:
    """Entry-point factory (``reference = "nvfp4.reference_backend:backend"``): the reference
    backend's front end, like every backend's factory."""
    return Frontend(ReferenceKernels())
