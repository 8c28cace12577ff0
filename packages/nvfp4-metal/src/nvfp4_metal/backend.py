"""The ``metal`` backend: the :class:`nvfp4.backend.Backend` contract on MLX.

Constructing it imports nothing heavy and never fails; :meth:`MetalBackend.availability`
imports MLX (once), runs a tiny ``nvfp4`` matmul and names the device honestly: "Apple Metal
GPU (...)" on Apple silicon, "MLX CPU device (Linux ...)" where MLX runs on the CPU.

Priority 40 on Apple silicon (the native backend there) and 10 elsewhere: below the
``cpu`` backend's 50 on x86 (MLX's CPU kernels are a functional path, not a fast one), above
``reference``'s 0.

Arrays in and out of the verbs are ``mx.array`` (numpy is accepted and converted);
:meth:`from_numpy` / :meth:`to_numpy` convert for the suite (bfloat16 as
``ml_dtypes.bfloat16``).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt
from nvfp4.backend import Availability, BackendInfo
from nvfp4.planes import NVFP4Planes, validate
from nvfp4.spec import SUPPORTED_SPEC_VERSIONS

from ._mlx import is_apple_silicon, probe, require
from .settings import IMPL_ENV, W4A4_ENV, Impl, resolve_impl, w4a4_opt_in

__all__ = ["NATIVE_CAPABILITIES", "PRIORITY_APPLE", "PRIORITY_OTHER", "MetalBackend", "backend"]

PRIORITY_APPLE = 40
PRIORITY_OTHER = 10
NATIVE_CAPABILITIES = frozenset(
    {"dequantize", "qmm", "gather_qmm", "fused_partitions", "quantize_activations"}
)


def _version() -> str:
    from . import __version__

    return __version__


class MetalBackend:
    """NVFP4 on MLX.

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
            spec_versions=SUPPORTED_SPEC_VERSIONS,
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

    def _handle(self, w: Any) -> Any:
        """A prepared weight, or planes (validated first: a malformed plane is refused with
        a PlaneError before anything reads it) prepared now."""
        from .transcode import MetalWeight

        if isinstance(w, MetalWeight):
            return w
        return self.prepare(w)

    # -------------------------------------------------------------------------- verbs
    def prepare(self, planes: NVFP4Planes) -> Any:
        """Validate (structure, then content) and transcode once (see
        :mod:`nvfp4_metal.transcode`)."""
        validate(planes)
        self._ops()
        from .transcode import prepare

        return prepare(planes, impl=self.impl)

    def qmm(self, x: Any, w: Any, *, out_dtype: Any = None) -> Any:
        ops = self._ops()
        return ops.qmm(x, self._handle(w), out_dtype=out_dtype)

    def gather_qmm(
        self,
        x: Any,
        w: Any,
        expert_ids: Any,
        *,
        sorted_indices: bool = False,
        out_dtype: Any = None,
    ) -> Any:
        ops = self._ops()
        return ops.gather_qmm(
            x, self._handle(w), expert_ids, sorted_indices=sorted_indices, out_dtype=out_dtype
        )

    def dequantize(self, w: Any, dtype: Any = "float32") -> Any:
        ops = self._ops()
        return ops.dequantize(self._handle(w), dtype)

    def quantize_activations(self, x: Any, input_scale: Any = None) -> NVFP4Planes:
        ops = self._ops()
        planes: NVFP4Planes = ops.quantize_activations(x, input_scale)
        return planes

    def qmm_w4a4(self, x: Any, w: Any, *, input_scale: Any = None, out_dtype: Any = None) -> Any:
        if "w4a4" not in self.info.capabilities:
            handle = self._handle(w)  # malformed planes are still refused as such
            raise NotImplementedError(
                f"qmm_w4a4({handle.name!r}): the metal backend does not declare w4a4 here "
                f"({self.info.notes[-1]})"
            )
        ops = self._ops()
        return ops.qmm_w4a4(x, self._handle(w), input_scale=input_scale, out_dtype=out_dtype)

    def to_planes(self, w: Any) -> NVFP4Planes:
        """The canonical planes of a native prepared weight, byte for byte."""
        self._ops()
        from .transcode import to_planes

        return to_planes(w)

    def from_numpy(self, a: npt.NDArray[Any]) -> Any:
        mx = require()
        return mx.array(np.asarray(a))

    def to_numpy(self, a: Any) -> npt.NDArray[Any]:
        mx = require()
        if isinstance(a, mx.array):
            if a.dtype == mx.bfloat16:
                return np.array(a.view(mx.uint16)).view(ml_dtypes.bfloat16)
            return np.array(a)
        return np.asarray(a)


def backend() -> MetalBackend:
    """Entry-point factory (``metal = "nvfp4_metal:backend"``): cheap, never raises."""
    return MetalBackend()
