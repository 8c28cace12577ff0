"""The ``cpu`` backend: the kernel contract (:mod:`nvfp4.contract`) over the compiled C
kernels, and :class:`CPUBackend`, core's verbs over them.

Construction is cheap and never fails (the library is loaded on first use);
:meth:`CPUBackend.availability` says whether it can run here and which instruction set and
thread count it would use. Arrays in and out are numpy (bfloat16 as ``ml_dtypes.bfloat16``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
from nvfp4.backend import Frontend
from nvfp4.contract import Availability, BackendInfo
from nvfp4.planes import NVFP4Planes

from . import ops, plan, w4a8
from ._native import (
    ISA_ENV,
    THREADS_ENV,
    IsaUnavailable,
    Native,
    NativeUnavailable,
    load,
    resolve_isa,
    resolve_threads,
)
from .layout import PreparedWeight, prepare
from .plan import CACHE_ENV

__all__ = ["CAPABILITIES", "PRIORITY", "SPEC_VERSIONS", "CPUBackend", "CPUKernels", "backend"]

#: The NVFP4 spec versions this backend is certified for, named here: never
#: ``nvfp4.SUPPORTED_SPEC_VERSIONS``, which would make it claim every version a newer
#: nvfp4-core adds. A version is added here when it passes its conformance run.
SPEC_VERSIONS: tuple[str, ...] = ("1.0", "1.1", "1.2", "1.3", "1.4", "1.5")

#: Above ``reference`` (0): picked automatically when installed and available.
PRIORITY = 50
CAPABILITIES = frozenset(
    {
        "dequantize",
        "qmm",
        "gather_qmm",
        "fused_partitions",
        "quantize_activations",
        "w4a4",
        "w4a8",
        "w4a8_fp8",
    }
)


def _version() -> str:
    from ._version import __version__

    return __version__


def _kernel(fn: Callable[..., Any], *, isa: bool = True) -> Callable[..., Any]:
    """The kernel method that runs ``fn`` (a function of :mod:`~nvfp4_cpu.ops` or
    :mod:`~nvfp4_cpu.w4a8`) with the object's library, level (where ``fn`` takes one) and
    threads, then the kernel's own arguments. The gather kernels' ``sorted_indices`` hint is
    dropped: the C code groups the rows by expert itself (a stable sort), sorted or not."""

    def kernel(self: CPUKernels, *args: Any, **kwargs: Any) -> Any:
        native, level, threads = self._config()
        kwargs.pop("sorted_indices", None)
        if isa:
            return fn(native, level, threads, *args, **kwargs)
        return fn(native, threads, *args, **kwargs)

    kernel.__name__ = kernel.__qualname__ = fn.__name__
    kernel.__doc__ = fn.__doc__
    return kernel


class CPUKernels:
    """Fused NVFP4 kernels for x86-64 (AVX-512, AVX2), AArch64 (NEON) and any CPU (portable
    C): the kernel contract (:mod:`nvfp4.contract`) on numpy arrays.

    Args:
        isa: ``"portable"``, ``"avx2"``, ``"avx512"`` or ``"neon"`` to force a level; ``None``
            uses ``$NVFP4_CPU_ISA``, else the best level this CPU supports. A level the CPU or the
            build lacks makes :meth:`availability` false and every kernel call raise
            :class:`~nvfp4_cpu.IsaUnavailable` with the reason.
        threads: worker threads per call; ``None`` uses ``$NVFP4_CPU_THREADS``, else the CPUs
            this process may run on.
    """

    def __init__(self, isa: str | None = None, threads: int | None = None) -> None:
        self._isa = isa
        self._threads = threads
        self._resolved: tuple[tuple[str | None, str | None], tuple[Native, str, int]] | None = None
        self.info = BackendInfo(
            name="cpu",
            spec_versions=SPEC_VERSIONS,
            priority=PRIORITY,
            capabilities=CAPABILITIES,
            version=_version(),
            package="nvfp4-cpu",
            notes=(
                "compiled C kernels (AVX-512 / AVX2 / portable, chosen at run time)",
                "W4A16 with float32 accumulation, the global applied after accumulation",
                "W4A4 emulated: bit-exact activation quantization, then the W4A16 kernel",
                "W4A8 int8 native: bit-exact Q8_0 activation quantization in C, exact int32 "
                "block dot products (AVX-512 VNNI vpdpbusd / AVX2 vpmaddubsw / portable C), "
                "float32 accumulation, the global after accumulation",
                "W4A8 FP8 emulated: bit-exact FP8 E4M3 activation encoding in C, exact decode, "
                "a float32 plain-C kernel (exact products, blocked accumulation), input_scale "
                "after accumulation",
            ),
        )

    # ----------------------------------------------------------------- run-time facts
    def _config(self) -> tuple[Native, str, int]:
        """The library, level and threads of a call. Resolved once per value of
        ``$NVFP4_CPU_ISA`` / ``$NVFP4_CPU_THREADS`` (read on every call, so changing them
        takes effect at once): resolving costs a system call and a few checks, which matter
        at decode, where a model makes hundreds of small calls per token."""
        key = (os.environ.get(ISA_ENV), os.environ.get(THREADS_ENV), os.environ.get(CACHE_ENV))
        cached = self._resolved
        if cached is not None and cached[0] == key:
            return cached[1]
        native = load()
        config = (native, resolve_isa(native, self._isa), resolve_threads(self._threads))
        plan.apply(native, config[1])  # the cache plan (one per process; $NVFP4_CPU_CACHE)
        self._resolved = (key, config)
        return config

    @property
    def isa(self) -> str:
        """The instruction-set level calls use (raises when it cannot run here)."""
        return self._config()[1]

    @property
    def threads(self) -> int:
        return resolve_threads(self._threads)

    def availability(self) -> Availability:
        try:
            native, isa, threads = self._config()
        except (NativeUnavailable, IsaUnavailable, ValueError) as exc:
            return Availability(False, str(exc))
        plural = "s" if threads != 1 else ""
        blocking = plan.current(native).describe()
        return Availability(
            True, device=f"{native.describe(isa)}, {threads} thread{plural}; plan: {blocking}"
        )

    # ----------------------------------------------------------------------- kernels
    def prepare(self, planes: NVFP4Planes) -> PreparedWeight:
        """Tile the (validated) planes once."""
        native, _, threads = self._config()
        return prepare(planes, native, threads)

    # Each kernel of the contract is the function of the same name in ops / w4a8, given this
    # object's library, level and threads (core has checked every operand).
    qmm = _kernel(ops.qmm)
    gather_qmm = _kernel(ops.gather_qmm)
    dequantize = _kernel(ops.dequantize)
    quantize_activations = _kernel(ops.quantize_activations, isa=False)
    qmm_w4a4 = _kernel(ops.qmm_w4a4)
    quantize_activations_q8 = _kernel(w4a8.quantize_activations_q8)
    qmm_w4a8 = _kernel(w4a8.qmm_w4a8)
    gather_qmm_w4a8 = _kernel(w4a8.gather_qmm_w4a8)
    quantize_activations_fp8 = _kernel(w4a8.quantize_activations_fp8, isa=False)
    qmm_w4a8_fp8 = _kernel(w4a8.qmm_w4a8_fp8)

    def to_planes(self, w: PreparedWeight) -> NVFP4Planes:
        """The canonical planes of a prepared weight, byte for byte."""
        native, _, threads = self._config()
        return w.to_planes(native, threads)

    def from_numpy(self, a: npt.NDArray[Any]) -> npt.NDArray[Any]:
        return np.asarray(a)

    def to_numpy(self, a: Any) -> npt.NDArray[Any]:
        return np.asarray(a)


class CPUBackend(Frontend):
    """The verbs (checked by core, :class:`nvfp4.Frontend`) over :class:`CPUKernels`, with the
    same arguments; ``isa`` and ``threads`` read through."""

    def __init__(self, isa: str | None = None, threads: int | None = None) -> None:
        super().__init__(CPUKernels(isa, threads))


def backend() -> CPUBackend:
    """Entry-point factory (``cpu = "nvfp4_cpu:backend"``): cheap, never raises."""
    return CPUBackend()
