"""The ``metal`` backend: the kernel contract (:mod:`nvfp4.contract`) on MLX, and
:class:`MetalBackend`, core's verbs over it.

Constructing it imports nothing heavy and never fails; :meth:`MetalBackend.availability`
imports MLX (once), runs a tiny ``nvfp4`` matmul and names the device honestly: "Apple Metal
GPU (...)" on Apple silicon, "MLX CPU device (Linux ...)" where MLX runs on the CPU.

Priority 40 on Apple silicon (the native backend there) and 10 elsewhere: below the
``cpu`` backend's 50 on x86 (MLX's CPU kernels are a functional path, not a fast one), above
``reference``'s 0.

Arrays in and out of the verbs are ``mx.array`` (core accepts numpy and converts it);
:meth:`from_numpy` / :meth:`to_numpy` convert for the suite (bfloat16 as
``ml_dtypes.bfloat16``).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt
from nvfp4.backend import Frontend
from nvfp4.contract import Availability, BackendInfo
from nvfp4.planes import NVFP4Planes

from ._mlx import is_apple_silicon, probe, require
from .settings import IMPL_ENV, W4A4_ENV, Impl, resolve_impl, w4a4_opt_in

__all__ = [
    "NATIVE_CAPABILITIES",
    "PRIORITY_APPLE",
    "PRIORITY_OTHER",
    "SPEC_VERSIONS",
    "MetalBackend",
    "MetalKernels",
    "backend",
]

#: The NVFP4 spec versions this backend is certified for, named here: never
#: ``nvfp4.SUPPORTED_SPEC_VERSIONS``, which would make it claim every version a newer
#: nvfp4-core adds. A version is added here when it passes its conformance run.
SPEC_VERSIONS: tuple[str, ...] = ("1.0", "1.1", "1.2", "1.3", "1.4", "1.5")
PRIORITY_APPLE = 40
PRIORITY_OTHER = 10
NATIVE_CAPABILITIES = frozenset(
    {"dequantize", "qmm", "gather_qmm", "fused_partitions", "quantize_activations"}
)


def _version() -> str:
    from ._version import __version__

    return __version__


class MetalKernels:
    """NVFP4 on MLX: the kernel contract (:mod:`nvfp4.contract`) on ``mx.array``.

    Args:
        impl: ``"native"`` or ``"affine"`` (the comparison rollback, see
            :mod:`nvfp4_metal.settings`); ``None`` reads ``$NVFP4_METAL_IMPL``. An invalid
            value does not raise here: :meth:`availability` reports it and the verbs raise.
    """

    def __init__(self, impl: str | None = None) -> None:
        import os

        self._impl_error = ""
        chosen: Impl = "native"
        try:
            chosen = resolve_impl(impl if impl is not None else os.environ.get(IMPL_ENV))
        except ValueError as exc:
            self._impl_error = str(exc)
        self.impl: Impl = chosen
        apple = is_apple_silicon()
        w4a4 = apple and w4a4_opt_in() and chosen == "native"
        if chosen == "affine":
            caps: frozenset[str] = frozenset()
            notes: tuple[str, ...] = (
                f"{IMPL_ENV}=affine: the comparison rollback (dense decode, bfloat16, MLX affine "
                "4-bit re-quantization); lossy, so no capability is declared",
            )
        else:
            caps = NATIVE_CAPABILITIES | ({"w4a4"} if w4a4 else frozenset())
            notes = (
                "MLX mode='nvfp4' kernels on the checkpoint's own bytes: codes viewed as uint32 "
                "words, E4M3 scale bytes unchanged, no dense matrix at load",
                "the decode global is a float32 sidecar applied after accumulation (per row for "
                "fused partitions, gathered per row for experts); float32 compute, one cast",
                "activation encoder in MLX element-wise ops, bit-identical to the reference",
                (
                    f"W4A4 through mx.qqmm declared by {W4A4_ENV}=1 (not certified by this "
                    "project on Apple hardware)"
                    if w4a4
                    else "W4A4 not declared: MLX's CPU qqmm ignores global scales (M = 1 "
                    f"only); on Metal it is opt-in ({W4A4_ENV}=1)"
                ),
            )
        self.info = BackendInfo(
            name="metal",
            spec_versions=SPEC_VERSIONS,
            priority=PRIORITY_APPLE if apple else PRIORITY_OTHER,
            capabilities=caps,
            version=_version(),
            package="nvfp4-metal",
            notes=notes,
        )

    # ------------------------------------------------------------------ run-time facts
    def availability(self) -> Availability:
        if self._impl_error:
            return Availability(False, self._impl_error)
        p = probe()
        if not p.ok:
            return Availability(False, p.reason)
        suffix = f", MLX {p.version}" + (", affine rollback" if self.impl == "affine" else "")
        return Availability(True, device=p.device + suffix)

    def _ops(self) -> Any:
        if self._impl_error:
            raise ValueError(self._impl_error)
        require()
        from . import ops

        return ops

    # ------------------------------------------------------------------------ kernels
    def prepare(self, planes: NVFP4Planes) -> Any:
        """Transcode validated planes once (see :mod:`nvfp4_metal.transcode`)."""
        self._ops()
        from .transcode import prepare

        return prepare(planes, impl=self.impl)

    def qmm(self, x: Any, w: Any, *, out_dtype: str) -> Any:
        return self._ops().qmm(x, w, out_dtype=out_dtype)

    def gather_qmm(
        self, x: Any, w: Any, expert_ids: Any, *, sorted_indices: bool, out_dtype: str
    ) -> Any:
        return self._ops().gather_qmm(
            x, w, expert_ids, sorted_indices=sorted_indices, out_dtype=out_dtype
        )

    def dequantize(self, w: Any, *, dtype: str) -> Any:
        return self._ops().dequantize(w, dtype)

    def quantize_activations(self, x: Any, *, input_scale: float | None) -> NVFP4Planes:
        planes: NVFP4Planes = self._ops().quantize_activations(x, input_scale)
        return planes

    def qmm_w4a4(self, x: Any, w: Any, *, input_scale: float | None, out_dtype: str) -> Any:
        return self._ops().qmm_w4a4(x, w, input_scale=input_scale, out_dtype=out_dtype)

    def to_planes(self, w: Any) -> NVFP4Planes:
        """The canonical planes of a native prepared weight, byte for byte."""
        self._ops()
        from .transcode import to_planes

        return to_planes(w)

    def from_numpy(self, a: npt.NDArray[Any]) -> Any:
        mx = require()
        from .transcode import mlx_ready

        return mx.array(mlx_ready(a))  # MLX takes no negative strides

    def to_numpy(self, a: Any) -> npt.NDArray[Any]:
        mx = require()
        if isinstance(a, mx.array):
            if a.dtype == mx.bfloat16:
                return np.array(a.view(mx.uint16)).view(ml_dtypes.bfloat16)
            return np.array(a)
        return np.asarray(a)


class MetalBackend(Frontend):
    """Core's verbs (:class:`nvfp4.Frontend`) over :class:`MetalKernels`, with the same
    arguments; ``impl`` reads through."""

    def __init__(self, impl: str | None = None) -> None:
        super().__init__(MetalKernels(impl))


def backend() -> MetalBackend:
    """Entry-point factory (``metal = "nvfp4_metal:backend"``): cheap, never raises."""
    return MetalBackend()
