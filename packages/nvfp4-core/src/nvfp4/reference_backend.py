"""The ``reference`` backend: the numpy reference behind the :class:`~nvfp4.backend.Backend`
contract. Core registers it itself, so every machine has a backend and the conformance
suite certifies the numpy path like any other."""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import numpy.typing as npt

from . import reference
from .backend import Availability, BackendInfo
from .planes import NVFP4Planes, validate
from .spec import SUPPORTED_SPEC_VERSIONS

__all__ = ["ReferenceBackend", "backend"]


def _version() -> str:
    from . import __version__

    return __version__


class ReferenceBackend:
    """Numpy, float64 accumulation, bit-exact decoding. Slow and always available."""

    def __init__(self) -> None:
        self._decoded: weakref.WeakKeyDictionary[
            NVFP4Planes, tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]
        ] = weakref.WeakKeyDictionary()
        self.info = BackendInfo(
            name="reference",
            spec_versions=SUPPORTED_SPEC_VERSIONS,
            priority=0,
            capabilities=frozenset(
                {
                    "dequantize",
                    "qmm",
                    "gather_qmm",
                    "fused_partitions",
                    "quantize_activations",
                    "w4a4",
                }
            ),
            version=_version(),
            package="nvfp4-core",
            notes=("numpy on the CPU; float64 accumulation; W4A4 emulated exactly",),
        )

    def availability(self) -> Availability:
        return Availability(True, device="numpy on the CPU")

    def prepare(self, planes: NVFP4Planes) -> NVFP4Planes:
        return validate(planes, content=True)

    def _operand(self, w: NVFP4Planes) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """The decoded float64 operand of a weight, computed once per planes object (held
        weakly: it goes when the planes go). A model's worth costs 8 bytes per weight."""
        operand = self._decoded.get(w)
        if operand is None:
            operand = reference.decoded_operand(w)
            self._decoded[w] = operand
        return operand

    @staticmethod
    def _out_dtype(x: Any, out_dtype: Any) -> Any:
        return out_dtype if out_dtype is not None else np.asarray(x).dtype

    def qmm(self, x: Any, w: NVFP4Planes, *, out_dtype: Any = None) -> npt.NDArray[Any]:
        validate(w)
        if w.num_experts is not None:
            raise ValueError(f"qmm({w.name!r}): expert-stacked weights go through gather_qmm")
        return reference.qmm_decoded(
            x, self._operand(w), w, out_dtype=self._out_dtype(x, out_dtype)
        )

    def gather_qmm(
        self,
        x: Any,
        w: NVFP4Planes,
        expert_ids: Any,
        *,
        sorted_indices: bool = False,
        out_dtype: Any = None,
    ) -> npt.NDArray[Any]:
        return reference.gather_qmm(
            x, w, expert_ids, sorted_indices=sorted_indices, out_dtype=self._out_dtype(x, out_dtype)
        )

    def dequantize(self, w: NVFP4Planes, dtype: Any = "float32") -> npt.NDArray[Any]:
        return reference.dequantize(w, dtype)

    def quantize_activations(self, x: Any, input_scale: Any = None) -> NVFP4Planes:
        return reference.quantize_activations(x, input_scale)

    def qmm_w4a4(
        self, x: Any, w: NVFP4Planes, *, input_scale: Any = None, out_dtype: Any = None
    ) -> npt.NDArray[Any]:
        return reference.qmm_w4a4(
            x, w, input_scale=input_scale, out_dtype=self._out_dtype(x, out_dtype)
        )

    def from_numpy(self, a: npt.NDArray[Any]) -> npt.NDArray[Any]:
        return np.asarray(a)

    def to_numpy(self, a: Any) -> npt.NDArray[Any]:
        return np.asarray(a)


def backend() -> ReferenceBackend:
    """Entry-point factory (``reference = "nvfp4.reference_backend:backend"``)."""
    return ReferenceBackend()
