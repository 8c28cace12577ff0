"""The dispatch table: (M, N, K, compute capability) -> the path a matmul takes.

**Status: provisional and unmeasured.** No GPU was lent to the session that wrote this
table, so the crossovers below are reasoned, not measured. ``benchmarks/cuda_kernels.py``
measures every path side by side on a GPU (W4A16 GEMV at M = 1, 4, 16 against a copy's
bandwidth; prefill against bfloat16 ``torch.matmul``; MoE gather at 8 and 64 experts);
when it has been run, replace the numbers here with its crossovers and cite the JSON.

W4A16 ``qmm`` (x float32 / float16 / bfloat16, weight NVFP4):

=========================  ==================  =====================  ======================
capability                 ``gemv``            ``gemm``               ``dequant_matmul``
=========================  ==================  =====================  ======================
8.x Ampere / Ada           M <= 4              4 < M < 1024           M >= 1024
9.0 Hopper                 M <= 4              4 < M < 1024           M >= 1024
10.x Blackwell (B200...)   M <= 4              4 < M < 1024           M >= 1024
12.x Blackwell (RTX 50..)  M <= 4              4 < M < 1024           M >= 1024
interpreter (CPU)          M <= 16             M > 16                 never (CPU torch)
=========================  ==================  =====================  ======================

Why these shapes of rule (what the measurements must confirm or move):

* ``gemv`` streams the weight once for up to 16 rows of x with CUDA-core FMAs; decode is
  bandwidth-bound, so it wins while M is small. Published NVFP4 decode GEMVs reach 61-73 %
  of DRAM bandwidth, good streaming GEMVs 82-94 %. Its work per
  weight byte grows with M (M FMAs per element) while the tensor-core ``gemm``'s does not
  (its small-M tile covers 16 rows). The one measurement behind the crossover so far is
  static: the instructions each kernel's K loop spends per weight byte in its compiled
  sm_90 code (``benchmarks/triton_sass.py``, ``docs/benchmark_results/triton_sass.md``):
  GEMV 11.4 / 17.0 / 23.8 / 38.5 at M = 1 / 2 / 4 / 8, GEMM 20.1 for any M up to 16. The
  GEMM is cheaper per byte from M = 4 on, but its grid has no split-K (``N / 64`` programs:
  64 for N = 4096, half an H200), so the GEMV keeps M <= 4.
* ``gemm`` dequantizes each weight tile in registers inside the K loop (no dense weight in
  memory): it moves 0.56 bytes per weight element against ~4.5 for dequantize-then-matmul,
  so it wins at moderate M.
* ``dequant_matmul`` writes a dense copy of the weight in x's dtype (2 bytes per element)
  and calls cuBLAS. At large M the GEMM is compute-bound and cuBLAS's tuned bf16 kernels
  beat a Triton mixed-input GEMM, while the dequantize pass costs a fixed ~4.5 bytes per
  weight element, amortized over M rows; around M ~ 1000 (research: "at M ~ 32 the two
  routes are a wash" for a GEMV-vs-dequant comparison; the GEMM moves the crossover up) it
  should win. For float32 x it is used only when torch's float32 matmul precision is
  "highest" (TF32 would break the float32 tolerance).
* Capability 10.x / 12.x have FP4 tensor cores, but W4A16 (``qmm``) keeps x in 16 bits:
  using them needs the activations quantized, which changes the numerics. That is the
  separate ``qmm_w4a4`` verb (below); ``qmm`` never switches to it silently.

W4A4 ``qmm_w4a4``: capability 10.x and 12.x only, through ``torch._scaled_mm`` with
``float4_e2m1fn_x2`` operands and 128x4-swizzled E4M3 block scales (:mod:`nvfp4_cuda.w4a4`).
Elsewhere the ``w4a4`` capability is not declared and the verb raises.

MoE ``gather_qmm``: ``rows`` (one program per row of x, the expert streamed like the GEMV)
for unsorted ids with ``M <= 16``; ``grouped`` (rows grouped by expert, each expert's tile
read once per group of ``BLOCK_M`` rows, tensor cores) otherwise, and always when the
caller passes sorted ids.

Overrides, for comparison runs (the benchmark uses them):

* ``NVFP4_CUDA_PATH=gemv|gemm|dequant_matmul`` forces every ``qmm`` onto one path;
* ``NVFP4_CUDA_GATHER_PATH=rows|grouped`` forces every ``gather_qmm`` onto one path.

An unknown value is an error naming the allowed ones.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from nvfp4_triton.ops import GATHER_PATHS, QMM_PATHS

__all__ = [
    "GATHER_PATH_ENV",
    "PATH_ENV",
    "TABLE",
    "Crossovers",
    "crossovers_for",
    "gather_path",
    "qmm_path",
]

PATH_ENV = "NVFP4_CUDA_PATH"
GATHER_PATH_ENV = "NVFP4_CUDA_GATHER_PATH"


@dataclass(frozen=True)
class Crossovers:
    """Where one path hands over to the next, in rows of x.

    Attributes:
        gemv_max_m: ``gemv`` for ``M <= gemv_max_m``.
        dense_min_m: ``dequant_matmul`` for ``M >= dense_min_m`` (``None``: never).
        gather_rows_max_m: unsorted ``gather_qmm`` with ``M <= this`` uses ``rows``.
        measured: whether the numbers come from a benchmark run (cite it in ``source``).
        source: where the numbers come from.
    """

    gemv_max_m: int
    dense_min_m: int | None
    gather_rows_max_m: int = 16
    measured: bool = False
    source: str = "provisional: reasoned from published figures, not measured"


_GPU = Crossovers(
    gemv_max_m=4,
    dense_min_m=1024,
    source=(
        "provisional: gemv_max_m from static instruction counts of the compiled sm_90 "
        "kernels (benchmarks/triton_sass.py); dense_min_m reasoned from published figures; "
        "no GPU timing yet"
    ),
)

#: Compute capability major (or "interpreter") -> crossovers.
TABLE: dict[Any, Crossovers] = {
    8: _GPU,
    9: _GPU,
    10: _GPU,
    12: _GPU,
    "interpreter": Crossovers(
        gemv_max_m=16,
        dense_min_m=None,
        source="interpreter: every kernel path is certified; dense matmul would run torch on the CPU",
    ),
}


def crossovers_for(capability: tuple[int, int] | None) -> Crossovers:
    """The crossovers of a compute capability (``None``: the interpreter)."""
    if capability is None:
        return TABLE["interpreter"]
    return TABLE.get(capability[0], _GPU)


def _override(env: str, allowed: tuple[str, ...]) -> str | None:
    value = os.environ.get(env, "").strip()
    if not value:
        return None
    if value not in allowed:
        raise ValueError(f"${env}={value!r}: expected one of {', '.join(allowed)}")
    return value


def _fp32_matmul_exact() -> bool:
    import torch

    return bool(torch.get_float32_matmul_precision() == "highest")


def qmm_path(m: int, n: int, k: int, x_dtype: Any, capability: tuple[int, int] | None) -> str:
    """The W4A16 path for ``[m, k] x [n, k]^T`` (``$NVFP4_CUDA_PATH`` first)."""
    forced = _override(PATH_ENV, QMM_PATHS)
    if forced is not None:
        return forced
    c = crossovers_for(capability)
    if m <= c.gemv_max_m:
        return "gemv"
    if c.dense_min_m is not None and m >= c.dense_min_m:
        import torch

        if x_dtype != torch.float32 or _fp32_matmul_exact():
            return "dequant_matmul"
    return "gemm"


def gather_path(
    m: int, n: int, k: int, experts: int, sorted_indices: bool, capability: tuple[int, int] | None
) -> str:
    """The MoE path (``$NVFP4_CUDA_GATHER_PATH`` first)."""
    forced = _override(GATHER_PATH_ENV, GATHER_PATHS)
    if forced is not None:
        return forced
    if sorted_indices or m > crossovers_for(capability).gather_rows_max_m:
        return "grouped"
    return "rows"
