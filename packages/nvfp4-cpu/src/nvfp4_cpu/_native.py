"""The compiled kernels: finding and loading ``libnvfp4cpu.so`` with :mod:`ctypes`, and the
run-time choices (instruction-set level, thread count).

Nothing here runs at import time. :func:`load` loads the library once (thread-safe), hands
it the spec tables and the encoder's constants from :mod:`nvfp4.spec` (the single source of
truth for the E2M1 and E4M3 values, 6, 448, 2^-9, the E4M3 bias and the NaN byte) and
declares every entry point's C signature. The CPU feature bits are the library's: Python
asks for them by name (``nvfp4cpu_cpu_feature_bit``). A missing or unloadable library is
reported as :class:`NativeUnavailable` with the reason, never as an import error.

Environment:

* ``NVFP4_CPU_ISA`` = ``portable`` | ``avx2`` | ``avx512`` | ``neon``: force a level (a level
  this CPU or this build lacks is refused with a clear error);
* ``NVFP4_CPU_THREADS`` = a positive integer: the default thread count (else the CPUs this
  process may run on);
* ``NVFP4_CPU_LIBRARY`` = a path: load this library instead of the one in the package;
* ``NVFP4_CPU_CACHE`` = e.g. ``l1d=32K,l2=512K,l3=32M``: the caches the blocking is derived
  from, instead of this machine's (:mod:`nvfp4_cpu.plan`).
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from nvfp4.spec import E2M1_BOUNDS, E2M1_ODD_BOUNDS, E2M1_VALUES, E4M3_VALUES, ENCODER_CONSTANTS

__all__ = [
    "ISA_ENV",
    "ISA_LEVELS",
    "LIBRARY_ENV",
    "LIBRARY_NAME",
    "THREADS_ENV",
    "IsaUnavailable",
    "Native",
    "NativeUnavailable",
    "default_threads",
    "load",
    "resolve_isa",
    "resolve_threads",
]

LIBRARY_NAME = "libnvfp4cpu.so"
ISA_ENV = "NVFP4_CPU_ISA"
THREADS_ENV = "NVFP4_CPU_THREADS"
LIBRARY_ENV = "NVFP4_CPU_LIBRARY"
#: ABI version this Python code speaks (``nvfp4cpu_abi_version()``).
ABI_VERSION = 6
#: The AVX2 one-row decodes by name, as nvfp4cpu_avx2_m1_decode numbers them (csrc/nvfp4cpu.h's
#: NV_AVX2_DECODE_AUTO / _F16 / _BF16); 0, "default", only sets.
_AVX2_M1_DECODES = {"default": 0, "float16": 1, "bfloat16 pairs": 2}
#: Instruction-set levels, by their C enum value (index).
ISA_LEVELS: tuple[str, ...] = ("portable", "avx2", "avx512", "neon")

#: What each level needs from the CPU, in words (for refusals).
ISA_REQUIREMENTS = {
    "portable": "nothing (plain C)",
    "avx2": "AVX2, FMA and F16C",
    "avx512": "AVX-512 F, BW and VL (with FMA and F16C)",
    "neon": "AArch64 Advanced SIMD (ASIMD)",
}


class NativeUnavailable(RuntimeError):
    """The compiled library is missing or cannot be loaded here; the message says why."""


class IsaUnavailable(RuntimeError):
    """An instruction-set level was asked for that this CPU or this build cannot run."""


# Every array crosses as a plain address (c_void_p from an int): converting through typed
# ctypes pointers costs microseconds per argument, which shows on small matmuls.
_u8p = _f32p = _i64p = ctypes.c_void_p
_i64, _int = ctypes.c_int64, ctypes.c_int

_SIGNATURES: dict[str, tuple[object, list[object]]] = {
    "nvfp4cpu_abi_version": (_int, []),
    "nvfp4cpu_init": (
        _int,
        [_f32p, _f32p, _f32p, _f32p, ctypes.c_float, ctypes.c_float, ctypes.c_float, _int, _int],
    ),
    "nvfp4cpu_cpu_features": (ctypes.c_uint, []),
    "nvfp4cpu_cpu_feature_bit": (ctypes.c_uint, [ctypes.c_char_p]),
    "nvfp4cpu_isa_compiled": (_int, [_int]),
    "nvfp4cpu_isa_supported": (_int, [_int]),
    "nvfp4cpu_avx2_m1_decode": (_int, [_int]),
    "nvfp4cpu_pool_join_cpu": (_int, []),
    "nvfp4cpu_plan_parse_cache": (_int, [ctypes.c_char_p, _i64p, ctypes.c_char_p, _int]),
    "nvfp4cpu_plan_detect": (_int, [_i64p]),
    "nvfp4cpu_plan_derive": (_int, [_i64p, _i64p]),
    "nvfp4cpu_plan_set": (_int, [_i64p, _int, _i64p]),
    "nvfp4cpu_plan_get": (_int, [_i64p]),
    "nvfp4cpu_qmm": (_int, [_int, _int, _u8p, _u8p, _f32p, _i64, _i64, _f32p, _i64, _f32p]),
    "nvfp4cpu_gather_qmm": (
        _int,
        [_int, _int, _u8p, _u8p, _f32p, _i64, _i64, _i64, _f32p, _i64, _i64p, _f32p],
    ),
    "nvfp4cpu_dequantize": (
        _int,
        [_int, _int, _u8p, _u8p, _f32p, _i64, _i64, _i64, _int, ctypes.c_void_p],
    ),
    "nvfp4cpu_pack": (_int, [_int, _u8p, _u8p, _i64, _i64, _i64, _u8p, _u8p]),
    "nvfp4cpu_unpack": (_int, [_int, _u8p, _u8p, _i64, _i64, _i64, _u8p, _u8p]),
    "nvfp4cpu_quantize_activations": (_int, [_int, _f32p, _i64, _i64, ctypes.c_float, _u8p, _u8p]),
    "nvfp4cpu_finite_absmax": (ctypes.c_float, [_f32p, _i64]),
    "nvfp4cpu_w4a8_kernel_name": (ctypes.c_char_p, [_int]),
    "nvfp4cpu_quantize_q8": (_int, [_int, _int, _f32p, _i64, _i64, _u8p, _u8p]),
    "nvfp4cpu_quantize_fp8": (_int, [_int, _f32p, _i64, ctypes.c_float, _u8p]),
    "nvfp4cpu_qmm_fp8": (_int, [_int, _u8p, _u8p, _f32p, _i64, _i64, _f32p, _i64, _f32p]),
    "nvfp4cpu_qmm_w4a8": (_int, [_int, _int, _u8p, _u8p, _f32p, _i64, _i64, _f32p, _i64, _f32p]),
    "nvfp4cpu_gather_qmm_w4a8": (
        _int,
        [_int, _int, _u8p, _u8p, _f32p, _i64, _i64, _i64, _f32p, _i64, _i64p, _f32p],
    ),
}


def ptr(a: np.ndarray[Any, Any], ctype: object = None) -> int:
    """The address of a C-contiguous array's first element (no copy). ``ctype`` documents the
    element type the C side reads; the address is passed as ``void *``."""
    if not a.flags.c_contiguous:
        raise ValueError("internal: kernels take C-contiguous arrays only")
    return int(a.ctypes.data)


@dataclass(frozen=True)
class Native:
    """The loaded library and the facts about this machine it reports."""

    lib: ctypes.CDLL
    path: Path
    features: int

    def compiled(self, isa: str) -> bool:
        return bool(self.lib.nvfp4cpu_isa_compiled(ISA_LEVELS.index(isa)))

    def has(self, feature: str) -> bool:
        """Whether this CPU has ``feature`` (a name of ``nvfp4cpu_cpu_feature_bit``:
        ``"avx512vnni"``, ``"x86"``, ...); the bit is the library's."""
        bit = int(self.lib.nvfp4cpu_cpu_feature_bit(feature.encode("ascii")))
        if bit == 0:
            raise ValueError(f"nvfp4-cpu: {self.path} knows no CPU feature {feature!r}")
        return bool(self.features & bit)

    def supported(self, isa: str) -> bool:
        return bool(self.lib.nvfp4cpu_isa_supported(ISA_LEVELS.index(isa)))

    def w4a8_kernels(self, isa: str) -> str | None:
        """The W4A8 kernels a level runs here: ``"avx512vnni"`` (the avx512 level on a CPU
        with AVX512_VNNI), ``"avx2"`` (the avx2 level, and avx512 without VNNI) or
        ``"portable"``; ``None`` when the level cannot run."""
        name = self.lib.nvfp4cpu_w4a8_kernel_name(ISA_LEVELS.index(isa))
        return None if name is None else str(name.decode("ascii"))

    def supported_levels(self) -> tuple[str, ...]:
        """Every level this build and this CPU can run, lowest first."""
        return tuple(i for i in ISA_LEVELS if self.supported(i))

    def best_isa(self) -> str:
        return self.supported_levels()[-1]

    def describe(self, isa: str) -> str:
        """The instruction set a level uses here, in words (for availability())."""
        if isa == "avx512":
            extras = [
                name
                for feature, name in (("avx512vnni", "VNNI"), ("avx512bf16", "BF16"))
                if self.has(feature)
            ]
            have = f"; the CPU also has {'/'.join(extras)}" if extras else ""
            return f"x86-64 AVX-512 (F/BW/VL){have}"
        if isa == "avx2":
            return f"x86-64 AVX2 (+FMA/F16C; M = 1 decode: {self.avx2_m1_decode()})"
        if isa == "neon":  # dotprod: the W4A8 kernels use it; the float32 ones need only ASIMD
            return "aarch64 NEON (+dotprod)" if self.has("asimddp") else "aarch64 NEON"
        machine = "x86-64" if self.has("x86") else os.uname().machine
        return f"{machine} portable C"

    def avx2_m1_decode(self, mode: str | None = None) -> str:
        """The decode of the AVX2 level's one-row (M = 1) W4A16 kernel: ``"float16"`` (through
        vcvtph2ps; this CPU's default on Intel) or ``"bfloat16 pairs"`` (elsewhere). ``mode``
        sets it for this process (``"float16"``, ``"bfloat16 pairs"``, or ``"default"``, the
        CPU's own); both give the same bits, so only speed changes. ``""`` where the AVX2
        level cannot run."""
        modes = _AVX2_M1_DECODES
        if mode is not None and mode not in modes:
            raise ValueError(f"avx2_m1_decode: mode must be one of {sorted(modes)}, found {mode!r}")
        got = int(self.lib.nvfp4cpu_avx2_m1_decode(modes[mode] if mode is not None else -1))
        return next((name for name, v in modes.items() if v == got and v), "")

    def check(self, rc: int, what: str) -> None:
        """Turn a C return code into an exception."""
        if rc == 0:
            return
        if rc == -2:
            raise MemoryError(f"nvfp4-cpu {what}: the kernel could not allocate its scratch memory")
        raise RuntimeError(f"nvfp4-cpu {what}: the kernel refused its arguments (code {rc})")


_LOCK = threading.Lock()
_STATE: Native | NativeUnavailable | None = None


def library_path() -> Path:
    """Where the library is looked for: ``$NVFP4_CPU_LIBRARY`` or next to this module."""
    env = os.environ.get(LIBRARY_ENV)
    return Path(env) if env else Path(__file__).with_name(LIBRARY_NAME)


def _load() -> Native:
    path = library_path()
    if not path.exists():
        raise NativeUnavailable(
            f"the compiled kernels ({path}) are missing: reinstall nvfp4-cpu from a wheel or "
            "build them (a C compiler is needed; in a source checkout run "
            "`python packages/nvfp4-cpu/hatch_build.py`)"
        )
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise NativeUnavailable(f"the compiled kernels ({path}) failed to load: {exc}") from None
    for name, (restype, argtypes) in _SIGNATURES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise NativeUnavailable(f"{path} lacks {name}: rebuild nvfp4-cpu") from None
        fn.restype = restype
        fn.argtypes = argtypes
    abi = lib.nvfp4cpu_abi_version()
    if abi != ABI_VERSION:
        raise NativeUnavailable(
            f"{path} has ABI {abi}, this package needs {ABI_VERSION}: rebuild it"
        )
    tables = [
        np.ascontiguousarray(t, dtype=np.float32)
        for t in (E2M1_VALUES, E4M3_VALUES, E2M1_BOUNDS, E2M1_ODD_BOUNDS)
    ]
    e2m1_max, e4m3_max, e4m3_min_sub, e4m3_bias, nan_byte = ENCODER_CONSTANTS
    rc = lib.nvfp4cpu_init(
        *(ptr(t, ctypes.c_float) for t in tables),
        float(e2m1_max),
        float(e4m3_max),
        float(e4m3_min_sub),
        int(e4m3_bias),
        int(nan_byte),
    )
    if rc != 0:
        raise NativeUnavailable(f"{path}: nvfp4cpu_init refused the spec tables")
    return Native(lib=lib, path=path, features=int(lib.nvfp4cpu_cpu_features()))


def load() -> Native:
    """The loaded library (loaded on first call); raises :class:`NativeUnavailable`."""
    global _STATE
    with _LOCK:
        if _STATE is None:
            try:
                _STATE = _load()
            except NativeUnavailable as exc:
                _STATE = exc
    if isinstance(_STATE, NativeUnavailable):
        raise _STATE
    return _STATE


def resolve_isa(native: Native, requested: str | None = None) -> str:
    """The level to run: ``requested``, else ``$NVFP4_CPU_ISA``, else the best this CPU has.
    Raises :class:`IsaUnavailable` for an unknown level or one this CPU / build lacks."""
    source = "requested"
    if requested is None:
        requested = os.environ.get(ISA_ENV) or None
        source = f"${ISA_ENV}"
    if requested is None:
        return native.best_isa()
    if requested not in ISA_LEVELS:
        raise IsaUnavailable(
            f"nvfp4-cpu: {source} instruction set {requested!r} is unknown; "
            f"expected one of {', '.join(ISA_LEVELS)}"
        )
    if not native.compiled(requested):
        raise IsaUnavailable(
            f"nvfp4-cpu: {source} instruction set {requested!r} is not built into {native.path} "
            f"(this machine's build has: {', '.join(i for i in ISA_LEVELS if native.compiled(i))})"
        )
    if not native.supported(requested):
        raise IsaUnavailable(
            f"nvfp4-cpu: {source} instruction set {requested!r} needs "
            f"{ISA_REQUIREMENTS[requested]}, which this CPU lacks; it supports: "
            f"{', '.join(native.supported_levels())}"
        )
    return requested


def default_threads() -> int:
    """``$NVFP4_CPU_THREADS``, else the CPUs this process may run on."""
    env = os.environ.get(THREADS_ENV)
    if env:
        try:
            n = int(env)
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"${THREADS_ENV}: expected a positive integer, found {env!r}")
        return n
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def resolve_threads(requested: int | None = None) -> int:
    """``requested`` (a positive int), else :func:`default_threads`."""
    if requested is None:
        return default_threads()
    if isinstance(requested, bool) or not isinstance(requested, (int, np.integer)) or requested < 1:
        raise ValueError(f"nvfp4-cpu threads: expected a positive integer, found {requested!r}")
    return int(requested)
