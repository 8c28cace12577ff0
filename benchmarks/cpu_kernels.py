"""CPU NVFP4 kernels side by side, every arm in one process.

Arms (all capped at the same thread count, outputs pre-allocated where the API allows):

* ``ours``        - nvfp4-cpu W4A16, hot and cold, once per ISA level (``--isa``; default
                    every level this CPU runs, so AVX2 is measured on an AVX-512 machine too);
* ``ours_w4a8``   - nvfp4-cpu W4A8 (spec 1.1 ``w4a8``: Q8_0 activations, quantized inside the
                    timed call), per ISA level, where the backend declares the capability;
                    checked against ``nvfp4.reference.qmm_w4a8`` before timing;
* ``numpy``       - the numpy reference: ``nvfp4.reference.dequantize`` then a float32 matmul,
                    every call (what a backend without a fused kernel does);
* ``torch_f32``   - torch dense float32 matmul on the decoded weights (hot and cold);
* ``torch_bf16``  - torch dense bfloat16 matmul (hot and cold);
* ``torch_f32_avx2`` - torch dense float32 matmul capped at AVX2 (MKL, oneDNN and ATen), in a
                    child process (``torch_capped.py``), at the prefill sizes (M >= 128), on a
                    CPU that runs a wider level: our AVX2 level's P goals compare against it,
                    as an AVX2-only CPU's torch runs that code (``torch_f32`` beside it as
                    context);
* ``mlx``         - MLX's CPU ``quantized_matmul(mode="nvfp4")``;
* ``ggml``        - ggml-cpu's NVFP4 path through the libggml-base / libggml-cpu that
                    llama-cpp-python bundles, called with ctypes: the graph
                    ``ggml_mul(ggml_mul_mat(w, x), scale)`` (llama.cpp's ``build_lora_mm``) on
                    a type-40 weight whose bytes are ``to_gguf`` of the same planes, the
                    ``.scale`` multiply inside the timed call, work buffer preallocated, same
                    thread count. ggml quantizes activations to Q8_0 (numerically W4A8): its
                    output is checked against ``nvfp4.reference`` on Q8_0-rounded x (spec
                    W4A16 float32 tolerance) and on the same x (W4A8 error, recorded apart).
                    Optional: skipped, and said so, when llama-cpp-python is not installed.
                    On a backend-DL build (per-CPU variants, as llama.cpp's releases ship) this
                    is the variant ggml itself picks for this CPU;
* ``ggml_avx2``   - the same on that build's ``haswell`` variant (AVX2 + FMA + F16C, what an
                    AVX2-only CPU runs), when the build has it: our AVX2 level's C2 / C3 / A2
                    goals compare against it, so that an AVX-512 machine measures both sides
                    of an AVX2-only one (the best variant stays beside it as context).

Shapes: S = 4096 x 4096 (LLC-resident), L = 14336 x 8192 (dense formats DRAM-sized), each at
M = 1, 8, 32, 128, 512 (``--ms``), plus a cold variant of L that rotates through more than 1 GB
of weights. The context arms that cannot matter at prefill sizes (numpy, MLX's single-threaded
CPU kernel, the portable C level, cold variants) stop at M = 32 (:data:`CONTEXT_MAX_M`). A
read-bandwidth probe (nvfp4-cpu's STREAM-style read, widest loads, same thread cap) runs in
the same process. The arms of one (shape, M) point run back to back, in ``--rounds`` rounds
(default 7): in each round every arm gets an idle pause, a warm-up call and ``--reps`` timed
calls (>= 5) in one burst, more where those take less than ``--burst-s`` (default 0.05 s;
:data:`BURST_S`). Each figure is the median over all its rounds' calls, so a slow
spell of the shared machine that covers one arm's burst does not decide a ratio, and machine
drift hits the arms of a point alike. Such a spell can outlast a burst of a few calls and
hit one arm, not its neighbours (on a 2-vCPU EPYC: ours at S, M = 32 took 11.2 ms in every call of one round
and 7.1-8.7 ms in the other two; ggml's AVX2 arm at L, M = 1 took 7.5 ms in one round and
4.6-5.1 ms in the others). With 3 rounds two slow bursts of an arm move its median; with 7
it takes four. Each goal's verdict is on the ratio of medians; the same ratio from each
arm's fastest call stands beside it, and the two differ where one arm had more slow bursts.

Writes ``benchmarks/results/cpu_kernels.json`` and ``docs/benchmark_results/cpu_kernels.md``
(+ ``cpu_kernels.png`` when matplotlib is installed). ``--quick`` runs small shapes into
``*_quick`` files (a smoke test, not a measurement).

    python benchmarks/cpu_kernels.py [--threads 2] [--reps 5] [--rounds 7] [--burst-s 0.05]
                                     [--isa all] [--ms 1,8,32,128,512] [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys

# Thread caps before numpy / torch / mlx load their thread pools.
_THREADS = 2
for _i, _a in enumerate(sys.argv):
    if _a == "--threads" and _i + 1 < len(sys.argv):
        _THREADS = int(sys.argv[_i + 1])
for _var in (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
):
    os.environ[_var] = str(_THREADS)
os.environ["NVFP4_CPU_THREADS"] = str(_THREADS)

import ctypes  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import nvfp4  # noqa: E402
import nvfp4_cpu  # noqa: E402
from machine import cpu_model, dist_version, simd_flags  # noqa: E402
from nvfp4 import reference  # noqa: E402
from nvfp4.layouts.gguf import to_gguf  # noqa: E402
from nvfp4.spec import GGUF_TYPE_NVFP4  # noqa: E402
from nvfp4.tolerances import tolerance  # noqa: E402
from nvfp4_cpu import ops, w4a8  # noqa: E402
from nvfp4_cpu import plan as cpu_plan  # noqa: E402
from nvfp4_cpu._native import load  # noqa: E402
from nvfp4_cpu.layout import PreparedWeight  # noqa: E402
from plotting import pyplot  # noqa: E402
from read_probe import read_probe  # noqa: E402
from torch_capped import CappedTorch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
COLD_BYTES = 1_100_000_000  # > 1 GB rotated in every cold variant (L3 here: 260-300 MiB)
#: Largest M of the context arms (numpy, MLX, our portable C level, cold variants): at prefill
#: sizes they only cost minutes (MLX's CPU kernel does ~4 GFLOP/s on one thread).
CONTEXT_MAX_M = 32


# ---------------------------------------------------------------------------- timing
def measure(fn: Callable[[int], Any], reps: int, warmup: int = 1) -> list[float]:
    """Seconds of ``reps`` calls ``fn(i)`` after ``warmup`` untimed ones."""
    for i in range(warmup):
        fn(i)
    times = []
    for i in range(reps):
        t0 = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t0)
    return times


@dataclasses.dataclass
class Row:
    arm: str
    shape: str
    n: int
    k: int
    m: int
    variant: str  # "hot" or "cold"
    weight_bytes: int  # bytes of weights one call reads (the arm's own format)
    times: list[float]
    note: str = ""
    isa: str = ""  # our ISA level, for the arms of ours

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    def as_dict(self) -> dict[str, Any]:
        t = self.median
        return {
            "arm": self.arm,
            "shape": self.shape,
            "n": self.n,
            "k": self.k,
            "m": self.m,
            "variant": self.variant,
            "median_s": t,
            "min_s": min(self.times),
            "times_s": self.times,
            "gflops": 2 * self.m * self.n * self.k / t / 1e9,
            "weight_bytes": self.weight_bytes,
            "weight_gbps": self.weight_bytes / t / 1e9,
            "note": self.note,
            "isa": self.isa,
        }


# ---------------------------------------------------------------------------- weights
def random_planes(n: int, k: int, seed: int) -> nvfp4.NVFP4Planes:
    """Random codes (all 16 values) and realistic scale bytes (E4M3 0.5 .. 4), global 0.01.
    Kernel speed does not depend on the values; quantizing 117 M floats would only cost time."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    scales = rng.integers(0x30, 0x48, (n, k // 16), dtype=np.uint8)
    return nvfp4.NVFP4Planes(codes, scales, np.array(0.01, np.float32), name=f"w{n}x{k}")


def copies(pw: PreparedWeight, count: int) -> list[PreparedWeight]:
    """``count`` distinct copies of a prepared weight (distinct memory, for cold runs)."""
    return [pw] + [
        dataclasses.replace(pw, codes=pw.codes.copy(), scales=pw.scales.copy())
        for _ in range(count - 1)
    ]


# ------------------------------------------------------------------------------ ggml
GGML_TYPE_F32 = 0
#: W4A8 sanity bound for ggml against the W4A16 reference on the SAME x (no spec number bounds
#: that: spec 1.1's ``w4a8`` tolerance is against the W4A8 reference). Q8_0 rounds each activation to 1/254 of its 32-block's amax; for
#: normal x that is about 0.5 % of a typical output, so max|err| / max|ref| sits near 5e-3.
GGML_W4A8_BOUND = 2e-2


def links_openmp(library: str) -> bool:
    """Whether the shared library at ``library`` was built with OpenMP: it then imports
    libgomp's (or LLVM libomp's) entry points, whose names its dynamic string table holds."""
    data = Path(library).read_bytes()
    return any(name in data for name in (b"GOMP_parallel", b"libgomp.so", b"libomp.so"))


class Ggml:
    """ggml-cpu through nvfp4-engines' ctypes bindings (:mod:`nvfp4_engines._libggml`):
    llama-cpp-python's bundled libggml-base / libggml-cpu, or a source build's in the folder
    ``$NVFP4_GGML_LIB_DIR`` (see the README); ``variant`` names one CPU variant of a
    backend-DL build (None: ggml's own choice for this CPU). Raises RuntimeError with a
    reason when none is there, or when this libggml has no NVFP4 type."""

    def __init__(self, variant: str | None = None) -> None:
        try:
            from nvfp4_engines import _libggml
        except ImportError as exc:
            raise RuntimeError(
                f"nvfp4-engines is not installed ({exc}): it holds the ggml bindings"
            ) from exc
        try:
            g = _libggml.load(None, variant)
        except _libggml.GgmlUnavailable as exc:
            raise RuntimeError(str(exc)) from exc
        self.base, self.cpu = g.base, g.cpu
        self.paths, self.features = g.paths, list(g.features)
        self.variant = g.variant
        self.source = (
            f"{g.source.removesuffix(' (source build)')}, built from llama-cpp-python's "
            "vendored llama.cpp (ggml targets only)"
            if g.source.endswith("(source build)")
            else f"{g.source}'s bundled libraries"
        )
        self.init_params = _libggml.InitParams
        self.threadpool = g.threadpool
        #: whether ggml-cpu was built with OpenMP (llama-cpp-python's wheels are; libggml-python
        #: is not): without it, ggml starts its threads on every graph unless given a pool
        self.openmp = links_openmp(g.cpu._name)

    def matmuls(self, planes: nvfp4.NVFP4Planes, xs: dict[int, np.ndarray], threads: int) -> Any:
        """A :class:`GgmlMatmuls` computing ``(x @ W.T) * scale`` for each ``x`` of ``xs``."""
        return GgmlMatmuls(self, planes, xs, threads)


class GgmlMatmuls:
    """One ggml context for one weight: the NVFP4 tensor (bytes from ``to_gguf``, so ggml sees
    exactly our weights), its ``.scale`` tensor, and per M an F32 activation tensor and the
    graph ``ggml_mul(ggml_mul_mat(w, x), scale)`` as llama.cpp's ``build_lora_mm`` builds it.
    Everything, work buffer included, is allocated here once; :meth:`run` only computes."""

    def __init__(
        self, g: Ggml, planes: nvfp4.NVFP4Planes, xs: dict[int, np.ndarray], threads: int
    ) -> None:
        b = g.base
        self.g = g
        data, scale = to_gguf(planes)
        n, k = planes.n, planes.k
        rows = sum(xs)
        mem = (
            data.nbytes
            + 4 * (k * rows + 2 * n * rows + 1)
            + (2 + 3 * len(xs)) * (b.ggml_tensor_overhead() + 64)
            + len(xs) * b.ggml_graph_overhead()
            + (1 << 20)
        )
        self.ctx = b.ggml_init(g.init_params(mem, None, False))
        if not self.ctx:
            raise RuntimeError(f"ggml_init({mem} bytes) failed")
        wt = b.ggml_new_tensor_2d(self.ctx, GGUF_TYPE_NVFP4, k, n)
        if b.ggml_nbytes(wt) != data.nbytes:
            raise RuntimeError(
                f"ggml NVFP4 tensor {n}x{k}: ggml_nbytes {b.ggml_nbytes(wt)}, to_gguf wrote "
                f"{data.nbytes} bytes"
            )
        ctypes.memmove(b.ggml_get_data(wt), data.ctypes.data, data.nbytes)
        st = b.ggml_new_tensor_1d(self.ctx, GGML_TYPE_F32, 1)
        ctypes.memmove(b.ggml_get_data(st), scale.ctypes.data, 4)
        self.graphs: dict[int, tuple[int, Any, np.ndarray]] = {}
        self.outs: dict[int, np.ndarray] = {}
        for m, x in xs.items():
            xt = b.ggml_new_tensor_2d(self.ctx, GGML_TYPE_F32, k, m)
            x32 = np.ascontiguousarray(x, dtype=np.float32)
            ctypes.memmove(b.ggml_get_data(xt), x32.ctypes.data, x32.nbytes)
            yt = b.ggml_mul(self.ctx, b.ggml_mul_mat(self.ctx, wt, xt), st)
            graph = b.ggml_new_graph(self.ctx)
            b.ggml_build_forward_expand(graph, yt)
            # a persistent pool for every graph (as llama.cpp keeps one): without OpenMP,
            # ggml-cpu would otherwise start its threads in every ggml_graph_compute call
            # (about 15 ms a call on two cores, more than a whole 4096 x 4096 GEMV)
            plan = g.cpu.ggml_graph_plan(graph, threads, g.threadpool(threads))
            work = np.empty(max(1, plan.work_size), np.uint8)  # preallocated, kept alive
            plan.work_data = work.ctypes.data
            self.graphs[m] = (graph, plan, work)
            buf = (ctypes.c_float * (m * n)).from_address(b.ggml_get_data(yt))
            self.outs[m] = np.ctypeslib.as_array(buf).reshape(m, n)

    def run(self, m: int) -> None:
        """One timed call: the whole graph (Q8_0 activation quantization, mul_mat, scale)."""
        graph, plan, _ = self.graphs[m]
        status = self.g.cpu.ggml_graph_compute(graph, ctypes.byref(plan))
        if status != 0:
            raise RuntimeError(f"ggml_graph_compute returned status {status}")

    def free(self) -> None:
        self.outs.clear()
        self.graphs.clear()
        if self.ctx:
            self.g.base.ggml_free(self.ctx)
            self.ctx = None


def q8_0_roundtrip(x: np.ndarray) -> np.ndarray:
    """``x`` through ggml's Q8_0 (``quantize_row_q8_0``: per 32 values d = amax / 127 stored as
    float16, q = round-to-nearest-even(x * 127 / amax)), decoded back to float32."""
    b = np.ascontiguousarray(x, dtype=np.float32).reshape(x.shape[0], -1, 32)
    amax = np.abs(b).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)
    d = (amax / np.float32(127.0)).astype(np.float16).astype(np.float32)
    xq: np.ndarray = (np.rint(b * inv) * d).reshape(x.shape).astype(np.float32)
    return xq


def check_ggml(
    mm: GgmlMatmuls, planes: nvfp4.NVFP4Planes, xs: dict[int, np.ndarray]
) -> dict[str, Any]:
    """ggml's outputs against ``nvfp4.reference`` (float64, exact weight decode), every M:

    * ``q8_err``: against the reference on x passed through Q8_0 as ggml does, so only the
      accumulation order differs: held to the spec's W4A16 float32 number (a wrong transcode,
      scale or layout shows up here at order 1);
    * ``w4a8_err``: against the reference on the original x (what the W4A16 arms are held
      to): the activation quantization's own error, bounded by :data:`GGML_W4A8_BOUND`.

    Both are max|y - ref| / max|ref| over the call's output."""
    order = sorted(xs)
    for m in order:
        mm.run(m)
    y = np.concatenate([mm.outs[m] for m in order]).astype(np.float64)
    x = np.concatenate([xs[m] for m in order])
    operand = reference.decoded_operand(planes)
    ref = reference.qmm_2d(x, operand)
    ref_q8 = reference.qmm_2d(q8_0_roundtrip(x), operand)
    del operand
    out: dict[str, Any] = {
        "q8_tol": tolerance("qmm", "float32"),
        "w4a8_bound": GGML_W4A8_BOUND,
        "per_m": {},
    }
    row = 0
    for m in order:
        sl = slice(row, row + m)
        row += m
        q8 = float(np.abs(y[sl] - ref_q8[sl]).max() / np.abs(ref_q8[sl]).max())
        w4a8 = float(np.abs(y[sl] - ref[sl]).max() / np.abs(ref[sl]).max())
        out["per_m"][str(m)] = {"q8_err": q8, "w4a8_err": w4a8}
    errs = out["per_m"].values()
    out["q8_err"] = max(e["q8_err"] for e in errs)
    out["w4a8_err"] = max(e["w4a8_err"] for e in errs)
    out["ok"] = out["q8_err"] <= out["q8_tol"] and out["w4a8_err"] <= GGML_W4A8_BOUND
    return out


# ------------------------------------------------------------------------------ arms
@dataclasses.dataclass
class Case:
    """One arm at one M: a call to time (``fn(i)``, ``i`` = call number) and how often."""

    arm: str
    variant: str
    m: int
    weight_bytes: int
    fn: Callable[[int], Any]
    calls: int
    note: str = ""
    sets: list[PreparedWeight] | None = None  # the rotated weights of a cold case of ours
    isa: str = ""
    self_timed: bool = False  # fn returns the seconds of its call (timed in a child process)


@dataclasses.dataclass
class ShapeCtx:
    """One shape's weights and the run's settings, shared by the arms."""

    shape: str
    n: int
    k: int
    planes: nvfp4.NVFP4Planes
    pw: PreparedWeight
    threads: int
    reps: int
    quick: bool
    ms: tuple[int, ...] = (1, 8, 32, 128, 512)

    @property
    def context_ms(self) -> tuple[int, ...]:
        return tuple(m for m in self.ms if m <= CONTEXT_MAX_M)

    @property
    def packed(self) -> int:
        return int(self.planes.codes.nbytes + self.planes.scales.nbytes)

    def x(self, m: int) -> np.ndarray:
        return np.random.default_rng(m).standard_normal((m, self.k)).astype(np.float32)

    def cold_count(self, bytes_per_set: int) -> int:
        return 3 if self.quick else max(2, -(-COLD_BYTES // bytes_per_set))


def arm_ours(c: ShapeCtx, native: Any, isa: str, sets: list[PreparedWeight]) -> list[Case]:
    """nvfp4-cpu W4A16 at one ISA level, hot; and cold (rotating ``sets``, > 1 GB of weight
    copies, on the L shape) up to :data:`CONTEXT_MAX_M`. The portable level stops there too."""
    cases = []
    note = f"{len(sets)} weight sets, {len(sets) * c.pw.nbytes / 1e9:.2f} GB rotated"
    for m in c.ms if isa != "portable" else c.context_ms:
        x, out = c.x(m), np.empty((m, c.n), np.float32)

        def hot(_: int, x: np.ndarray = x, o: np.ndarray = out) -> None:
            ops.qmm(native, isa, c.threads, x, c.pw, out=o)

        cases.append(Case("ours", "hot", m, c.packed, hot, c.reps, isa=isa))
        if sets and m <= CONTEXT_MAX_M:

            def cold(i: int, x: np.ndarray = x, o: np.ndarray = out) -> None:
                ops.qmm(native, isa, c.threads, x, sets[i % len(sets)], out=o)

            calls = max(c.reps, 2 * len(sets))
            cases.append(Case("ours", "cold", m, c.packed, cold, calls, note, sets, isa))
    return cases


def arm_ours_w4a8(
    c: ShapeCtx, native: Any, backend: Any, isa: str
) -> tuple[list[Case], dict[str, Any]]:
    """nvfp4-cpu W4A8 (``nvfp4_cpu.w4a8.qmm_w4a8``, the same layer as the W4A16 arm's
    ``ops.qmm``: the Q8_0 quantization of x and the output allocation inside every call) at
    one ISA level, hot; checked first, through the backend's verb, against
    ``nvfp4.reference.qmm_w4a8`` (float64 products on the same Q8_0 codes) within spec 1.1's
    ``w4a8`` float32 tolerance."""
    ms = c.ms if isa != "portable" else c.context_ms
    xs = {m: c.x(m) for m in ms}
    w = backend.prepare(c.planes)
    check = check_w4a8(backend, w, c.planes, xs[min(ms, key=lambda m: abs(m - 8))])
    cases = []
    for m in ms:

        def call(_: int, x: np.ndarray = xs[m]) -> None:
            w4a8.qmm_w4a8(native, isa, c.threads, x, c.pw)

        note = "Q8_0 activation quantization inside the call; output allocated per call"
        cases.append(Case("ours_w4a8", "hot", m, c.packed, call, c.reps, note, isa=isa))
    return cases, check


def check_w4a8(backend: Any, w: Any, planes: nvfp4.NVFP4Planes, x: np.ndarray) -> dict[str, Any]:
    """``qmm_w4a8`` against the float64 reference, max|y - ref| / max|ref|, and its error
    against the W4A16 reference on the same x (the activation quantization's own cost)."""
    y = np.asarray(backend.qmm_w4a8(x, w), dtype=np.float64)
    ref = np.asarray(reference.qmm_w4a8(x, planes, out_dtype=None), dtype=np.float64)
    w4a16 = np.asarray(reference.qmm(x, planes, out_dtype=None), dtype=np.float64)
    tol = tolerance("w4a8", "float32", "1.1")
    err = float(np.abs(y - ref).max() / np.abs(ref).max())
    vs16 = float(np.abs(y - w4a16).max() / np.abs(w4a16).max())
    return {"m": int(x.shape[0]), "err": err, "tol": tol, "vs_w4a16": vs16, "ok": err <= tol}


def arm_numpy(c: ShapeCtx) -> list[Case]:
    """The numpy reference: dequantize to float32, then matmul, on every call."""
    cases = []
    for m in c.context_ms:
        x, out = c.x(m), np.empty((m, c.n), np.float32)

        def call(_: int, x: np.ndarray = x, o: np.ndarray = out) -> None:
            np.matmul(x, reference.dequantize(c.planes, np.float32).T, out=o)

        cases.append(Case("numpy", "hot", m, c.packed, call, c.reps))
    return cases


def arm_torch(c: ShapeCtx, torch: Any, dense32: np.ndarray) -> list[Case]:
    """torch dense float32 and bfloat16 matmuls on the decoded weights, hot and (L) cold."""
    cases = []
    for arm, dt, esize in (("torch_f32", torch.float32, 4), ("torch_bf16", torch.bfloat16, 2)):
        wt = torch.from_numpy(dense32).to(dt)
        wbytes = c.n * c.k * esize
        count = c.cold_count(wbytes) if c.shape == "L" else 0
        wsets = [wt] + [wt.clone() for _ in range(count - 1)] if count else []
        note = f"{count} weight sets, {count * wbytes / 1e9:.2f} GB rotated"
        for m in c.ms:
            x, out = torch.from_numpy(c.x(m)).to(dt), torch.empty((m, c.n), dtype=dt)

            def hot(_: int, x: Any = x, o: Any = out, w: Any = wt) -> None:
                torch.matmul(x, w.t(), out=o)

            cases.append(Case(arm, "hot", m, wbytes, hot, c.reps))
            if wsets and m <= CONTEXT_MAX_M:

                def cold(i: int, x: Any = x, o: Any = out, ws: list[Any] = wsets) -> None:
                    torch.matmul(x, ws[i % len(ws)].t(), out=o)

                cases.append(Case(arm, "cold", m, wbytes, cold, max(c.reps, 2 * count), note))
    return cases


#: The least M of the capped torch arm: the P goals' prefill sizes.
CAPPED_MIN_M = 128


def arm_torch_capped(c: ShapeCtx, capped: CappedTorch) -> list[Case]:
    """torch dense float32 capped at ``capped.isa``, hot, at the prefill sizes (its child
    process gets this shape's weight first; one call's seconds come back from the child)."""
    capped.weight(c.n, c.k)
    cases = []
    for m in (m for m in c.ms if m >= CAPPED_MIN_M):

        def call(_: int, m: int = m) -> float:
            return capped.matmul(m)

        note = f"child process, torch capability {capped.capability}"
        cases.append(
            Case(
                f"torch_f32_{capped.isa}",
                "hot",
                m,
                c.n * c.k * 4,
                call,
                c.reps,
                note,
                self_timed=True,
            )
        )
    return cases


def arm_mlx(c: ShapeCtx, mx: Any, to_mlx: Any) -> list[Case]:
    """MLX's CPU quantized_matmul(mode="nvfp4") (its global is a sidecar the caller applies)."""
    mp = to_mlx(c.planes)
    wq, sc = mx.array(mp.weight), mx.array(mp.scales)
    cases = []
    for m in c.context_ms:
        x = mx.array(c.x(m))

        def call(_: int, x: Any = x) -> None:
            mx.eval(
                mx.quantized_matmul(x, wq, sc, transpose=True, group_size=16, bits=4, mode="nvfp4")
            )

        cases.append(Case("mlx", "hot", m, c.packed, call, c.reps, "MLX CPU device"))
    return cases


def arm_ggml(
    c: ShapeCtx, ggml: Ggml, arm: str = "ggml"
) -> tuple[list[Case], GgmlMatmuls, dict[str, Any]]:
    """ggml-cpu NVFP4 mul_mat then the ``.scale`` multiply (W4A8: Q8_0 activations), on the
    same weights (transcoded by ``to_gguf``) and x as the other arms; checked first."""
    xs = {m: c.x(m) for m in c.ms}
    mm = ggml.matmuls(c.planes, xs, c.threads)
    check = check_ggml(mm, c.planes, xs)
    note = "W4A8: activations in Q8_0; the .scale ggml_mul is in the timed graph"
    if ggml.variant:
        note += f"; ggml-cpu variant {ggml.variant}"
    cases = []
    for m in c.ms:

        def call(_: int, m: int = m) -> None:
            mm.run(m)

        cases.append(Case(arm, "hot", m, c.packed, call, c.reps, note))
    return cases, mm, check


#: Idle pause before each arm's burst: thread pools spin for a while after their work before
#: they sleep (ours 0.2 ms, libgomp up to 300k pause loops, OpenBLAS about 2^28 cycles), and a
#: pool still spinning would take one of the capped cores from the next arm.
SETTLE_S = 0.2

#: Untimed rounds over a point's arms before its timed rounds (pages, caches and thread
#: pools settled before anything counts). Whole bursts of our 4096 x 4096 arms used to run
#: at one-thread speed (ours AVX-512 at S, M = 1: 0.27 ms against 0.14 ms): not a warm-up
#: effect but the kernel waking our sleeping pool worker on the caller's CPU, which
#: nvfp4-cpu's pool now corrects (see its CHANGELOG).
WARMUP_ROUNDS = 1


#: Least time of one burst's timed calls: an arm whose ``--reps`` calls take less gets more
#: calls (the same count in every round), fixed from its calls in the untimed round. The
#: shared machine's slow spells (a vCPU at up to half speed for milliseconds, seen on a
#: 2-vCPU EPYC in 8% of 5-call bursts of ours, of ggml and of a one-thread arm alike) then
#: cover a part of a burst, not all of it: 5 calls at 4096 x 4096, M = 1 last 2 ms.
BURST_S = 0.05


def burst_calls(case: Case, seconds: list[float], burst_s: float) -> int:
    """Timed calls per burst for ``case``: ``case.calls``, or more when those take less than
    ``burst_s`` at the median of ``seconds`` (its untimed round's calls)."""
    if not seconds or burst_s <= 0:
        return case.calls
    per = max(statistics.median(seconds), 1e-7)
    return max(case.calls, -int(-burst_s // per))


def run_point(
    cases: list[Case], rounds: int, warmup: int = 1, burst_s: float = BURST_S
) -> dict[int, list[float]]:
    """Time the arms of one (shape, M) point back to back, ``rounds`` times over: in each
    round every arm gets a :data:`SETTLE_S` pause, ``warmup`` untimed calls, then its timed
    calls in one burst (:func:`burst_calls`: at least ``burst_s`` seconds); an arm's times
    are all its rounds' calls, after :data:`WARMUP_ROUNDS` untimed rounds. (Interleaving single
    calls across arms was tried: the thread pools then fight, e.g. torch's OpenMP workers still
    spin when our call starts, which no real program does.) Rounds matter on this shared VM: a
    slow spell (the second vCPU not running for milliseconds, so a 2-thread call takes its
    1-thread time) can last a whole burst, and was seen to halve one arm's figure."""
    times: dict[int, list[float]] = {id(case): [] for case in cases}
    calls = {id(case): case.calls for case in cases}
    for r in range(WARMUP_ROUNDS + rounds):
        for case in cases:
            time.sleep(SETTLE_S)
            for i in range(warmup):
                case.fn(i)
            burst = []
            for i in range(warmup, warmup + calls[id(case)]):  # a cold case's next sets
                t0 = time.perf_counter()
                took = case.fn(i)
                burst.append(float(took) if case.self_timed else time.perf_counter() - t0)
            if r >= WARMUP_ROUNDS:
                times[id(case)] += burst
            elif r == WARMUP_ROUNDS - 1:
                calls[id(case)] = burst_calls(case, burst, burst_s)
    return times


#: Pause before each probe call of C5's alternation. Our pool's worker spins 0.2 ms after the
#: GEMV call before it sleeps; a probe started at once shares a CPU with it while the kernel
#: places and then migrates the probe's new thread. The pause costs the figures nothing (the
#: GEMV call still finds its worker asleep: the probe lasts longer than the spin). On a 2-vCPU
#: Xeon (Emerald Rapids) the fixed-share probe of the time read 14-17 GB/s without it and
#: 16-25 GB/s with it, erratic either way; the probe's own fixed split turned out to be the
#: larger fault (read_probe.c now hands out its MiBs as our pool does).
PROBE_SETTLE_S = 0.002


# ------------------------------------------------------------------------------ main
def paired_probe(cold: Case, native: Any, isa: str, threads: int) -> dict[str, Any]:
    """The read probe and the cold M=1 GEMV alternated call by call, over the same memory.

    The probe reads the weight set half a rotation away from the one the GEMV call uses
    (its codes and scales, whole MiBs), so over a rotation both read every set equally often
    and both find it cold. Both use the same number of threads. Drift, and
    memory whose speed differs from page to page (a VM's memory may sit on near and far host
    nodes), then hit numerator and denominator of the bandwidth fraction alike. The probe
    (``read_probe.c``, compiled for the same ISA level) splits the MiBs over the same number
    of threads. Each probe call starts after a :data:`PROBE_SETTLE_S` pause, so that no pool
    of the GEMV still spins beside it."""
    sets = cold.sets or []
    mib = 1 << 20
    probe_t, probe_b, ours_t = [], [], []
    for i in range(cold.calls):
        w = sets[(i + len(sets) // 2) % len(sets)]
        time.sleep(PROBE_SETTLE_S)  # the GEMV's pool asleep before the probe starts
        t0 = time.perf_counter()
        read_probe(isa, threads, w.codes)
        read_probe(isa, threads, w.scales)
        probe_t.append(time.perf_counter() - t0)
        probe_b.append(w.codes.nbytes // mib * mib + w.scales.nbytes // mib * mib)
        t0 = time.perf_counter()
        cold.fn(i)
        ours_t.append(time.perf_counter() - t0)
    rates = [b / t for b, t in zip(probe_b, probe_t, strict=True)]
    return {
        "calls": cold.calls,
        "probe_times_s": probe_t,
        "probe_bytes_per_call": probe_b[0],
        "ours_times_s": ours_t,
        "probe_median_gbps": statistics.median(rates) / 1e9,
        "ours_median_gbps": cold.weight_bytes / statistics.median(ours_t) / 1e9,
    }


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {"platform": platform.platform(), "python": platform.python_version()}
    info["cpu"] = cpu_model()
    info["simd_flags"] = simd_flags()
    info["cpus"] = os.cpu_count()
    versions: dict[str, str | None] = {
        "numpy": np.__version__,
        "nvfp4": nvfp4.__version__,
        "nvfp4_cpu": nvfp4_cpu.__version__,
    }
    for mod in ("torch", "mlx.core"):
        try:
            versions[mod] = __import__(mod, fromlist=["_"]).__version__
        except ImportError:
            versions[mod] = None
    versions["llama_cpp_python"] = dist_version("llama_cpp_python")
    info["versions"] = versions
    return info


def run(args: argparse.Namespace) -> dict[str, Any]:
    threads, reps = args.threads, args.reps
    native = load()
    isa = native.best_isa()
    supported = native.supported_levels()
    isas = tuple(reversed(supported)) if args.isa == "all" else tuple(args.isa.split(","))
    for level in isas:
        if level not in supported:
            raise SystemExit(f"--isa {level}: not a level this build and CPU run ({supported})")
    backend = nvfp4_cpu.CPUBackend(isa=isa, threads=threads)
    backends = {level: nvfp4_cpu.CPUBackend(isa=level, threads=threads) for level in isas}
    w4a8 = {lv for lv, b in backends.items() if "w4a8" in b.info.capabilities}
    shapes = (
        {"S": (1024, 1024), "L": (2048, 2048)}
        if args.quick
        else {"S": (4096, 4096), "L": (14336, 8192)}
    )
    ms = (1, 8, 32) if args.quick and args.ms is None else tuple(args.ms or ShapeCtx.ms)
    rows: list[Row] = []
    skipped: dict[str, str] = {}
    t_start = time.time()
    load_start = os.getloadavg()

    # read-bandwidth probe, same threads, same process
    probe_buf = np.ones((256 << 20) if args.quick else (1 << 30), dtype=np.uint8)

    def probe_call(_: int, b: np.ndarray = probe_buf) -> None:
        read_probe(isa, threads, b)

    probe_times = measure(probe_call, max(reps, 5))
    probe = {
        "bytes": probe_buf.nbytes,
        "isa": isa,
        "threads": threads,
        "times_s": probe_times,
        "median_gbps": probe_buf.nbytes / statistics.median(probe_times) / 1e9,
        "max_gbps": probe_buf.nbytes / min(probe_times) / 1e9,
    }
    print(
        f"read probe: {probe['median_gbps']:.1f} GB/s median ({threads} threads, {isa})", flush=True
    )

    try:
        import torch

        torch.set_num_threads(threads)
    except ImportError:
        torch = None  # type: ignore[assignment]
        skipped["torch_f32"] = skipped["torch_bf16"] = "torch is not installed"
    try:
        import mlx.core as mx

        mx.set_default_device(mx.cpu)
        from nvfp4.layouts.mlx import to_mlx
    except ImportError:
        mx = None  # type: ignore[assignment]
        skipped["mlx"] = "mlx is not installed"
    ggmls: dict[str, Ggml] = {}  # arm -> libggml
    try:
        ggmls["ggml"] = Ggml()
    except (RuntimeError, OSError, AttributeError) as exc:
        skipped["ggml"] = f"ggml arm skipped: {exc}"
        print(skipped["ggml"], flush=True)
    best_variant = ggmls["ggml"].variant if "ggml" in ggmls else None
    if best_variant is not None and best_variant != args.ggml_avx2_variant and "avx2" in isas:
        try:
            ggmls["ggml_avx2"] = Ggml(args.ggml_avx2_variant)
        except (RuntimeError, OSError, AttributeError) as exc:
            skipped["ggml_avx2"] = f"ggml_avx2 arm skipped: {exc}"
    elif "avx2" in isas:
        skipped["ggml_avx2"] = "ggml_avx2 arm not run: " + (
            f"ggml's own choice here is already {best_variant}"
            if best_variant is not None
            else "this libggml is not a backend-DL build with per-CPU variants, so the AVX2 "
            "level is compared with the ggml arm (ggml's best code for this CPU)"
        )
    capped = None  # torch capped at AVX2, where this CPU runs a wider level
    if torch is not None and "avx2" in isas and isa != "avx2" and max(ms) >= CAPPED_MIN_M:
        try:
            capped = CappedTorch("avx2", threads)
        except (RuntimeError, OSError) as exc:
            skipped["torch_f32_avx2"] = f"torch_f32_avx2 arm skipped: {exc}"
    elif "avx2" in isas:
        skipped["torch_f32_avx2"] = "torch_f32_avx2 arm not run: " + (
            "torch is not installed"
            if torch is None
            else "AVX2 is this CPU's widest level, so torch_f32 already runs AVX2 code"
            if isa == "avx2"
            else f"no M >= {CAPPED_MIN_M}"
        )
    ggml_checks: dict[str, dict[str, Any]] = {}  # arm -> shape -> check
    w4a8_checks: dict[str, dict[str, Any]] = {}
    if not w4a8:
        skipped["ours_w4a8"] = "this nvfp4-cpu does not declare the w4a8 capability"

    for shape, (n, k) in shapes.items():
        planes = random_planes(n, k, seed=n + k)
        ctx = ShapeCtx(
            shape, n, k, planes, backend.prepare(planes).payload, threads, reps, args.quick, ms
        )
        sets = copies(ctx.pw, ctx.cold_count(ctx.pw.nbytes)) if shape == "L" else []
        cases = []
        for level in isas:
            cases += arm_ours(ctx, native, level, sets)
            if level in w4a8:
                more, check = arm_ours_w4a8(ctx, native, backends[level], level)
                w4a8_checks.setdefault(level, {})[shape] = check
                print(
                    f"w4a8 check {shape} [{level}]: {check['err']:.2e} (tol {check['tol']:.0e});"
                    f" vs W4A16 reference {check['vs_w4a16']:.2e}",
                    flush=True,
                )
                if check["ok"]:
                    cases += more
                else:
                    skipped[f"ours_w4a8[{level}]"] = f"dropped: failed its check ({check})"
        mms: list[GgmlMatmuls] = []
        for arm, ggml in ggmls.items():  # right after ours: C2 / C3 compare the two
            try:
                more, mm, check = arm_ggml(ctx, ggml, arm)
                mms.append(mm)
                ggml_checks.setdefault(arm, {})[shape] = check
                print(
                    f"{arm} check {shape}: vs reference on Q8_0 x {check['q8_err']:.2e} (tol "
                    f"{check['q8_tol']:.0e}); W4A8 vs reference on x {check['w4a8_err']:.2e} "
                    f"(bound {check['w4a8_bound']:.0e})",
                    flush=True,
                )
                if check["ok"]:
                    cases += more
                else:
                    skipped[arm] = f"{arm} arm dropped: its output failed the check ({check})"
            except (RuntimeError, OSError) as exc:
                skipped[arm] = f"{arm} arm failed: {exc}"
        cases += arm_numpy(ctx)
        dense32 = backend.dequantize(ctx.planes, "float32")  # exact decode, for the dense arms
        if torch is not None:
            cases += arm_torch(ctx, torch, dense32)
        if capped is not None:
            cases += arm_torch_capped(ctx, capped)
        if mx is not None:
            cases += arm_mlx(ctx, mx, to_mlx)
        del dense32
        for m in ctx.ms:  # one (shape, M) point at a time, its arms back to back
            point = [c for c in cases if c.m == m]
            times = run_point(point, args.rounds, burst_s=args.burst_s)
            colds = [c for c in point if (c.arm, c.variant) == ("ours", "cold")]
            for cold in colds if m == 1 else []:  # C5: probe and cold GEMV alternated
                paired = paired_probe(cold, native, cold.isa, threads)
                probe.setdefault("paired_by_isa", {})[cold.isa] = paired
                if cold.isa == isa:
                    probe["paired"] = paired
                print(
                    f"paired [{cold.isa}]: probe {paired['probe_median_gbps']:.1f} GB/s, ours "
                    f"cold {paired['ours_median_gbps']:.1f} GB/s",
                    flush=True,
                )
            for c in point:
                r = Row(
                    c.arm, shape, n, k, m, c.variant, c.weight_bytes, times[id(c)], c.note, c.isa
                )
                rows.append(r)
                d = r.as_dict()
                arm = f"{c.arm}[{c.isa}]" if c.isa else c.arm
                print(
                    f"{shape} {n}x{k} M={m:<3} {arm:<20} {c.variant:<4} {d['median_s'] * 1e3:9.3f} ms "
                    f"{d['gflops']:7.1f} GF/s {d['weight_gbps']:6.2f} GB/s",
                    flush=True,
                )
        for mm in mms:
            mm.free()
        del cases, ctx, sets

    del probe_buf
    if capped is not None:
        capped.close()
    results = [r.as_dict() for r in rows]
    isa_info = {level: native.describe(level) for level in isas}
    cache_plan = cpu_plan.current(native)
    return {
        "benchmark": "cpu_kernels",
        "quick": bool(args.quick),
        "threads": threads,
        "reps": reps,
        "rounds": args.rounds,
        "settle_s": SETTLE_S,
        "warmup_rounds": WARMUP_ROUNDS,
        "burst_s": args.burst_s,
        "isa": isa,
        "isas": isa_info,
        "ms": list(ms),
        "availability": backend.availability().device,
        "machine": machine_info(),
        # the caches and the blocking every level of ours ran with (nvfp4_cpu.plan), and whether
        # the AVX2 level was the CPU's own best or forced on a CPU with a wider one
        "cache_plan": cache_plan.describe(),
        "avx2_level": "native" if isa == "avx2" else f"forced (this CPU's best level: {isa})",
        "niceness": os.nice(0),
        "loadavg_start": load_start,
        "loadavg_end": os.getloadavg(),
        "started_unix": t_start,
        "duration_s": time.time() - t_start,
        "shapes": {s: {"n": n, "k": k} for s, (n, k) in shapes.items()},
        "probe": probe,
        "results": results,
        "skipped": skipped,
        "ggml": {
            arm: {
                "libraries": list(g.paths),
                "compiled_features": g.features,
                "source": g.source,
                "variant": g.variant,
                "openmp": g.openmp,
                "threadpool": "persistent"
                if g.threadpool(threads)
                else "none (ggml threads per graph)",
            }
            for arm, g in ggmls.items()
        },
        "ggml_check": ggml_checks,
        "w4a8_check": w4a8_checks,
        "goals": goals(results, probe, isa, isas, native, args.rounds),
    }


def _get(
    results: list[dict[str, Any]],
    arm: str,
    shape: str,
    m: int,
    variant: str = "hot",
    isa: str | None = None,
) -> dict[str, Any] | None:
    """The row of ``arm`` at (shape, M, variant); for our arms the one of ``isa`` (None: any,
    which is unambiguous only for the other arms)."""
    for r in results:
        same = (r["arm"], r["shape"], r["m"], r["variant"]) == (arm, shape, m, variant)
        if same and (isa is None or r.get("isa", "") in (isa, "")):
            return r
    return None


#: The M = 1 targets per SIMD level: C2 (ours time / ggml time) and C5 (ours packed GB/s /
#: read-probe GB/s). The AVX2 path has its own issue's targets; every other level (AVX-512,
#: NEON) takes the defaults.
GEMV_TARGETS: dict[str, dict[str, str]] = {
    "default": {"C2": "<= 1.0", "C5": ">= 0.60"},
    "avx2": {"C2": "<= 0.8", "C5": ">= 0.70"},
}


#: The target of a ratio shown beside the goals without a verdict (our AVX2 level against
#: ggml's best variant for this CPU, when its AVX2 variant is the goal's comparison).
CONTEXT = "context"


def _gemv_target(isa: str, gid: str) -> str:
    """The target of goal ``gid`` ("C2" or "C5") for our ISA level ``isa``."""
    return GEMV_TARGETS.get(isa, GEMV_TARGETS["default"])[gid]


#: W4A8 over our W4A16 throughput at M >= 32, per ISA kind (int8 dot products: VNNI's
#: vpdpbusd, AVX2's vpmaddubsw / vpmaddwd); the portable level has no goal.
W4A8_SPEEDUP_TARGET = {"vnni": 2.0, "avx2": 1.5}


def _w4a8_kind(isa: str, has_vnni: bool) -> str | None:
    if "vnni" in isa or (isa.startswith("avx512") and has_vnni):
        return "vnni"
    return "avx2" if isa.startswith("avx") else None


def _best_ratio(
    num: dict[str, Any] | None, den: dict[str, Any] | None, key: str = "median_s"
) -> float | None:
    """A ratio of two rows from each one's fastest call instead of its median: time over
    time for ``median_s``, GF/s over GF/s (the inverse time ratio, same work) for
    ``gflops``. Shown beside the ratio of medians, which decides the goal: a slow spell of
    the shared machine covers whole bursts of one arm, and the two disagree when an arm had
    more slow rounds than its neighbour."""
    if num is None or den is None or "min_s" not in num or "min_s" not in den:
        return None
    if key == "gflops":
        return float(den["min_s"]) / float(num["min_s"])
    return float(num["min_s"]) / float(den["min_s"])


def _round_ratios(
    num: dict[str, Any] | None, den: dict[str, Any] | None, key: str, rounds: int
) -> tuple[float, float] | None:
    """The lowest and highest of a ratio taken round by round: each arm's median call of
    that round (the arms of one round ran back to back, seconds apart), time over time for
    ``median_s``, the inverse for ``gflops``. None for one round, or where an arm's calls do
    not split evenly into rounds. How far a ratio moves within one run tells a goal met by a
    margin from one decided by the shared machine's slow spells."""
    if num is None or den is None or rounds < 2:
        return None
    tn, td = num.get("times_s") or [], den.get("times_s") or []
    if not tn or not td or len(tn) % rounds or len(td) % rounds:
        return None
    cn, cd = len(tn) // rounds, len(td) // rounds
    per = []
    for r in range(rounds):
        a = statistics.median(tn[r * cn : (r + 1) * cn])
        b = statistics.median(td[r * cd : (r + 1) * cd])
        per.append(b / a if key == "gflops" else a / b)
    return min(per), max(per)


def _paired_best_ratio(paired: dict[str, Any]) -> float | None:
    """C5's ratio from the fastest cold GEMV call and the fastest probe call of the
    alternated pairs (as :func:`_best_ratio` for the other goals)."""
    ours_t, probe_t = paired.get("ours_times_s"), paired.get("probe_times_s")
    if not ours_t or not probe_t or "ours_median_gbps" not in paired:
        return None
    ours_bytes = paired["ours_median_gbps"] * statistics.median(ours_t)  # GB per call
    probe_bytes = paired["probe_bytes_per_call"] / 1e9
    return (ours_bytes / min(ours_t)) / (probe_bytes / min(probe_t))


def _comparisons(
    isa: str, avx2_arm: str, have_avx2: bool, best_arm: str, name: str
) -> list[tuple[str, str, str]]:
    """The arms a goal of our level ``isa`` compares with, as (arm, id suffix, name): for our
    AVX2 level the other side's AVX2 arm when measured (``avx2_arm``, the goal), then its own
    best choice for this CPU (``best_arm``, context beside it); otherwise ``best_arm`` alone."""
    if isa == "avx2" and have_avx2:
        return [(avx2_arm, "", f"{name} AVX2"), (best_arm, f" vs best {name.split()[0]}", name)]
    return [(best_arm, "", name)]


def goals(
    results: list[dict[str, Any]],
    probe: dict[str, Any],
    best: str,
    isas: tuple[str, ...] | dict[str, str],
    native: Any = None,
    rounds: int = 1,
) -> list[dict[str, Any]]:
    """The issues' goals, each a ratio from this run (None where an arm did not run).

    C1-C5 (decode and GEMV against ggml, torch and the memory) for every SIMD level measured,
    ids suffixed with the level; P (W4A16 prefill against torch's float32 matmul) and A
    (W4A8 against our W4A16 and against ggml, itself W4A8) likewise."""
    out: list[dict[str, Any]] = []
    has_vnni = bool(native is not None and native.has("avx512vnni"))
    ms = sorted({int(r["m"]) for r in results})

    def ratio(
        num: dict[str, Any] | None, den: dict[str, Any] | None, key: str = "median_s"
    ) -> tuple[float | None, float | None, tuple[float, float] | None]:
        """The ratio of medians and, beside it, that of the fastest calls (:func:`_best_ratio`)
        and its range over the rounds (:func:`_round_ratios`)."""
        median = None if num is None or den is None else num[key] / den[key]
        return median, _best_ratio(num, den, key), _round_ratios(num, den, key, rounds)

    def goal(gid: str, text: str, rs: tuple[Any, ...], target: str) -> None:
        """One row; ``target`` is ``">= bound"`` or ``"<= bound"``, ``met`` None without a
        ratio; :data:`CONTEXT` marks a ratio shown beside the goals, with no verdict. The
        verdict is on the ratio of medians, ``rs[0]``; ``rs[1]`` is the same ratio from each
        arm's fastest call, ``rs[2]`` (where given) its lowest and highest round."""
        r, best = rs[0], rs[1]
        spread = rs[2] if len(rs) > 2 else None
        row = {"id": gid, "goal": text, "value": r, "best": best, "target": target}
        row["rounds"] = list(spread) if spread else None
        if target == CONTEXT:
            out.append({**row, "met": None})
            return
        op, bound = target.split()
        met = None if r is None else (r >= float(bound) if op == ">=" else r <= float(bound))
        out.append({**row, "met": met})

    have_avx2_ggml = any(r["arm"] == "ggml_avx2" for r in results)
    have_avx2_torch = any(r["arm"] == "torch_f32_avx2" for r in results)

    for shape in ("S", "L"):
        r = ratio(_get(results, "numpy", shape, 1), _get(results, "ours", shape, 1, isa=best))
        goal(f"C1-{shape}", f"numpy dequant+matmul time / ours, M=1, {shape}", r, ">= 20")
    for isa in (i for i in isas if i != "portable"):
        tag = f" [{isa}]"

        def ours(shape: str, m: int, variant: str = "hot", isa: str = isa) -> Any:
            return _get(results, "ours", shape, m, variant, isa)

        # the ggml arm of the same instruction set: its AVX2 build for our AVX2 level, when
        # measured; the best one for this CPU as context beside it
        vs = _comparisons(isa, "ggml_avx2", have_avx2_ggml, "ggml", "ggml")
        for shape in ("S", "L"):
            for g_arm, suffix, g_name in vs:
                target = CONTEXT if suffix else _gemv_target(isa, "C2")
                r = ratio(ours(shape, 1), _get(results, g_arm, shape, 1))
                goal(
                    f"C2-{shape}{tag}{suffix}",
                    f"ours time / {g_name} time, M=1, {shape}",
                    r,
                    target,
                )
                for m in (8, 32):
                    r = ratio(ours(shape, m), _get(results, g_arm, shape, m), "gflops")
                    goal(
                        f"C3-{shape}-M{m}{tag}{suffix}",
                        f"ours GF/s / {g_name} GF/s, M={m}, {shape}",
                        r,
                        CONTEXT if suffix else ">= 2.5",
                    )
        for variant in ("hot", "cold"):
            r = ratio(_get(results, "torch_bf16", "L", 1, variant), ours("L", 1, variant))
            goal(
                f"C4-{variant}{tag}", f"torch bf16 dense time / ours, M=1, L {variant}", r, ">= 3.0"
            )
        paired = (probe.get("paired_by_isa") or {}).get(isa)
        if paired is None and isa == best:
            paired = probe.get("paired")
        c5 = (
            (None, None)
            if paired is None
            else (
                paired["ours_median_gbps"] / paired["probe_median_gbps"],
                _paired_best_ratio(paired),
            )
        )
        goal(
            f"C5{tag}",
            "ours packed GB/s / read-probe GB/s, M=1, L cold (alternated)",
            c5,
            _gemv_target(isa, "C5"),
        )
        # torch's float32 matmul at AVX2 for our AVX2 level, when measured (an AVX-512
        # torch has twice its vector width); torch's own choice as context beside it
        tvs = _comparisons(isa, "torch_f32_avx2", have_avx2_torch, "torch_f32", "torch f32")
        for shape in ("S", "L"):
            for m in (m for m in ms if m >= 128):
                for t_arm, suffix, t_name in tvs:
                    r = ratio(ours(shape, m), _get(results, t_arm, shape, m), "gflops")
                    goal(
                        f"P-{shape}-M{m}{tag}{suffix}",
                        f"W4A16 prefill: ours GF/s / {t_name} dense GF/s, M={m}, {shape}",
                        r,
                        CONTEXT if suffix else ">= 0.8",
                    )
        kind = _w4a8_kind(isa, has_vnni)
        if not any(r["arm"] == "ours_w4a8" and r.get("isa") == isa for r in results):
            continue
        for shape in ("S", "L"):
            a8 = _get(results, "ours_w4a8", shape, 1, isa=isa)
            r = ratio(a8, ours(shape, 1))
            goal(f"A3-{shape}{tag}", f"W4A8 time / our W4A16 time, M=1, {shape}", r, "<= 1.0")
            for m in (m for m in ms if m >= 32):
                a8 = _get(results, "ours_w4a8", shape, m, isa=isa)
                if kind is not None:
                    r = ratio(a8, ours(shape, m), "gflops")
                    goal(
                        f"A1-{shape}-M{m}{tag}",
                        f"W4A8 GF/s / our W4A16 GF/s, M={m}, {shape}",
                        r,
                        f">= {W4A8_SPEEDUP_TARGET[kind]}",
                    )
                for g_arm, suffix, g_name in vs:
                    r = ratio(a8, _get(results, g_arm, shape, m), "gflops")
                    goal(
                        f"A2-{shape}-M{m}{tag}{suffix}",
                        f"W4A8 GF/s / {g_name} (W4A8) GF/s, M={m}, {shape}",
                        r,
                        CONTEXT if suffix else ">= 4.0",
                    )
    return out


def add_best_ratios(data: dict[str, Any]) -> None:
    """Fill in the best-call ratio and the per-round range of the goals of a run recorded
    before they were kept (for ``--render``): the goals recomputed from the run's rows,
    matched by id; verdicts and values stay as recorded."""
    if all("best" in g and "rounds" in g for g in data["goals"]):
        return
    isas = data.get("isas") or (data["isa"],)
    again = {
        g["id"]: g
        for g in goals(
            data["results"], data["probe"], data["isa"], isas, rounds=data.get("rounds", 1)
        )
    }
    for g in data["goals"]:
        new = again.get(g["id"], {})
        g.setdefault("best", new.get("best"))
        g.setdefault("rounds", new.get("rounds"))


# ---------------------------------------------------------------------------- report
def plot(data: dict[str, Any], path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    res = data["results"]
    ms = data.get("ms", [1, 8, 32])
    fig, axes = plt.subplots(1, 2, figsize=(14, 5))

    def label(r: dict[str, Any]) -> str:
        return f"{r['arm']}[{r['isa']}]" if r.get("isa") else r["arm"]

    arms = list(dict.fromkeys(label(r) for r in res))
    series = sorted(
        dict.fromkeys((label(r), r["variant"]) for r in res),
        key=lambda av: (arms.index(av[0]), av[1] != "hot"),
    )
    colors = {av: plt.get_cmap("tab20")(i % 20) for i, av in enumerate(series)}
    gf = {(label(r), r["variant"], r["shape"], r["m"]): r["gflops"] for r in res}
    for ax, shape in zip(axes, ("S", "L"), strict=True):
        here = [av for av in series if any((*av, shape, m) in gf for m in ms)]
        width = 0.8 / max(1, len(here))
        for i, (arm, variant) in enumerate(here):
            vals = [gf.get((arm, variant, shape, m), 0.0) for m in ms]
            ax.bar(
                [j - 0.4 + (i + 0.5) * width for j in range(len(ms))],
                vals,
                width,
                label=f"{arm} ({variant})",
                color=colors[(arm, variant)],
            )
        sh = data["shapes"][shape]
        ax.set_title(f"{shape}: N={sh['n']} K={sh['k']}, {data['threads']} threads")
        ax.set_xticks(range(len(ms)), [f"M={m}" for m in ms])
        ax.set_yscale("log")
        ax.set_ylabel("GFLOP/s (log)")
        ax.grid(axis="y", alpha=0.3)
    legend = {lab: h for ax in axes for h, lab in zip(*ax.get_legend_handles_labels(), strict=True)}
    fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=5, fontsize=8)
    fig.suptitle(f"NVFP4 CPU kernels, one process ({data['machine'].get('cpu', '?')})", fontsize=10)
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    fig.savefig(path, dpi=110)
    return True


def ggml_section(data: dict[str, Any]) -> list[str]:
    """How the ggml arms were called and their checks against the reference (empty without)."""
    checks = data.get("ggml_check") or {}
    if not checks:
        return []
    libs = data.get("ggml") or {}
    wheel = data["machine"]["versions"].get("llama_cpp_python")
    first = next(iter(libs.values()), {})
    source = first.get("source") or f"llama-cpp-python {wheel}'s bundled libraries"
    lines = [
        "",
        "## The ggml-cpu arms",
        "",
        f"{source}, called with ctypes: one context per shape holding the NVFP4 "
        "weight (type 40; its bytes are `nvfp4.layouts.gguf.to_gguf` of the same planes the other "
        "arms use) and its `.scale` tensor, and per M an F32 activation and the graph "
        "`ggml_mul(ggml_mul_mat(w, x), scale)` as llama.cpp's `build_lora_mm` builds it. "
        "`ggml_graph_plan` runs once per graph with the same thread count as the other arms, "
        "given one persistent `ggml_threadpool_new` pool (as llama.cpp keeps one; a build "
        "without OpenMP would otherwise start its threads in every call, about 15 ms on two "
        "cores), and its work buffer is preallocated; a timed call is one "
        "`ggml_graph_compute`: quantizing x "
        "to Q8_0, the NVFP4 x Q8_0 dot products and the `.scale` multiply, all included. ggml is "
        "therefore W4A8.",
        "",
        "| arm | libraries | ggml-cpu variant | compiled features | OpenMP | threadpool |",
        "|---|---|---|---|---|---|",
    ]
    for arm, lib in libs.items():
        lines.append(
            f"| {arm} | {', '.join(f'`{p}`' for p in lib.get('libraries', []))} | "
            f"{lib.get('variant') or 'plain build'} | "
            f"{', '.join(lib.get('compiled_features', [])) or '?'} | "
            f"{'yes' if lib.get('openmp') else 'no' if 'openmp' in lib else '?'} | "
            f"{lib.get('threadpool', '?')} |"
        )
    lines += [
        "",
        "A backend-DL build holds one `libggml-cpu-<variant>.so` per instruction set, as "
        "llama.cpp's release binaries ship them: `ggml` is the variant ggml's own loader picks "
        "on this CPU (highest `ggml_backend_score`), `ggml_avx2` the `haswell` variant "
        "(AVX2 + FMA + F16C, no AVX-512 and no VNNI: what an AVX2-only CPU such as AMD Zen 2 / 3 "
        "runs). Our AVX2 level's goals compare with `ggml_avx2`, so both sides of an AVX2-only "
        "machine are measured on this one; the ratios against `ggml` stand beside them as "
        "context. Each variant is opened `RTLD_LOCAL`, and its NVFP4 `vec_dot` lies in its own "
        "library (checked by nvfp4-engines' tests).",
        "",
        "Each output was checked before timing against `nvfp4.reference` (float64) as "
        "max|y - ref| / max|ref| over each M's output (worst M shown):",
        "",
        "| arm | shape | vs reference on x passed through Q8_0 (tol: spec W4A16 float32) | W4A8 "
        "error: vs reference on the same x (bound, this benchmark's) |",
        "|---|---|---:|---:|",
    ]
    lines += check_rows(
        checks,
        lambda c: (
            f"{c['q8_err']:.2e} ({c['q8_tol']:.0e}) | {c['w4a8_err']:.2e} ({c['w4a8_bound']:.0e})"
        ),
    )
    lines += [
        "",
        "The first error column shows ggml computes on exactly our weights (only the summation "
        "order differs); the second is the cost of Q8_0 activations, information only (spec "
        "1.1's `w4a8` tolerance holds W4A8 to the W4A8 reference, not to W4A16; for normal x the "
        "expected value is about 5e-3).",
    ]
    return lines


def check_rows(
    checks: dict[str, dict[str, dict[str, Any]]], cells: Callable[[dict[str, Any]], str]
) -> list[str]:
    """One Markdown row per arm (or ISA) and shape of a pre-timing check: the two names, then
    ``cells`` of that shape's figures."""
    return [
        f"| {arm} | {shape} | {cells(c)} |"
        for arm, by_shape in checks.items()
        for shape, c in by_shape.items()
    ]


def w4a8_section(data: dict[str, Any]) -> list[str]:
    """How our W4A8 arm was checked before timing (empty without it)."""
    checks = data.get("w4a8_check") or {}
    if not checks:
        return []
    lines = [
        "",
        "## Our W4A8 arm",
        "",
        "`nvfp4_cpu.w4a8.qmm_w4a8` per call (the layer the W4A16 arm's `ops.qmm` is on): the Q8_0 "
        "quantization of x (spec 1.1 `w4a8`), the integer dot products and the output "
        "allocation are all in the timed call. "
        "Checked before timing against `nvfp4.reference.qmm_w4a8` (float64 on the same Q8_0 "
        "codes) as max|y - ref| / max|ref|, held to spec 1.1's `w4a8` float32 tolerance; the "
        "last column is the activation quantization's own cost against the W4A16 reference "
        "(information):",
        "",
        "| ISA | shape | M | vs reference W4A8 (tol) | vs reference W4A16 |",
        "|---|---|---:|---:|---:|",
    ]
    lines += check_rows(
        checks, lambda c: f"{c['m']} | {c['err']:.2e} ({c['tol']:.0e}) | {c['vs_w4a16']:.2e}"
    )
    return lines


def markdown(data: dict[str, Any], png: str | None) -> str:
    res = data["results"]
    lines = [
        "# CPU NVFP4 kernels: nvfp4-cpu against every other CPU path, one process",
        "",
        "Produced by `benchmarks/cpu_kernels.py` (raw figures: "
        f"`benchmarks/results/{data.get('stem') or ('cpu_kernels_quick' if data['quick'] else 'cpu_kernels')}.json`). "
        "Every arm ran in the same process with the same thread cap (but `torch_f32_avx2`, whose "
        "AVX2 cap is fixed when torch loads: a child process with the same cap, asked for each "
        "call in turn, timing it itself). The arms of one (shape, M) "
        f"point ran back to back in {data.get('rounds', 1)} timed round(s), after "
        f"{data.get('warmup_rounds', 0)} untimed one(s); in each round every arm had "
        f"a {data.get('settle_s', 0)} s idle pause, a warm-up call, then {data['reps']} timed calls "
        + (
            f"or as many as last {data['burst_s']} s, the same count every round "
            if data.get("burst_s")
            else ""
        )
        + "(cold variants: at least two passes over their weight sets). Each figure is the median "
        "over all rounds' calls. Ratios are within this run.",
        "",
        f"- machine: {data['machine'].get('cpu', '?')}, {data['machine'].get('cpus')} CPUs; "
        f"nvfp4-cpu: {data['availability']}",
        "- our ISA levels measured (`NVFP4_CPU_ISA` forces one in an application): "
        + "; ".join(f"`{k}`: {v}" for k, v in (data.get("isas") or {data["isa"]: ""}).items()),
        f"- CPU SIMD flags: {' '.join(data['machine'].get('simd_flags', [])) or '?'}",
        f"- cache plan (`nvfp4_cpu.plan`, every level of ours): {data.get('cache_plan', '?')}; "
        f"the AVX2 level: {data.get('avx2_level', '?')}",
        f"- threads: {data['threads']} for every arm; load average at start / end: "
        f"{', '.join(f'{v:.2f}' for v in data['loadavg_start'])} / {', '.join(f'{v:.2f}' for v in data['loadavg_end'])}"
        " (a shared machine; this run's own threads count in these figures); this process ran at "
        "niceness "
        f"{data.get('niceness', 0)} (all arms alike)",
        f"- read-bandwidth probe ({data['probe']['bytes'] / 2**30:.2f} GiB, {data['threads']} threads): "
        f"median {data['probe']['median_gbps']:.1f} GB/s, best {data['probe']['max_gbps']:.1f} GB/s"
        + (
            f"; alternated call by call with the cold M=1 GEMV over the same weight sets "
            f"({data['probe']['paired']['calls']} calls each): probe {data['probe']['paired']['probe_median_gbps']:.1f} GB/s, ours "
            f"{data['probe']['paired']['ours_median_gbps']:.1f} GB/s (C5 uses these)"
            if "paired" in data["probe"]
            else ""
        ),
        f"- run time: {data['duration_s']:.0f} s",
    ]
    for arm, why in data["skipped"].items():
        lines.append(f"- **{arm}**: {why}")
    lines += [
        "",
        "## Goals (ratios from this run)",
        "",
        "The verdict is on the ratio of medians (`value`); `best calls` is the same ratio from "
        "each arm's fastest call, for context. The two disagree where a slow spell of the "
        "shared machine covered more bursts of one arm than of the other. `rounds` is the "
        "lowest and the highest of the ratio taken round by round (each arm's median call "
        "of the round; the arms of a round ran seconds apart): a goal whose range straddles "
        "its target is decided by this machine's noise, not by a margin.",
        "",
        "| id | goal | value | best calls | rounds | target | met |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for g in data["goals"]:
        v = "not measured" if g["value"] is None else f"{g['value']:.2f}"
        b = "-" if g.get("best") is None else f"{g['best']:.2f}"
        rr = g.get("rounds")
        sp = "-" if not rr else f"{rr[0]:.2f}-{rr[1]:.2f}"
        met = (
            "context, no goal"
            if g["target"] == CONTEXT
            else "n/a (arm absent)"
            if g["met"] is None
            else ("**yes**" if g["met"] else "no")
        )
        lines.append(f"| {g['id']} | {g['goal']} | {v} | {b} | {sp} | {g['target']} | {met} |")
    lines += ggml_section(data)
    lines += w4a8_section(data)
    best = data["isa"]
    for shape, sh in data["shapes"].items():
        lines += [
            "",
            f"## {shape}: N = {sh['n']}, K = {sh['k']}",
            "",
            f"| M | arm | ISA | variant | median ms | best ms | GFLOP/s | weight GB/s | median time / ours [{best}] (same M, variant) |",
            "|---:|---|---|---|---:|---:|---:|---:|---:|",
        ]
        for m in data.get("ms", [1, 8, 32]):
            for r in (r for r in res if r["shape"] == shape and r["m"] == m):
                ours = _get(res, "ours", shape, m, r["variant"], best) or _get(
                    res, "ours", shape, m, isa=best
                )
                rel = "" if ours is None else f"{r['median_s'] / ours['median_s']:.2f}x"
                lines.append(
                    f"| {m} | {r['arm']} | {r.get('isa') or '-'} | {r['variant']} | "
                    f"{r['median_s'] * 1e3:.3f} | {r['min_s'] * 1e3:.3f} | {r['gflops']:.1f} | "
                    f"{r['weight_gbps']:.2f} | {rel} |"
                )
    if png:
        lines += ["", f"![GFLOP/s per arm]({png})"]
    lines += [
        "",
        "Notes: `weight GB/s` counts the bytes of weights each arm reads in its own format "
        "(NVFP4 packed codes + scales for ours, numpy, MLX and ggml; 4 or 2 bytes per weight for the "
        "dense torch arms). The cold variant rotates through > 1 GB of distinct weight copies so every "
        "call streams its weights from DRAM. The numpy arm dequantizes to float32 on every call (a "
        "backend without a fused kernel). MLX's CPU kernel is single-threaded whatever the cap.",
        "",
        "Reading these figures on a shared host: the DRAM bandwidth a small VM gets can swing by "
        "several times within minutes (other tenants), and a VM's pages may sit on faster and slower "
        "host memory, so C5 alternates the read probe and the cold GEMV call by call over the same "
        "weight sets, instead of dividing by a probe of other memory taken earlier. "
        "Thread pools whose threads wait for each other (torch's OpenMP, ggml's OpenMP barriers) "
        "lose a whole scheduler tick (4 ms) when one of their threads is preempted, so on a busy "
        "machine their medians sit on multiples of 4 ms (while a CI job held one of the two cores, a "
        "2-thread ggml call on 4096 x 4096 at M = 1 took 24 ms instead of 0.6 ms). nvfp4-cpu hands "
        "out work dynamically, so a preempted worker costs it little: the ratios against those arms "
        "grow with the load average above.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=7, help="rounds over a point's arms")
    p.add_argument(
        "--burst-s",
        type=float,
        default=BURST_S,
        help=f"least seconds of one arm's timed calls in a round (default {BURST_S})",
    )
    p.add_argument(
        "--quick", action="store_true", help="small shapes, *_quick outputs (smoke test)"
    )
    p.add_argument(
        "--isa",
        default="all",
        help="our ISA levels to run, comma-separated (portable, avx2, avx512), or all",
    )
    p.add_argument(
        "--ms",
        type=lambda v: tuple(int(m) for m in v.split(",")),
        default=None,
        help="activation rows, comma-separated (default 1,8,32,128,512; --quick: 1,8,32)",
    )
    p.add_argument(
        "--ggml-avx2-variant",
        default="haswell",
        help="the backend-DL ggml-cpu variant our AVX2 level is compared with (default haswell)",
    )
    p.add_argument(
        "--tag",
        default="",
        help="write cpu_kernels_<tag>.json / .md instead (a second run beside the main one, "
        "e.g. the ggml arms on another libggml)",
    )
    p.add_argument("--render", metavar="JSON", help="only re-render the summary and plot of a run")
    args = p.parse_args()
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    if args.burst_s < 0:
        p.error("--burst-s must be >= 0")
    if args.reps < 5 and not args.quick:
        p.error("--reps must be >= 5 (the median of at least 5 runs)")
    data = json.loads(Path(args.render).read_text()) if args.render else run(args)
    if args.render:
        add_best_ratios(data)
    suffix = ("_quick" if data["quick"] else "") + (f"_{args.tag}" if args.tag else "")
    if not args.render:
        data["stem"] = f"cpu_kernels{suffix}"  # the files this run's summary names
    res_dir = ROOT / "benchmarks" / "results"
    doc_dir = ROOT / "docs" / "benchmark_results"
    res_dir.mkdir(parents=True, exist_ok=True)
    doc_dir.mkdir(parents=True, exist_ok=True)
    if not args.render:
        (res_dir / f"cpu_kernels{suffix}.json").write_text(json.dumps(data, indent=1) + "\n")
    png = f"cpu_kernels{suffix}.png"
    made = plot(data, doc_dir / png)
    (doc_dir / f"cpu_kernels{suffix}.md").write_text(markdown(data, png if made else None))
    print(f"wrote {doc_dir / f'cpu_kernels{suffix}.md'}" + ("" if args.render else " and the JSON"))
    for g in data["goals"]:
        v = "not measured" if g["value"] is None else f"{g['value']:.2f}"
        print(f"  {g['id']:<10} {g['goal']:<52} {v:>12}  target {g['target']:<7} met={g['met']}")


if __name__ == "__main__":
    main()
