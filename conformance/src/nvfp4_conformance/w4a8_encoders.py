"""Judging W4A8 activation encoders against the reference's (spec 1.1, "Conformance of
other encoders"), for T2 and T5.

* int8 (:func:`compare_q8`): ``d`` (float16, NaN for a block holding NaN or Inf)
  bit-identical; a code may differ from the reference's by one, with the same sign or zero,
  only where the reference's ``|x * id|`` lies within ``window`` (relative) of the midpoint
  of the two codes (exact midpoints included: a half-to-even encoder conforms); a
  non-finite block has zero codes. Returns the counts; the caller judges the count.
* FP8 (:func:`compare_fp8`): codes and the input scale bit-identical.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from nvfp4.activations import FP8Activations, Q8Activations
from nvfp4.spec import Q8_BLOCK_SIZE, Q8_MAX

__all__ = ["compare_fp8", "compare_q8"]


def compare_q8(
    x: npt.NDArray[Any], got: Q8Activations, ref: Q8Activations, *, window: float
) -> dict[str, int]:
    """Judge int8 activation planes against the reference's (spec 1.1, "Conformance of other
    encoders"); returns the counts, raises ``AssertionError`` on an illegal difference."""
    assert isinstance(got, Q8Activations), f"expected Q8Activations, found {type(got).__name__}"
    assert got.shape == ref.shape, f"codes shape {got.shape}, expected {ref.shape}"
    gd = np.asarray(got.d, dtype=np.float16)
    same_d = (gd.view(np.uint16) == ref.d.view(np.uint16)) | (np.isnan(gd) & np.isnan(ref.d))
    if not same_d.all():
        m, b = (int(i) for i in np.argwhere(~same_d)[0])
        raise AssertionError(
            f"d of row {m}, block {b} (elements {32 * b}..{32 * b + 31}): {gd[m, b]!r}, "
            f"expected {ref.d[m, b]!r} (float16 of amax / 127, bit-identical)"
        )
    m, k = ref.shape
    gc = np.asarray(got.codes).astype(np.int64)
    rc = ref.codes.astype(np.int64)
    diff = gc != rc
    a = np.asarray(x, dtype=np.float32)
    blocks = a.reshape(m, k // Q8_BLOCK_SIZE, Q8_BLOCK_SIZE)
    finite_block = np.repeat(np.isfinite(blocks).all(axis=-1), Q8_BLOCK_SIZE, axis=-1)
    if (diff & ~finite_block).any():
        i, j = (int(v) for v in np.argwhere(diff & ~finite_block)[0])
        raise AssertionError(
            f"code at ({i}, {j}) of a block holding NaN/Inf: {gc[i, j]}, expected 0"
        )
    if diff.any():
        amax = np.abs(np.where(np.isfinite(blocks), blocks, 0)).max(axis=-1)
        d = (amax / np.float32(Q8_MAX)).astype(np.float32)
        with np.errstate(divide="ignore"):
            inv = np.where(d == 0, np.float32(0.0), np.float32(1.0) / d).astype(np.float32)
        v = (blocks * inv[..., None]).astype(np.float32).reshape(m, k).astype(np.float64)
        mid = np.abs(gc + rc) / 2.0
        one_apart = np.abs(gc - rc) == 1
        near = np.abs(np.abs(v) - mid) <= window * mid
        legal = one_apart & near & (np.sign(gc) * np.sign(rc) >= 0)
        bad = diff & ~legal
        if bad.any():
            i, j = (int(t) for t in np.argwhere(bad)[0])
            raise AssertionError(
                f"code at ({i}, {j}): {gc[i, j]}, expected {rc[i, j]}; x = {a[i, j]!r}, "
                f"x * id = {v[i, j]!r} is not within {window:g} (relative) of the midpoint "
                f"of the two codes: not a boundary disagreement"
            )
    return {
        "elements": int(x.size),
        "disagreements": int(np.count_nonzero(diff)),
        "nonfinite_blocks": int(np.count_nonzero(np.isnan(ref.d))),
    }


def compare_fp8(
    x: npt.NDArray[Any], got: FP8Activations, ref: FP8Activations
) -> tuple[dict[str, Any], str]:
    """Judge FP8 activation planes against the reference's, codes and input scale bit for
    bit: returns the figures and what is wrong (``""`` when nothing is)."""
    assert isinstance(got, FP8Activations), f"expected FP8Activations, found {type(got).__name__}"
    gs, rs = np.float32(got.input_scale), np.float32(ref.input_scale)
    codes = np.asarray(got.codes)
    assert codes.shape == ref.codes.shape, f"codes shape {codes.shape}, expected {ref.codes.shape}"
    bad = codes != ref.codes
    figures = {"input_scale": float(rs), "disagreements": int(np.count_nonzero(bad))}
    if gs.view(np.uint32) != rs.view(np.uint32):
        return figures, f"input_scale {gs!r}, expected {rs!r} (bit-identical)"
    if bad.any():
        i, j = (int(v) for v in np.argwhere(bad)[0])
        return figures, (
            f"FP8 code at ({i}, {j}): {int(codes[i, j]):#04x}, expected "
            f"{int(ref.codes[i, j]):#04x} for x = {np.float32(x[i, j])!r} / input_scale "
            f"{rs!r} (e4m3, RNE, saturating at 448)"
        )
    return figures, ""
