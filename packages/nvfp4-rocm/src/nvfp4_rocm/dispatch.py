"""The ROCm dispatch: (M, x dtype, architecture family) -> the path a matmul takes.

**Status: provisional and unmeasured.** No AMD GPU was lent to the session that wrote
this; every crossover below is reasoned, not measured. Replace them with benchmark
crossovers (and set ``measured=True`` with the results file in ``source``) once a run on
each family exists.

W4A16 ``qmm``:

=========================  =============  ================================================
family                     ``gemv``       ``dequant_matmul`` (dequantize, then hipBLASLt)
=========================  =============  ================================================
CDNA3 (gfx942, MI300X)     M <= 8         M > 8
CDNA4 (gfx950, MI355X)     M <= 8         M > 8
RDNA3 (gfx11xx)            M <= 16        M > 16
RDNA4 (gfx12xx)            M <= 16        M > 16
=========================  =============  ================================================

The interpreter follows the table of the architecture it imitates (``$NVFP4_ROCM_ARCH``,
default gfx942), so conformance under the interpreter certifies the same paths a GPU
takes (there ``torch.matmul`` runs on the CPU).

Why (what the measurements must confirm or move):

* ``gemv`` streams the packed weight once (0.56 bytes per element) and does M FMAs per
  element on the vector ALUs. MI300X moves ~9.4e12 weight elements/s at 5.3 TB/s, so 2·M
  FLOPs per element reach its ~163 TFLOP/s float32 vector peak near M = 8: beyond that
  the GEMV stops being bandwidth-bound. RDNA parts pair less bandwidth (0.6-1 TB/s) with
  proportionally more ALU, hence the higher bound (and :data:`GEMV_MAX_ROWS` = 16 rows
  per launch).
* ``dequant_matmul`` writes the dense weight once (x's dtype, global folded in) and hands
  the product to hipBLASLt's MFMA / WMMA kernels: the dequantize pass costs a fixed
  ~4.5 bytes per weight element amortized over M rows. AMD has no NVFP4 matrix
  instruction (gfx950's FP4 MFMA takes MXFP4's E8M0 scales), so a W4A16 Triton GEMM
  (``gemm``) has to decode in registers and feed bfloat16 MFMA anyway; whether it beats
  dequantize + hipBLASLt for mid-sized M is exactly what a benchmark must decide.
* float32 x goes to ``dequant_matmul`` only when torch's float32 matmul precision is
  ``"highest"`` (ROCm may otherwise use XF32 on CDNA3, which breaks the float32
  tolerance); else to ``gemm``.

Emulated W4A4 (:mod:`nvfp4_rocm.w4a4`): ``gemv`` up to the same M, then ``gemm`` - never
``dequant_matmul``, which folds the weight's global into every decoded element before the
sum (one more float32 rounding per element): measured under the interpreter, that path
used 0.75 of the float32 W4A4 tolerance on conformance case M33_K512_N7, while the
kernels that apply the global after accumulation stay where a native W4A4 GEMM would.

MoE ``gather_qmm``: ``rows`` for unsorted ids with M <= 16, ``grouped`` otherwise and
whenever the caller passes sorted ids (the same rule on every family, unmeasured).

Overrides, for comparisons and benchmarks:

* ``NVFP4_ROCM_PATH=gemv|gemm|dequant_matmul`` forces every ``qmm`` onto one path;
* ``NVFP4_ROCM_GATHER_PATH=rows|grouped`` forces every ``gather_qmm`` onto one path.

An unknown value is an error naming the allowed ones.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from nvfp4_triton.ops import GATHER_PATHS, GEMV_MAX_ROWS, QMM_PATHS

from .configs import match_arch

__all__ = [
    "GATHER_PATH_ENV",
    "PATH_ENV",
    "RULES",
    "FamilyRule",
    "gather_path",
    "qmm_path",
    "rule_for",
    "w4a4_path",
]

PATH_ENV = "NVFP4_ROCM_PATH"
GATHER_PATH_ENV = "NVFP4_ROCM_GATHER_PATH"

_REASONED = "provisional: reasoned from published bandwidth and ALU figures, not measured"


@dataclass(frozen=True)
class FamilyRule:
    """One family's crossovers, in rows of x.

    Attributes:
        gemv_up_to: ``gemv`` for ``M <= gemv_up_to``, ``dequant_matmul`` above.
        gather_rows_up_to: unsorted ``gather_qmm`` with ``M <= this`` uses ``rows``.
        measured: whether the numbers come from a benchmark run (cite it in ``source``).
        source: where the numbers come from.
    """

    gemv_up_to: int
    gather_rows_up_to: int = GEMV_MAX_ROWS
    measured: bool = False
    source: str = _REASONED


#: Family key -> crossovers.
RULES: dict[str, FamilyRule] = {
    "cdna3": FamilyRule(gemv_up_to=8),
    "cdna4": FamilyRule(gemv_up_to=8),
    "rdna3": FamilyRule(gemv_up_to=GEMV_MAX_ROWS),
    "rdna4": FamilyRule(gemv_up_to=GEMV_MAX_ROWS),
}


def rule_for(arch: str) -> FamilyRule:
    """The crossovers of a ``gfx`` architecture (by its family)."""
    return RULES[match_arch(arch).family.key]


def _forced(env: str, allowed: tuple[str, ...]) -> str | None:
    """The path ``$env`` forces, if any (an unknown value is a ``ValueError``)."""
    value = os.environ.get(env, "").strip()
    if value and value not in allowed:
        raise ValueError(f"${env}={value!r}: expected one of {', '.join(allowed)}")
    return value or None


def qmm_path(m: int, x_dtype: Any, arch: str) -> str:
    """The W4A16 path for ``m`` rows of x on ``arch`` (``$NVFP4_ROCM_PATH`` first)."""
    forced = _forced(PATH_ENV, QMM_PATHS)
    if forced:
        return forced
    if m <= rule_for(arch).gemv_up_to:
        return "gemv"
    import torch

    if x_dtype == torch.float32 and torch.get_float32_matmul_precision() != "highest":
        return "gemm"
    return "dequant_matmul"


def w4a4_path(m: int, arch: str) -> str:
    """The W4A16 path of emulated W4A4 (float32 decoded activations, ``m`` rows):
    ``$NVFP4_ROCM_PATH`` first, else ``gemv`` or ``gemm`` (globals after accumulation)."""
    forced = _forced(PATH_ENV, QMM_PATHS)
    if forced:
        return forced
    return "gemv" if m <= rule_for(arch).gemv_up_to else "gemm"


def gather_path(m: int, sorted_indices: bool, arch: str) -> str:
    """The MoE path (``$NVFP4_ROCM_GATHER_PATH`` first)."""
    forced = _forced(GATHER_PATH_ENV, GATHER_PATHS)
    if forced:
        return forced
    if not sorted_indices and m <= rule_for(arch).gather_rows_up_to:
        return "rows"
    return "grouped"
