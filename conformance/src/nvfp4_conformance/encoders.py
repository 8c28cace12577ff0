"""Judging an encoder against the reference encoder (spec 1.0, "Conformance of other
encoders").

Given the input, the reference's planes and the encoder's planes (same global), every
element whose code or block scale byte differs is a *disagreement*. A disagreement is
legal (a *boundary disagreement*) only if

* scale byte: it differs by one step and the reference's clamped, unrounded block scale
  ``s`` lies within ``window * mid`` of the midpoint ``mid`` of the two E4M3 values (the
  block's codes are then compared with those the encoder's scale byte gives);
* code: same sign bit, neighbouring magnitudes, and the reference's ``|q|`` (computed with
  the block's scale) lies within ``window * mid`` of their midpoint (exact midpoints
  included); or codes 0 and 8 exchanged (both zero);

and a block of the input holding NaN or Inf has scale byte 0x7F and codes 0 in both. Any
other difference fails. The caller compares the count with the spec's ``reference`` (0) or
``others`` fraction.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from nvfp4 import reference
from nvfp4.planes import NVFP4Planes
from nvfp4.spec import (
    BLOCK_SIZE,
    E2M1_VALUES,
    E4M3_NAN_BYTE,
    E4M3_VALUES,
    block_scale_unrounded,
)

__all__ = ["EncodingComparison", "compare_encoding"]

_MAGNITUDES = E2M1_VALUES[:8]
NONFINITE_SCALE = E4M3_NAN_BYTE
#: The largest valid scale byte (448).
_E4M3_MAX_BYTE = E4M3_NAN_BYTE - 1


@dataclass
class EncodingComparison:
    """Counts of one comparison (all boundary disagreements, since anything else raised)."""

    elements: int
    disagreements: int
    scale_disagreements: int
    code_disagreements: int
    midpoints: int

    def figures(self) -> dict[str, int]:
        return {
            "elements": self.elements,
            "disagreements": self.disagreements,
            "scale_disagreements": self.scale_disagreements,
            "code_disagreements": self.code_disagreements,
            "midpoints": self.midpoints,
        }


def _unrounded_scale(blocks: npt.NDArray[np.float32], g: np.float32) -> npt.NDArray[np.float32]:
    """Reference encoder step 2 before the E4M3 rounding: ``block_amax / (6 * global)``
    (float32, the product first), 0 -> 1, clamped to ``[2^-9, 448]``."""
    return block_scale_unrounded(np.abs(blocks).max(axis=-1), g)


#: How a disagreement that only the reference backend's bit-exact rule forbids ends its message.
_MUST_MATCH = " (the reference backend must match exactly)"


def _raise_first_illegal(
    exact: bool,
    illegal: npt.NDArray[np.bool_],
    diff: npt.NDArray[np.bool_],
    describe: Callable[[tuple[int, ...]], str],
    not_boundary: str = "",
) -> None:
    """Raise ``AssertionError`` where the comparison fails: at the first ``illegal``
    disagreement (``describe(at)`` ending with ``not_boundary``), else with ``exact`` (the
    reference backend) at the first of ``diff`` (ending with :data:`_MUST_MATCH`)."""
    if illegal.any():
        at = tuple(int(v) for v in np.argwhere(illegal)[0])
        raise AssertionError(describe(at) + not_boundary)
    if exact:
        at = tuple(int(v) for v in np.argwhere(diff)[0])
        raise AssertionError(describe(at) + _MUST_MATCH)


def compare_encoding(
    x: Any, got: Any, ref: NVFP4Planes, *, window: float, exact: bool, what: str = "encoder"
) -> EncodingComparison:
    """Compare an encoder's planes ``got`` for input ``x [M, K]`` with the reference's
    planes ``ref``; raise ``AssertionError`` at the first illegal difference."""
    assert isinstance(got, NVFP4Planes), (
        f"{what} returned {type(got).__name__}, not nvfp4.NVFP4Planes"
    )
    xa = np.asarray(x).astype(np.float32)
    m, k = xa.shape
    assert got.codes.shape == ref.codes.shape, (
        f"{what}: codes shape {got.codes.shape}, expected {ref.codes.shape}"
    )
    assert got.scales.shape == ref.scales.shape, (
        f"{what}: scales shape {got.scales.shape}, expected {ref.scales.shape}"
    )
    g_got = np.asarray(got.global_scale, dtype=np.float32).reshape(())
    g_ref = np.asarray(ref.global_scale, dtype=np.float32).reshape(())
    assert g_got.tobytes() == g_ref.tobytes(), (
        f"{what}: global {float(g_got)!r}, the reference's is {float(g_ref)!r} "
        "(a dynamic global must be bit-identical: amax of the finite values / 2688 in float32)"
    )
    g = np.float32(g_ref)
    blocks = xa.reshape(m, k // BLOCK_SIZE, BLOCK_SIZE)
    finite_block: npt.NDArray[np.bool_] = np.asarray(np.isfinite(blocks).all(axis=-1))
    c_got = reference.unpack_codes(got.codes).reshape(blocks.shape)
    c_ref = reference.unpack_codes(ref.codes).reshape(blocks.shape)

    # non-finite blocks: 0x7F and zero codes, in both
    bad = ~finite_block & ((got.scales != NONFINITE_SCALE) | (c_got != 0).any(axis=-1))
    if bad.any():
        at = tuple(int(v) for v in np.argwhere(bad)[0])
        raise AssertionError(
            f"{what}: block {at} holds NaN/Inf; it must get scale byte 0x7F and codes 0, found "
            f"0x{int(got.scales[at]):02X} and codes {c_got[at].tolist()}"
        )

    # scale bytes
    clean = np.where(np.isfinite(blocks), blocks, np.float32(0.0)).astype(np.float32)
    s = _unrounded_scale(clean, g)
    sdiff = finite_block & (got.scales != ref.scales)
    if sdiff.any():
        b_got = got.scales.astype(np.int64)
        b_ref = ref.scales.astype(np.int64)
        step_ok = (np.abs(b_got - b_ref) == 1) & (b_got <= _E4M3_MAX_BYTE)
        mid = (
            E4M3_VALUES[np.clip(b_got, 0, _E4M3_MAX_BYTE)].astype(np.float64)
            + E4M3_VALUES[b_ref].astype(np.float64)
        ) / 2
        near = np.abs(s.astype(np.float64) - mid) <= window * mid
        illegal = sdiff & ~(step_ok & near)
        _raise_first_illegal(
            exact,
            illegal,
            sdiff,
            lambda at: (
                f"{what}: block {at} has scale byte 0x{int(got.scales[at]):02X}, the reference's is "
                f"0x{int(ref.scales[at]):02X}; the unrounded scale {float(s[at])!r} is not within "
                f"the boundary window of their midpoint"
            ),
        )

    # codes, against the reference's rounding of q computed with the encoder's scale byte
    scale_used = np.where(finite_block, got.scales, ref.scales)
    denom = (E4M3_VALUES[scale_used] * g).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        q = (clean / denom[..., None]).astype(np.float32)
    encoded = reference.e2m1_encode(q, np.asarray(clean < 0))
    expect: npt.NDArray[np.uint8] = np.where(finite_block[..., None], encoded, 0).astype(np.uint8)
    mag_q = np.abs(q).astype(np.float64)
    mids = (_MAGNITUDES[:-1].astype(np.float64) + _MAGNITUDES[1:]) / 2
    at_mid = np.isin(np.abs(q), mids.astype(np.float32)) & finite_block[..., None]
    cdiff = c_got != expect
    if cdiff.any():
        zero_swap = ((c_got & 7) == 0) & ((expect & 7) == 0)
        lo = np.minimum(c_got & 7, expect & 7).astype(np.int64)
        neighbours = (np.abs((c_got & 7).astype(np.int64) - (expect & 7)) == 1) & (
            (c_got & 8) == (expect & 8)
        )
        mid = mids[np.clip(lo, 0, 6)]
        near = np.abs(mag_q - mid) <= window * mid
        illegal = cdiff & ~(zero_swap | (neighbours & near))
        _raise_first_illegal(
            exact,
            illegal,
            cdiff,
            lambda at: (
                f"{what}: element (row {at[0]}, col {at[1] * BLOCK_SIZE + at[2]}) x = {float(clean[at])!r}, "
                f"scaled value {float(q[at])!r}: code {int(c_got[at])}, the reference gives "
                f"{int(expect[at])}"
            ),
            "; not a boundary disagreement",
        )
    elem_scale = np.broadcast_to(sdiff[..., None], blocks.shape)
    differs = elem_scale | (c_got != c_ref)
    return EncodingComparison(
        elements=int(xa.size),
        disagreements=int(differs.sum()),
        scale_disagreements=int(sdiff.sum()),
        code_disagreements=int(cdiff.sum()),
        midpoints=int(at_mid.sum()),
    )
