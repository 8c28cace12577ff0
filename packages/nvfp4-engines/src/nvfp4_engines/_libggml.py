"""ggml-cpu through ctypes: the prebuilt ``libggml-base`` / ``libggml-cpu`` of the PyPI
package libggml-python (``libggml/lib64``; manylinux_2_28, built without OpenMP), else
llama-cpp-python's bundled copies, or the two libraries of a ggml built from source (a folder
named by ``NVFP4_GGML_LIB_DIR``, which wins over both).

Only what the ``ggml`` adapter and ``benchmarks/cpu_kernels.py`` call is declared here, with
the C signatures of ``ggml.h`` and ``ggml-cpu.h``. Nothing is loaded at import: :func:`load`
finds and opens the libraries once and raises :class:`GgmlUnavailable` with what to install
when it cannot.

Building only ggml's two CPU libraries from llama-cpp-python's source distribution takes a
couple of minutes (the whole wheel takes 18 minutes or more): in its ``vendor/llama.cpp``,
``cmake -S . -B build -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=ON -DLLAMA_CURL=OFF`` then
``cmake --build build --target ggml-base ggml-cpu``, and set ``NVFP4_GGML_LIB_DIR=build/bin``.

A folder may instead hold the per-CPU variants of a backend-DL build, as llama.cpp's own
release binaries ship them (``-DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON
-DGGML_NATIVE=OFF``, targets ``ggml-cpu-haswell``, ``ggml-cpu-zen4``, ...): one
``libggml-base.so`` and a ``libggml-cpu-<variant>.so`` per instruction set. :func:`load`
then takes the variant named, or the one whose ``ggml_backend_score()`` is highest on this
CPU, as ggml's own loader does. Variants are opened ``RTLD_LOCAL``, so several can be open
in one process without one's symbols standing in for another's (``haswell`` is the
AVX2 + FMA + F16C build, what an AVX2-only CPU runs).
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import glob
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from nvfp4.spec import GGUF_TYPE_NVFP4

__all__ = [
    "GGML_TYPE_F32",
    "GGML_TYPE_I32",
    "GGML_TYPE_NVFP4",
    "GGML_TYPE_Q8_0",
    "INSTALL",
    "LIB_DIR_ENV",
    "Cplan",
    "Ggml",
    "GgmlUnavailable",
    "InitParams",
    "load",
]

GGML_TYPE_F32: Final = 0
GGML_TYPE_Q8_0: Final = 8
GGML_TYPE_I32: Final = 26
GGML_TYPE_NVFP4: Final = GGUF_TYPE_NVFP4
#: A folder holding ggml's own ``libggml-base.so`` / ``libggml-cpu.so``, used instead of
#: llama-cpp-python's bundled copies when set.
LIB_DIR_ENV: Final = "NVFP4_GGML_LIB_DIR"
INSTALL: Final = (
    "pip install 'libggml-python==0.20.2.post1' (prebuilt libggml-base and libggml-cpu with "
    "the NVFP4 type, glibc 2.28 and newer), or 'llama-cpp-python>=0.3.36' (its wheel bundles "
    f"them; it builds from source where no wheel fits), or set {LIB_DIR_ENV} to a folder "
    "holding a source build's libggml-base.so / libggml-cpu.so"
)
#: The distributions that carry libggml, in the order :func:`load` looks for them.
DISTRIBUTIONS: Final = ("libggml-python", "llama-cpp-python")


class GgmlUnavailable(RuntimeError):
    """libggml cannot be used here; the message says why and what to install."""


class InitParams(ctypes.Structure):
    """``struct ggml_init_params`` (ggml.h)."""

    _fields_ = [
        ("mem_size", ctypes.c_size_t),
        ("mem_buffer", ctypes.c_void_p),
        ("no_alloc", ctypes.c_bool),
    ]


class Cplan(ctypes.Structure):
    """``struct ggml_cplan`` (ggml-cpu.h)."""

    _fields_ = [
        ("work_size", ctypes.c_size_t),
        ("work_data", ctypes.c_void_p),
        ("n_threads", ctypes.c_int),
        ("threadpool", ctypes.c_void_p),
        ("abort_callback", ctypes.c_void_p),
        ("abort_callback_data", ctypes.c_void_p),
        ("use_ref", ctypes.c_bool),
    ]


#: ``GGML_MAX_N_THREADS`` (ggml.h): the length of a threadpool's CPU mask.
MAX_N_THREADS = 512


class ThreadpoolParams(ctypes.Structure):
    """``struct ggml_threadpool_params`` (ggml.h), filled by ``ggml_threadpool_params_init``."""

    _fields_ = [
        ("cpumask", ctypes.c_bool * MAX_N_THREADS),
        ("n_threads", ctypes.c_int),
        ("prio", ctypes.c_int),  # enum ggml_sched_priority
        ("poll", ctypes.c_uint32),  # 0: idle workers sleep; up to 100: they spin that long
        ("strict_cpu", ctypes.c_bool),
        ("paused", ctypes.c_bool),
    ]


#: ``void (*)(const void * x, float * y, int64_t k)`` and its inverse.
ToFloat = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
FromFloat = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


class TypeTraits(ctypes.Structure):
    """``struct ggml_type_traits`` (ggml.h)."""

    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ToFloat),
        ("from_float_ref", FromFloat),
    ]


class TypeTraitsCpu(ctypes.Structure):
    """``struct ggml_type_traits_cpu`` (ggml-cpu.h)."""

    _fields_ = [
        ("from_float", FromFloat),
        ("vec_dot", ctypes.c_void_p),
        ("vec_dot_type", ctypes.c_int),
        ("nrows", ctypes.c_int64),
    ]


@dataclass(frozen=True)
class Ggml:
    """The opened libraries and the facts the adapter and the benchmark report."""

    base: Any
    cpu: Any
    #: where the libraries come from: "llama-cpp-python 0.3.36" or "ggml 0.25.3 (source build)"
    source: str
    #: the two files, relative to the folder above the package or build folder (no machine path)
    paths: tuple[str, str]
    #: the CPU features this libggml was compiled with (``ggml_cpu_has_*``)
    features: tuple[str, ...]
    #: the backend-DL variant opened (``haswell``, ``zen4``, ...), None for a plain build
    variant: str | None = None

    def traits(self, ggml_type: int) -> TypeTraits:
        t: TypeTraits = self.base.ggml_get_type_traits(ggml_type).contents
        return t

    def threadpool(self, n_threads: int) -> int | None:
        """A pool of ``n_threads`` ggml-cpu workers kept for every graph this process
        computes (``ggml_graph_plan(..., threadpool)``), made on first use and freed at
        exit; ``None`` where the library has no threadpool API (ggml then starts its
        threads for each graph). Without OpenMP (libggml-python's build), starting them
        costs about 15 ms a graph on two cores. Its workers sleep between graphs (``poll``
        0) rather than spin, so they take no core from the rest of the process."""
        return _threadpool(self.base, self.cpu, n_threads)

    def traits_cpu(self, ggml_type: int) -> TypeTraitsCpu:
        t: TypeTraitsCpu = self.cpu.ggml_get_type_traits_cpu(ggml_type).contents
        return t


def _declare(base: Any, cpu: Any) -> None:
    vp, i64, sz, ci = ctypes.c_void_p, ctypes.c_int64, ctypes.c_size_t, ctypes.c_int
    sigs: dict[str, tuple[Any, list[Any]]] = {
        "ggml_init": (vp, [InitParams]),
        "ggml_free": (None, [vp]),
        "ggml_type_name": (ctypes.c_char_p, [ci]),
        "ggml_row_size": (sz, [ci, i64]),
        "ggml_tensor_overhead": (sz, []),
        "ggml_graph_overhead": (sz, []),
        "ggml_new_tensor_1d": (vp, [vp, ci, i64]),
        "ggml_new_tensor_2d": (vp, [vp, ci, i64, i64]),
        "ggml_new_tensor_3d": (vp, [vp, ci, i64, i64, i64]),
        "ggml_get_data": (vp, [vp]),
        "ggml_nbytes": (sz, [vp]),
        "ggml_mul_mat": (vp, [vp, vp, vp]),
        "ggml_mul_mat_id": (vp, [vp, vp, vp, vp]),
        "ggml_mul": (vp, [vp, vp, vp]),
        "ggml_new_graph": (vp, [vp]),
        "ggml_build_forward_expand": (None, [vp, vp]),
        "ggml_get_type_traits": (ctypes.POINTER(TypeTraits), [ci]),
        "ggml_quantize_requires_imatrix": (ctypes.c_bool, [ci]),
        "ggml_quantize_chunk": (sz, [ci, vp, vp, i64, i64, i64, vp]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(base, name)
        fn.restype, fn.argtypes = res, args
    cpu.ggml_cpu_init.restype, cpu.ggml_cpu_init.argtypes = None, []
    cpu.ggml_graph_plan.restype, cpu.ggml_graph_plan.argtypes = Cplan, [vp, ci, vp]
    cpu.ggml_graph_compute.restype = ci
    cpu.ggml_graph_compute.argtypes = [vp, ctypes.POINTER(Cplan)]
    cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(TypeTraitsCpu)
    cpu.ggml_get_type_traits_cpu.argtypes = [ci]
    # the persistent threadpool (ggml 0.0.1300 on; an older library runs without one)
    if hasattr(base, "ggml_threadpool_params_init") and hasattr(cpu, "ggml_threadpool_new"):
        base.ggml_threadpool_params_init.restype = None
        base.ggml_threadpool_params_init.argtypes = [ctypes.POINTER(ThreadpoolParams), ci]
        cpu.ggml_threadpool_new.restype = vp
        cpu.ggml_threadpool_new.argtypes = [ctypes.POINTER(ThreadpoolParams)]
        cpu.ggml_threadpool_free.restype, cpu.ggml_threadpool_free.argtypes = None, [vp]


_POOLS: dict[tuple[int, int], int] = {}


def _threadpool(base: Any, cpu: Any, n_threads: int) -> int | None:
    new = getattr(cpu, "ggml_threadpool_new", None)
    if new is None or not new.argtypes:  # no threadpool API in this library (see _declare)
        return None
    key = (id(cpu), n_threads)
    if key not in _POOLS:
        params = ThreadpoolParams()
        base.ggml_threadpool_params_init(ctypes.byref(params), n_threads)
        params.poll = 0
        pool = cpu.ggml_threadpool_new(ctypes.byref(params))
        if not pool:
            raise RuntimeError(f"ggml_threadpool_new({n_threads} threads) failed")
        _POOLS[key] = int(pool)
        atexit.register(cpu.ggml_threadpool_free, pool)
    return _POOLS[key]


def _library_folder(lib_dir: str | None) -> tuple[Path, str]:
    """The folder to search and what it is: ``lib_dir``, else ``$NVFP4_GGML_LIB_DIR``, else
    the installed libggml package (libggml-python), else the installed llama_cpp package."""
    chosen = lib_dir or os.environ.get(LIB_DIR_ENV)
    if chosen:
        folder = Path(chosen)
        if not folder.is_dir():
            raise GgmlUnavailable(f"{LIB_DIR_ENV}={chosen}: not a folder: {INSTALL}")
        return folder, "source build"
    for module, kind in (("libggml", "libggml-python"), ("llama_cpp", "llama-cpp-python")):
        spec = importlib.util.find_spec(module)
        if spec is not None and spec.submodule_search_locations:
            return Path(next(iter(spec.submodule_search_locations))), kind
    raise GgmlUnavailable(f"neither libggml-python nor llama-cpp-python is installed: {INSTALL}")


def _source(kind: str, base_files: list[str]) -> str:
    if kind in DISTRIBUTIONS:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return f"{kind} {version(kind)}"
        except PackageNotFoundError:
            return f"{kind} (version unknown)"
    # a source build's versioned file names carry ggml's version: libggml-base.so.0.25.3
    versioned = [f for f in base_files if Path(f).name.count(".") > 2]
    ggml_version = Path(versioned[-1]).name.split(".so.", 1)[1] if versioned else "version unknown"
    return f"ggml {ggml_version} (source build)"


#: ``libggml-cpu-<variant>.so``: one CPU variant of a backend-DL build
_VARIANT_PREFIX: Final = "libggml-cpu-"


def _variants(folder: Path) -> dict[str, str]:
    """The backend-DL CPU variants under ``folder``: name -> file."""
    found: dict[str, str] = {}
    for f in sorted(glob.glob(str(folder / "**" / f"{_VARIANT_PREFIX}*.so"), recursive=True)):
        found.setdefault(Path(f).name[len(_VARIANT_PREFIX) : -len(".so")], f)
    return found


def _open_variant(path: str) -> Any:
    """One variant library, its symbols kept local (see the module's docstring)."""
    return ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)


def _pick_variant(folder: Path, variants: dict[str, str], wanted: str | None) -> tuple[str, Any]:
    """The variant ``wanted`` (checked to exist by :func:`load`), or the best-scoring one this
    CPU runs: (name, library)."""
    if wanted is not None:
        return wanted, _open_variant(variants[wanted])
    scored = []
    for name, path in variants.items():
        libv = _open_variant(path)
        score_fn = getattr(libv, "ggml_backend_score", None)
        if score_fn is None:
            continue
        score_fn.restype, score_fn.argtypes = ctypes.c_int, []
        scored.append((int(score_fn()), name, libv))
    runnable = [s for s in scored if s[0] > 0]
    if not runnable:
        raise GgmlUnavailable(
            f"{folder}: none of the CPU variants {sorted(variants)} runs on this CPU "
            f"(ggml_backend_score 0 or absent in each): {INSTALL}"
        )
    _, name, libv = max(runnable, key=lambda s: s[0])
    return name, libv


@functools.lru_cache(maxsize=8)
def load(lib_dir: str | None = None, variant: str | None = None) -> Ggml:
    """Open libggml once per (folder, variant) (cached), or raise :class:`GgmlUnavailable`:
    from ``lib_dir``, else ``$NVFP4_GGML_LIB_DIR``, else libggml-python's prebuilt libraries,
    else llama-cpp-python's bundled copies.
    ``variant`` names a backend-DL CPU variant (``haswell``); None takes the folder's plain
    ``libggml-cpu.so``, or its best-scoring variant when it holds variants only."""
    folder, kind = _library_folder(lib_dir)
    base_so = sorted(glob.glob(str(folder / "**" / "libggml-base.so*"), recursive=True))
    cpu_so = sorted(glob.glob(str(folder / "**" / "libggml-cpu.so*"), recursive=True))
    variants = _variants(folder)
    if not base_so or not (cpu_so or variants):
        raise GgmlUnavailable(f"libggml-base / libggml-cpu not found under {folder}: {INSTALL}")
    if variant is not None and variant not in variants:
        raise GgmlUnavailable(
            f"{folder}: no {_VARIANT_PREFIX}{variant}.so (CPU variants found: "
            f"{', '.join(sorted(variants)) or 'none, not a backend-DL build'}): {INSTALL}"
        )
    chosen: str | None = None
    try:
        base = ctypes.CDLL(base_so[0], mode=ctypes.RTLD_GLOBAL)
        if cpu_so and variant is None:
            cpu_path = cpu_so[0]
            cpu = ctypes.CDLL(cpu_path, mode=ctypes.RTLD_GLOBAL)
        else:
            chosen, cpu = _pick_variant(folder, variants, variant)
            cpu_path = variants[chosen]
        _declare(base, cpu)
    except (OSError, AttributeError) as exc:
        raise GgmlUnavailable(
            f"libggml does not load ({type(exc).__name__}: {exc}): {INSTALL}"
        ) from exc
    cpu.ggml_cpu_init()
    name = base.ggml_type_name(GGML_TYPE_NVFP4)
    if name is None or name.decode().lower() != "nvfp4":
        raise GgmlUnavailable(
            f"this libggml's type {GGML_TYPE_NVFP4} is {name!r}, not nvfp4: {INSTALL}"
        )
    features = tuple(
        f
        for f in (
            "avx2",
            "fma",
            "avx512",
            "avx512_vnni",
            "avx512_bf16",
            "avx_vnni",
            "amx_int8",
            "llamafile",
            "neon",
            "dotprod",
        )
        if getattr(cpu, f"ggml_cpu_has_{f}", None) is not None and cpu[f"ggml_cpu_has_{f}"]()
    )
    paths = (
        str(Path(base_so[0]).relative_to(folder.parent)),
        str(Path(cpu_path).relative_to(folder.parent)),
    )
    return Ggml(base, cpu, _source(kind, base_so), paths, features, chosen)
