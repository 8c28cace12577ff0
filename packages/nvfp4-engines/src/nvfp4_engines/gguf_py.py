"""``gguf-py``: the ``gguf`` package's own NVFP4 code (``gguf.quants``), as a GGUF user runs it.

What the engine has, and the kernel each becomes:

* ``gguf.quants.dequantize(data, GGMLQuantizationType.NVFP4)`` -> :meth:`dequantize`: the
  tensor's bytes decoded to float32, then multiplied by its ``.scale`` as a GGUF reader
  must (gguf-py leaves the decode global to the caller), then cast to the asked dtype.

What it lacks is absent, not filled in: ``gguf.quants`` has no NVFP4 quantizer
(``gguf.quants.quantize`` raises ``NotImplementedError`` for NVFP4), so there is no
``quantize_activations``; it has no matmul, so no ``qmm`` / ``gather_qmm``.

The bytes gguf-py reads are those of :func:`nvfp4.layouts.gguf.to_gguf`, a lossless
transcode; GGUF needs K to be a multiple of 64, and a fused tensor is held as one GGUF
tensor per partition (:mod:`nvfp4_engines._gguf`).
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np
import numpy.typing as npt
from nvfp4.backend import Frontend
from nvfp4.contract import Availability
from nvfp4.dtypes import OUTPUT_DTYPES
from nvfp4.planes import NVFP4Planes

from ._common import adapter_info, dist_version, numpy_in, numpy_out
from ._gguf import GgufWeight, to_gguf_weight

__all__ = ["DISTRIBUTION", "NAME", "GgufPyKernels", "backend"]

NAME: Final = "gguf-py"
DISTRIBUTION: Final = "gguf"
#: gguf 0.19 is the first release with ``GGMLQuantizationType.NVFP4`` in ``gguf.quants``
#: (0.18.0 ends at MXFP4).
INSTALL: Final = "pip install 'gguf>=0.19'"


class GgufPyKernels:
    """The kernel contract over ``gguf.quants`` (numpy arrays in and out)."""

    def __init__(self) -> None:
        self.info = adapter_info(
            NAME,
            DISTRIBUTION,
            frozenset({"dequantize", "fused_partitions"}),
            (
                "dequantize: gguf.quants.dequantize(data, NVFP4) in float32, times the "
                "tensor's .scale, then cast",
                "absent: gguf.quants has no NVFP4 quantizer and no matmul",
                "fused partitions held as one GGUF tensor per partition (one .scale each)",
            ),
        )

    def availability(self) -> Availability:
        if not dist_version(DISTRIBUTION):
            return Availability(False, f"the gguf package is not installed: {INSTALL}")
        try:
            from gguf.constants import GGMLQuantizationType
            from gguf.quants import _type_traits  # noqa: F401  (the table dequantize reads)
        except Exception as exc:
            return Availability(
                False, f"gguf does not import ({type(exc).__name__}: {exc}): {INSTALL}"
            )
        if not hasattr(GGMLQuantizationType, "NVFP4"):
            return Availability(
                False, f"gguf {dist_version(DISTRIBUTION)} has no NVFP4 type: {INSTALL}"
            )
        return Availability(True, device=f"numpy (gguf {dist_version(DISTRIBUTION)})")

    def prepare(self, planes: NVFP4Planes) -> GgufWeight:
        return to_gguf_weight(planes)

    def dequantize(self, w: GgufWeight, *, dtype: str) -> npt.NDArray[Any]:
        from gguf.constants import GGMLQuantizationType
        from gguf.quants import dequantize

        parts = []
        for t in w.tensors:
            v = dequantize(t.data, GGMLQuantizationType.NVFP4)  # float32 [E?, rows, K]
            scale = t.scale.reshape(-1, 1, 1) if w.num_experts is not None else t.scale[0]
            parts.append(v * scale)  # the .scale a GGUF reader applies, in float32
        out = np.concatenate(parts, axis=-2) if len(parts) > 1 else parts[0]
        with np.errstate(over="ignore"):  # float16 overflow to +-inf is the cast's result
            return out.astype(OUTPUT_DTYPES[dtype])

    def from_numpy(self, a: npt.NDArray[Any]) -> npt.NDArray[Any]:
        return numpy_in(a)

    def to_numpy(self, a: Any) -> npt.NDArray[Any]:
        return numpy_out(a)


def backend() -> Frontend:
    """Entry-point factory (``gguf-py = "nvfp4_engines.gguf_py:backend"``): cheap, never
    raises."""
    return Frontend(GgufPyKernels())
