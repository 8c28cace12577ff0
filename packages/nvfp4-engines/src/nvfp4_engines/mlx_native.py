"""``mlx-native``: MLX's own ``mode="nvfp4"`` operations, called as an MLX user calls them.

What the engine has, and the kernel each becomes:

* ``mx.dequantize(w, scales, mode="nvfp4")`` -> :meth:`dequantize`;
* ``mx.quantized_matmul(x, w, scales, transpose=True, mode="nvfp4")`` -> :meth:`qmm`;
* ``mx.gather_qmm(x, w, scales, rhs_indices=ids, transpose=True, mode="nvfp4")`` ->
  :meth:`gather_qmm`;
* ``mx.quantize(x, mode="nvfp4", global_scale=amax)`` -> :meth:`quantize_activations`.

``mx.gather_qmm`` reads out of bounds for an expert id outside ``[0, E)`` (a crash, not the
spec's zero row), so such ids are refused here with a ``ValueError`` before MLX sees them.

MLX's matmuls take no decode global, so the global is applied as an MLX user must: a
multiply of the output after the call (per row for fused partitions, gathered by expert id
for ``gather_qmm``), in float32, then one cast to the asked dtype. ``x`` goes in with its
own dtype, as a caller's activations would. MLX's ``global_scale`` argument of
``mx.quantize`` is the tensor's amax, which MLX leaves to its caller (it decodes with
``global_scale / 2688``): the dynamic case passes the amax the spec defines, over the finite
values of x, computed with MLX ops; a static input scale ``s`` passes ``s * 2688``
(:func:`nvfp4.layouts.mlx.mlx_global_scale_arg`), and the planes carry the global MLX
decodes with.

The weight MLX reads is :func:`nvfp4.layouts.mlx.to_mlx` of the planes (a view of the code
bytes as uint32 words, the scale bytes unchanged).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import ml_dtypes
import numpy as np
import numpy.typing as npt
from nvfp4.backend import Frontend
from nvfp4.layouts.mlx import MLXPlanes, from_mlx, mlx_global_scale_arg, to_mlx
from nvfp4.planes import NVFP4Planes
from nvfp4.spec import BLOCK_SIZE, GLOBAL_AMAX_DIVISOR

from ._common import EngineKernels, cached_probe, require

__all__ = ["DISTRIBUTION", "NAME", "MlxNativeKernels", "MlxWeight", "backend"]

NAME: Final = "mlx-native"
DISTRIBUTION: Final = "mlx"
#: MLX 0.30 is the first release with ``mode="nvfp4"``.
INSTALL: Final = "pip install 'mlx[cpu]>=0.30' on Linux, 'mlx>=0.30' on macOS"
#: Keyword arguments of every MLX nvfp4 call.
NVFP4: Final = {"group_size": BLOCK_SIZE, "bits": 4, "mode": "nvfp4"}


@dataclass(frozen=True)
class MlxWeight:
    """A prepared weight: MLX's words and scale bytes, and the float32 decode global of
    every row (``[N]`` or ``[E, N]``), all ``mx.array``."""

    weight: Any
    scales: Any
    row_global: Any


def _check() -> str:
    import mlx.core as mx

    x = mx.ones((1, 2 * BLOCK_SIZE), dtype=mx.float32)
    wq, s = mx.quantize(x, **NVFP4)[:2]
    mx.eval(mx.quantized_matmul(x, wq, s, transpose=True, **NVFP4))
    return f"MLX {mx.__version__}, {mx.default_device()}"


_probe = cached_probe("MLX", DISTRIBUTION, INSTALL, "an nvfp4 matmul", _check)


def _mx() -> Any:
    require(NAME, _probe())
    import mlx.core as mx

    return mx


def _dtype(mx: Any, name: str) -> Any:
    return {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}[name]


class MlxNativeKernels(EngineKernels):
    """The kernel contract over ``mlx.core`` (``mx.array`` in and out)."""

    NAME = NAME
    DISTRIBUTION = DISTRIBUTION
    probe = staticmethod(_probe)
    CAPABILITIES = frozenset(
        {"dequantize", "qmm", "gather_qmm", "fused_partitions", "quantize_activations"}
    )
    NOTES = (
        "mx.dequantize / mx.quantized_matmul / mx.gather_qmm / mx.quantize, "
        "mode='nvfp4', x in its own dtype",
        "the decode global multiplied into the output after each call (MLX's "
        "matmuls take none), float32, then one cast",
        "quantize: mx.quantize with global_scale = amax (dynamic) or "
        "input_scale * 2688 (static); MLX decodes with global_scale / 2688",
        "ids outside [0, E) refused before mx.gather_qmm, which reads out of bounds for them",
    )

    def prepare(self, planes: NVFP4Planes) -> MlxWeight:
        mx = _mx()
        mp = to_mlx(planes)
        return MlxWeight(mx.array(mp.weight), mx.array(mp.scales), mx.array(planes.row_global()))

    def dequantize(self, w: MlxWeight, *, dtype: str) -> Any:
        mx = _mx()
        v = mx.dequantize(w.weight, w.scales, dtype=mx.float32, **NVFP4)
        return (v * w.row_global[..., None]).astype(_dtype(mx, dtype))

    def qmm(self, x: Any, w: MlxWeight, *, out_dtype: str) -> Any:
        mx = _mx()
        y = mx.quantized_matmul(x, w.weight, w.scales, transpose=True, **NVFP4)
        return (y.astype(mx.float32) * w.row_global).astype(_dtype(mx, out_dtype))

    def gather_qmm(
        self, x: Any, w: MlxWeight, expert_ids: Any, *, sorted_indices: bool, out_dtype: str
    ) -> Any:
        mx = _mx()
        e = int(w.weight.shape[0])
        bad = (expert_ids < 0) | (expert_ids >= e)
        if bool(mx.any(bad)):
            i = int(mx.argmax(bad))
            raise ValueError(
                f"gather_qmm: expert id {int(expert_ids[i])} at row {i} is outside [0, {e}): "
                "mx.gather_qmm indexes with it unchecked (out-of-bounds read, a crash)"
            )
        ids = expert_ids.astype(mx.uint32)
        y = mx.gather_qmm(
            x[:, None, :],
            w.weight,
            w.scales,
            None,
            rhs_indices=ids,
            transpose=True,
            sorted_indices=sorted_indices,
            **NVFP4,
        )[:, 0, :]
        return (y.astype(mx.float32) * w.row_global[ids]).astype(_dtype(mx, out_dtype))

    def quantize_activations(self, x: Any, *, input_scale: float | None) -> NVFP4Planes:
        mx = _mx()
        if input_scale is None:  # MLX takes the amax from its caller: the spec's, finite values
            x32 = x.astype(mx.float32)
            amax = mx.max(mx.where(mx.isfinite(x32), mx.abs(x32), 0.0))
        else:
            amax = mx.array(mlx_global_scale_arg(np.float32(input_scale)))
        wq, scales = mx.quantize(x, global_scale=amax, **NVFP4)[:2]
        decode_global = amax / mx.array(np.float32(GLOBAL_AMAX_DIVISOR))  # what MLX decodes with
        mx.eval(wq, scales, decode_global)
        planes = MLXPlanes(
            weight=np.array(wq),
            scales=np.array(scales),
            global_scale=np.array(decode_global, dtype=np.float32),
            name="activation",
        )
        return from_mlx(planes)

    def from_numpy(self, a: npt.NDArray[Any]) -> Any:
        mx = _mx()
        a = np.asarray(a)
        if a.dtype == ml_dtypes.bfloat16:
            return mx.array(a.view(np.uint16)).view(mx.bfloat16)
        return mx.array(a)

    def to_numpy(self, a: Any) -> npt.NDArray[Any]:
        mx = _mx()
        if isinstance(a, mx.array):
            if a.dtype == mx.bfloat16:
                return np.array(a.view(mx.uint16)).view(ml_dtypes.bfloat16)
            return np.array(a)
        return np.asarray(a)


def backend() -> Frontend:
    """Entry-point factory (``mlx-native = "nvfp4_engines.mlx_native:backend"``): cheap,
    never raises."""
    return Frontend(MlxNativeKernels())
