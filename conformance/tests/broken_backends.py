"""Test-only NVFP4 backends: the reference kernels with one deliberate defect each.

The self-tests copy this file next to a ``*.dist-info`` whose ``entry_points.txt`` registers
every factory below in the group ``nvfp4.backends``, so the suite finds them through
``nvfp4.get_backend`` exactly as it finds a real backend.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from nvfp4 import reference
from nvfp4.activations import FP8Activations, Q8Activations
from nvfp4.contract import Availability
from nvfp4.dtypes import OUTPUT_DTYPES, dtype_name
from nvfp4.planes import NVFP4Planes
from nvfp4.reference_backend import ReferenceKernels
from nvfp4.spec import E2M1_VALUES, E4M3_MAX, E4M3_NAN_BYTE, E4M3_VALUES, Q8_BLOCK_SIZE, Q8_MAX

BFLOAT16 = OUTPUT_DTYPES["bfloat16"]


class _Broken(ReferenceKernels):
    NAME = "broken"
    DROP_CAPS: frozenset[str] = frozenset()
    #: the registry's deviations this backend declares (none: its failures are bugs)
    DEVIATIONS: tuple[str, ...] = ()

    def __init__(self) -> None:
        super().__init__()
        self.info = dataclasses.replace(
            self.info,
            name=self.NAME,
            capabilities=self.info.capabilities - self.DROP_CAPS,
            version="0.0.0+test",
            package="nvfp4-conformance-tests",
            notes=("test-only backend with a deliberate defect",),
            deviations=self.DEVIATIONS,
        )


class FlipCode(_Broken):
    """Decodes E2M1 code 5 (3.0) as code 6 (4.0): one wrong entry in its decode table,
    introduced when it prepares a weight."""

    NAME = "broken-flip-code"

    def prepare(self, planes: NVFP4Planes) -> Any:
        lo, hi = planes.codes & 0x0F, planes.codes >> 4
        lo = np.where(lo == 5, 6, lo)
        hi = np.where(hi == 5, 6, hi)
        return super().prepare(planes.replace(codes=(lo | (hi << 4)).astype(np.uint8)))


class DropGlobal(_Broken):
    """Keeps only the first per-partition / per-expert global (a loader that silently drops
    the others)."""

    NAME = "broken-drop-global"

    def prepare(self, planes: NVFP4Planes) -> Any:
        g = np.asarray(planes.global_scale)
        if g.ndim:
            planes = planes.replace(global_scale=np.asarray(g.reshape(-1)[0], dtype=np.float32))
        return super().prepare(planes)


class IgnoreOutOfRange(_Broken):
    """Clamps MoE expert ids into [0, E) instead of giving zero rows."""

    NAME = "broken-ignore-out-of-range"

    def gather_qmm(
        self, x: Any, w: Any, expert_ids: Any, *, sorted_indices: bool, out_dtype: str
    ) -> Any:
        e = w.planes.num_experts or 1
        ids = np.clip(np.asarray(expert_ids), 0, e - 1)
        return super().gather_qmm(x, w, ids, sorted_indices=sorted_indices, out_dtype=out_dtype)


class RefuseOutOfRange(_Broken):
    """Raises on an expert id outside [0, E) instead of giving a zero row (as an engine that
    guards an unchecked gather does): only the cases with such ids can fail."""

    NAME = "broken-refuse-out-of-range"

    def gather_qmm(
        self, x: Any, w: Any, expert_ids: Any, *, sorted_indices: bool, out_dtype: str
    ) -> Any:
        e = w.planes.num_experts or 1
        ids = np.asarray(expert_ids)
        if ((ids < 0) | (ids >= e)).any():
            raise ValueError(f"gather_qmm: an expert id outside [0, {e})")
        return super().gather_qmm(x, w, ids, sorted_indices=sorted_indices, out_dtype=out_dtype)


class NarrowX(_Broken):
    """Rounds x to a narrower type before ``qmm``, as a kernel on tensor cores might: float32
    to TF32 (10 mantissa bits, round to nearest even), float16 to bfloat16, bfloat16 to
    float16."""

    NAME = "broken-narrow-x"

    def qmm(self, x: Any, w: Any, *, out_dtype: str) -> Any:
        a = np.asarray(x)
        if a.dtype == np.float32:
            bits = a.view(np.uint32).astype(np.uint64)
            bits = (bits + 0xFFF + ((bits >> 13) & 1)) & ~np.uint64(0x1FFF)
            a = bits.astype(np.uint32).view(np.float32)
        elif a.dtype == np.float16:
            a = a.astype(BFLOAT16).astype(np.float32).astype(np.float16)
        else:
            with np.errstate(over="ignore"):
                a = a.astype(np.float32).astype(np.float16).astype(a.dtype)
        return super().qmm(a, w, out_dtype=out_dtype)


class PartialsInXDtype(_Broken):
    """Returns ``qmm`` in x's dtype whatever ``out_dtype`` asks, then converts, as torchao's
    weight-only ``F.linear`` does: a row-parallel layer's partials are rounded to x's dtype
    before the all-reduce (the declared deviation ``partials_in_activation_dtype`` of spec
    1.5's registry)."""

    NAME = "test-partials-in-x-dtype"
    DEVIATIONS = ("partials_in_activation_dtype",)

    def qmm(self, x: Any, w: Any, *, out_dtype: str) -> Any:
        a = np.asarray(x)
        y = super().qmm(a, w, out_dtype=dtype_name(a.dtype))
        return np.asarray(y).astype(OUTPUT_DTYPES[out_dtype])


class LaxPrepare(_Broken):
    """Would accept planes whose content is malformed (NaN scale bytes, negative globals)
    if anything handed it such planes: core validates before any backend's prepare, so the
    defect cannot show."""

    NAME = "broken-lax-prepare"

    def prepare(self, planes: NVFP4Planes) -> Any:
        return super().prepare(planes)


class Skipper(_Broken):
    """Declares dequantize but skips its tests (as a backend that calls pytest.skip or
    importorskip inside a verb would)."""

    NAME = "broken-skipper"

    def dequantize(self, w: Any, *, dtype: str) -> Any:
        pytest.skip("dequantize is not implemented yet")


class ScaleGlobalFirst(_Broken):
    """Decodes as ModelOpt and torchao do: ``e2m1 * float32(e4m3 * global)``, two float32
    roundings where the spec has one (the declared deviation ``scale_times_global_first``,
    written out here without the suite's emulators)."""

    NAME = "test-scale-global-first"
    DEVIATIONS = ("scale_times_global_first",)

    def dequantize(self, w: Any, *, dtype: str) -> Any:
        p = w.planes
        e2m1 = E2M1_VALUES[reference.unpack_codes(p.codes)].reshape(*p.scales.shape, 16)
        sg = (E4M3_VALUES[p.scales] * p.row_global()[..., None]).astype(np.float32)
        v = (e2m1 * sg[..., None]).astype(np.float32).reshape(p.shape)
        return v if dtype == "float32" else v.astype(reference.resolve_dtype(dtype))


def _requantize_codes(x: Any, p: NVFP4Planes, rule: Any) -> NVFP4Planes:
    """Re-round the activation codes of ``p`` with ``rule(q, codes) -> codes``."""
    a = np.asarray(x).astype(np.float32)
    m, k = a.shape
    blocks = np.where(np.isfinite(a), a, 0).reshape(m, k // 16, 16).astype(np.float32)
    denom = (E4M3_VALUES[p.scales] * np.float32(p.global_scale)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = (blocks / denom[..., None]).astype(np.float32)
    codes = reference.unpack_codes(p.codes).reshape(blocks.shape)
    finite = np.isfinite(a).reshape(blocks.shape).all(axis=-1, keepdims=True)
    new = np.where(finite, rule(q, codes), codes).astype(np.uint8)
    return p.replace(codes=reference.pack_codes(new.reshape(m, k)))


class _OwnEncoder(_Broken):
    """W4A4 through its own activation encoder (as a real backend's would be)."""

    def qmm_w4a4(self, x: Any, w: Any, *, input_scale: Any, out_dtype: str) -> Any:
        xp = self.quantize_activations(x, input_scale=input_scale)
        xd = reference.dequantize_unscaled(xp).astype(np.float64)
        wd = reference.dequantize_unscaled(w.planes).astype(np.float64)
        g = w.planes.row_global().astype(np.float64) * np.float64(xp.global_scale)
        with np.errstate(invalid="ignore"):
            y = (xd @ wd.T) * g
        return reference.output(y, out_dtype)


class TiesDown(_OwnEncoder):
    """A conforming encoder with another tie rule: exact midpoints 0.75, 1.75 and 3.5 round
    toward zero (as ggml does) instead of to even. Its differences are all boundary
    disagreements."""

    NAME = "test-ties-down"

    def quantize_activations(self, x: Any, *, input_scale: Any) -> NVFP4Planes:
        p = super().quantize_activations(x, input_scale=input_scale)

        def rule(q: Any, codes: Any) -> Any:
            up_ties = np.isin(np.abs(q), np.array([0.75, 1.75, 3.5], np.float32))
            return np.where(up_ties, codes - 1, codes)

        return _requantize_codes(x, p, rule)


class OffByOne(_OwnEncoder):
    """An encoder bug: magnitudes in (2, 2.5) round up to 3 (a wrong boundary)."""

    NAME = "broken-encoder-boundary"

    def quantize_activations(self, x: Any, *, input_scale: Any) -> NVFP4Planes:
        p = super().quantize_activations(x, input_scale=input_scale)

        def rule(q: Any, codes: Any) -> Any:
            wrong = (np.abs(q) > 2.0) & (np.abs(q) < 2.5)
            return np.where(wrong, codes + 1, codes)

        return _requantize_codes(x, p, rule)


class _OwnQ8Encoder(_Broken):
    """W4A8 int8 through its own activation encoder, whose rounding of ``x * id`` is
    :meth:`round_codes` (the reference's: half away from zero)."""

    @staticmethod
    def round_codes(v: Any) -> Any:
        return reference.round_half_away(v)

    def quantize_activations_q8(self, x: Any) -> Q8Activations:
        a = np.asarray(x, dtype=np.float32)
        m, k = a.shape
        blocks = a.reshape(m, k // Q8_BLOCK_SIZE, Q8_BLOCK_SIZE)
        finite = np.isfinite(blocks)
        clean = np.where(finite, blocks, np.float32(0.0))
        d = (np.abs(clean).max(axis=-1) / np.float32(Q8_MAX)).astype(np.float32)
        with np.errstate(divide="ignore"):
            inv = np.where(d == 0, np.float32(0.0), np.float32(1.0) / d).astype(np.float32)
        v = (clean * inv[..., None]).astype(np.float32)
        q = np.clip(self.round_codes(v), -Q8_MAX, Q8_MAX).astype(np.int8)
        with np.errstate(over="ignore"):
            d16 = d.astype(np.float16)
        bad = ~finite.all(axis=-1)
        q[bad] = 0
        d16[bad] = np.float16(np.nan)
        return Q8Activations(codes=q.reshape(m, k), d=d16)

    def _w4a8(self, x: Any, planes: NVFP4Planes) -> Any:
        return reference.w4a8_from_activations(self.quantize_activations_q8(x), planes)

    def qmm_w4a8(self, x: Any, w: Any, *, out_dtype: str) -> Any:
        return reference.output(self._w4a8(x, w.planes), out_dtype)

    def gather_qmm_w4a8(
        self, x: Any, w: Any, expert_ids: Any, *, sorted_indices: bool, out_dtype: str
    ) -> Any:
        y = reference.per_expert(x, w.planes, np.asarray(expert_ids), self._w4a8)
        return reference.output(y, out_dtype)


class Q8TowardZero(_OwnQ8Encoder):
    """An int8 encoder bug: ``x * id`` truncated toward zero (C's ``(int8_t)`` cast without
    ``roundf``), so codes are one too small in magnitude wherever the fraction is >= 0.5."""

    NAME = "broken-q8-toward-zero"

    @staticmethod
    def round_codes(v: Any) -> Any:
        return np.trunc(v)


class Q8TiesToEven(_OwnQ8Encoder):
    """A conforming int8 encoder with ggml's SIMD tie rule (half to even, ``np.rint``):
    its differences are exact midpoints, boundary disagreements."""

    NAME = "test-q8-ties-even"

    @staticmethod
    def round_codes(v: Any) -> Any:
        return np.rint(v)


class Fp8TowardZero(_Broken):
    """An FP8 encoder bug: ``x / input_scale`` rounded toward zero to E4M3 (the largest
    E4M3 magnitude not above it) instead of to nearest even."""

    NAME = "broken-fp8-toward-zero"

    def quantize_activations_fp8(self, x: Any, *, input_scale: float | None) -> FP8Activations:
        ref = super().quantize_activations_fp8(x, input_scale=input_scale)
        a = np.asarray(x, dtype=np.float32)
        s = np.float32(ref.input_scale)
        finite = np.isfinite(a)
        v = (np.where(finite, a, np.float32(0.0)) / s).astype(np.float32)
        mag = np.minimum(np.abs(v), np.float32(E4M3_MAX))
        positive = E4M3_VALUES[:E4M3_NAN_BYTE]  # bytes 0x00..0x7E, increasing
        byte = np.searchsorted(positive, mag, side="right") - 1
        codes = byte.astype(np.uint8) | (np.signbit(v).astype(np.uint8) << np.uint8(7))
        codes = np.where(finite, codes, np.uint8(E4M3_NAN_BYTE)).astype(np.uint8)
        return FP8Activations(codes=codes, input_scale=ref.input_scale)

    def qmm_w4a8_fp8(self, x: Any, w: Any, *, input_scale: float | None, out_dtype: str) -> Any:
        xq = self.quantize_activations_fp8(x, input_scale=input_scale)
        return reference.output(reference.w4a8_fp8_from_activations(xq, w.planes), out_dtype)


class NoW4A4(_Broken):
    """A correct backend that does not declare W4A4 (its tests are skipped and the
    certificate lists w4a4 as not certified)."""

    NAME = "test-no-w4a4"
    DROP_CAPS = frozenset({"w4a4"})


class Unavailable(_Broken):
    """Cannot run here."""

    NAME = "test-unavailable"

    def availability(self) -> Availability:
        return Availability(False, "needs the imaginary XPU-9000 (install nvfp4-xpu9000)")


#: entry-point name -> class (a class is a zero-argument factory)
BACKENDS: dict[str, type[_Broken]] = {
    cls.NAME: cls
    for cls in (
        FlipCode,
        ScaleGlobalFirst,
        DropGlobal,
        IgnoreOutOfRange,
        RefuseOutOfRange,
        NarrowX,
        PartialsInXDtype,
        LaxPrepare,
        Skipper,
        TiesDown,
        OffByOne,
        Q8TowardZero,
        Q8TiesToEven,
        Fp8TowardZero,
        NoW4A4,
        Unavailable,
    )
}
