"""Matmul cases sized for a GPU, and the stand-ins the Triton interpreter runs in their place.

Under the Triton interpreter (``TRITON_INTERPRET=1``) every kernel runs program after program
on the CPU with numpy, so a case costs its programs times their loop iterations: W4A8 at
M = 300, K = 4096 takes minutes with an AMD family's 16-row tiles. What the interpreter can
prove is the kernels' logic - index arithmetic and masks - and a smaller case with the same
tile edges and masked tails proves as much of it. The numbers a GPU produces (tensor-core
accumulation over the full K) only a GPU can certify.

So a case too large for the interpreter is marked ``gpu_sized`` and has a stand-in,
:func:`stand_in` of its shape: the same rows modulo :data:`ROW_TILE` with at least two
row tiles, the same K modulo :data:`K_STEP` with at least two K steps of half that, the
same N. The stand-in is an ordinary case: every backend runs it, on every device. Under
the interpreter the GPU-sized case is left out, and the certificate's ``left_out`` says
so, naming the stand-in that ran in its place; the run is partial, as an interpreter run
already is (T6 needs a GPU).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from typing import Any

import pytest

__all__ = [
    "K_STEP",
    "MARKER",
    "ROW_TILE",
    "interpreting",
    "left_out_reason",
    "matmul_params",
    "shape_id",
    "stand_in",
]

#: The marker of a GPU-sized case; its arguments are its id and its stand-in's.
MARKER = "gpu_sized"
#: The largest row tile of any kernel config (AMD CDNA's GEMM, 128 rows): a stand-in keeps
#: M modulo it, so every row tile up to it sees the same masked tail.
ROW_TILE = 128
#: K modulo this is kept, and at least this much K: two steps of the largest K step a
#: matmul loop takes (512 elements: the interpreter's GEMM tile and its W4A8 chunk of
#: 16 blocks of 32), the same K tail for every tile up to 1024.
K_STEP = 1024


def interpreting() -> bool:
    """Whether the kernels run under the Triton interpreter (``TRITON_INTERPRET=1``): the
    certificate's device is then "Triton interpreter on CPU"."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def shape_id(m: int, k: int, n: int) -> str:
    """A matmul case's shape as its id says it: ``M300_K4096_N56``."""
    return f"M{m}_K{k}_N{n}"


def stand_in(m: int, k: int, n: int) -> tuple[int, int, int]:
    """The interpreter-sized shape of a GPU-sized ``(M, K, N)``: M kept below
    ``2 * ROW_TILE`` (else two row tiles, the second holding M's tail), K
    kept up to ``K_STEP`` (else ``K_STEP + K % K_STEP``), N unchanged."""
    m2 = m if m < 2 * ROW_TILE else ROW_TILE + (m % ROW_TILE or ROW_TILE)
    k2 = k if k <= K_STEP else K_STEP + k % K_STEP
    return m2, k2, n


def matmul_params(
    cases: Sequence[tuple[Any, ...]], *, gpu_sized: Collection[str], labelled: bool = False
) -> list[Any]:
    """``cases`` as ``pytest.param`` s for a parametrize of ``(m, k, n, ...)`` (or of
    ``(label, m, k, n, ...)`` when ``labelled``: the label starts with the shape's id).
    Each case whose id is in ``gpu_sized`` is marked :data:`MARKER` and followed by its
    stand-in (the same values with the shape of :func:`stand_in`, its id the case's with
    that shape)."""
    at = 1 if labelled else 0
    out = []
    unknown = set(gpu_sized)
    for case in cases:
        m, k, n = case[at : at + 3]
        own = shape_id(m, k, n)
        case_id = str(case[0]) if labelled else own
        if not case_id.startswith(own):
            raise ValueError(f"case {case_id!r}: its id should start with its shape {own!r}")
        if case_id not in gpu_sized:
            out.append(pytest.param(*case, id=case_id))
            continue
        unknown.discard(case_id)
        shape = stand_in(m, k, n)
        if shape == (m, k, n):
            raise ValueError(f"case {case_id!r} is marked GPU-sized but is its own stand-in")
        small_id = shape_id(*shape) + case_id[len(own) :]
        small = (*case[:at], *shape, *case[at + 3 :])
        if labelled:
            small = (small_id, *small[1:])
        out.append(pytest.param(*case, id=case_id, marks=pytest.mark.gpu_sized(case_id, small_id)))
        out.append(pytest.param(*small, id=small_id))
    if unknown:
        raise ValueError(f"gpu_sized names no case: {sorted(unknown)}")
    return out


def left_out_reason(item: pytest.Item) -> str | None:
    """Why a GPU-sized ``item`` does not run under the interpreter, in the certificate's
    words, or None when it is not GPU-sized or the kernels are not interpreted."""
    marker = item.get_closest_marker(MARKER)
    if marker is None or not interpreting():
        return None
    case, small = marker.args
    test = getattr(item, "originalname", item.name)
    return (
        f"Triton interpreter on CPU: {test}[{case}] is sized for a GPU and left to one; the "
        f"interpreter's case is its stand-in {small} (the same tile edges and masked tails)"
    )
