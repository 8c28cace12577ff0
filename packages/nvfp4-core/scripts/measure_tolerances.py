"""Measure the matmul errors of plausible conforming implementations (spec tolerances).

``spec/1.0/tolerances.toml`` and ``spec/1.1/tolerances.toml`` are set from what this script
prints (1.1 adds ``[w4a8]``, ``[w4a8_fp8]`` and ``[quantize_q8]``, see the end of this text). For every T4 shape it
quantizes weights with the reference encoder and compares several implementations that
the spec allows against the float64 reference (``nvfp4.reference.qmm(..., out_dtype=None)``,
``gather_qmm`` and ``qmm_w4a4`` likewise), with the spec's metric
``max|y - ref| / max|ref|``:

* ``f32``: one float32 matmul (BLAS sgemm) of x and the float32 decoded weights
  ``e2m1 * e4m3``, the global multiplied after, then cast to the output dtype;
* ``split16`` / ``split256``: float32 partial sums over K chunks of 16 and of 256 added
  one after the other in float32 (a split-K order);
* ``blockscale16``: per 16-element block, ``sum(x * e2m1)`` times the block's E4M3 scale,
  the block results added one after the other in float32 (what a dequantize-in-register
  kernel does);
For a float16 / bfloat16 output each order is measured twice: with x in float32, and
with x given in the output dtype, the reference then computed from that same x (the
tolerance definition of spec 1.0, section "Matmul"). Kept apart, as information the
tolerances do not cover: a float32 x that a backend rounds to the output dtype inside,
against the float32-x reference (on outputs where the sum cancels, that error relative to
``max|ref|`` has no useful bound).

Shapes: M in 1, 2, 3, 8, 16, 33, 64, 300; K in 16, 64, 256, 1024, 4096; N in 1, 7, 24,
100, 256 (the combinations with M * K * N above 2**25 are skipped except the largest one,
M=300, K=4096, N=256, which is kept), random normal weights and x; plus a heavy-tailed case
(Student-t weights with 3 degrees of freedom, x with a few outlier channels 50x larger).
Tiny outputs (M * N <= 8) are repeated over several seeds because the metric divides by
``max|ref|``, which cancellation can make small.

The script also measures encoders that differ from the reference only in arithmetic order
(the orders used by MLX, compressed-tensors and the vLLM kernel) and by tie rule, and
prints how many scale bytes and codes they change and how close to a rounding boundary
each change lies (spec 1.0, "Conformance of other encoders").

W4A8 (spec 1.1, "W4A8") is measured like W4A4: against ``qmm_w4a8`` / ``qmm_w4a8_fp8``
on the same x (the activations quantized by the reference rule), the implementations
differing only in accumulation order; for int8 ``blockscale16`` is ggml's
``ggml_vec_dot_nvfp4_q8_0`` order (per 16-block integer sum, times ``d_x * e4m3 / 2`` in
float32, blocks added one after the other in float32). For information only it also prints
the quantization error of W4A8 against W4A16 (the float64 references of both), and the int8
activation encoders that differ from the reference's (ggml's AVX and NEON order: round half
to even, ``id = 127 / amax``) with the fraction of codes they change and how close to a
rounding boundary each change lies.

Run from ``packages/nvfp4-core``::

    PYTHONPATH=src python scripts/measure_tolerances.py [--quick] [--only w4a8] [--json PATH]

It takes about two minutes on two cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

try:
    import nvfp4
except ImportError:  # run from a source checkout without PYTHONPATH
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import nvfp4

from nvfp4 import reference as ref
from nvfp4.activations import Q8Activations
from nvfp4.dtypes import OUTPUT_DTYPES
from nvfp4.planes import NVFP4Planes
from nvfp4.spec import (
    BLOCK_SIZE,
    E2M1_BOUNDS,
    E2M1_MAX,
    E2M1_VALUES,
    E4M3_VALUES,
    Q8_BLOCK_SIZE,
    Q8_MAX,
    block_scale_unrounded,
    e4m3_encode,
)
from nvfp4.testing import relative_error

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]

M_VALUES = (1, 2, 3, 8, 16, 33, 64, 300)
K_VALUES = (16, 64, 256, 1024, 4096)
N_VALUES = (1, 7, 24, 100, 256)
MAX_WORK = 2**25  # M * K * N above this is skipped, except the largest combination
#: A unit global for one expert's planes.
ONE: npt.NDArray[np.float32] = np.asarray(1.0, dtype=np.float32)
TINY_OUTPUT_SEEDS = 32  # seeds for M * N <= 8
#: W4A4 sums exact products of 4-bit values, so its tiny outputs have no cancellation tail
#: worth 32 seeds (measured: the float32 maximum stays near 1e-7 with 1 and with 32 seeds).
W4A4_TINY_OUTPUT_SEEDS = 8


# --------------------------------------------------------------------------- inputs
@dataclass(frozen=True)
class Case:
    """One measured shape: weights, activations and a label."""

    label: str
    x: F32
    w: NVFP4Planes


def heavy_weights(rng: np.random.Generator, shape: tuple[int, ...]) -> F32:
    """Student-t (3 degrees of freedom) weights: rare large outliers, like real layers."""
    return rng.standard_t(3, size=shape).astype(np.float32)


def heavy_x(rng: np.random.Generator, m: int, k: int) -> F32:
    """Normal activations with a few outlier channels 50x larger (as in LLM activations)."""
    x = rng.standard_normal((m, k)).astype(np.float32)
    channels = rng.choice(k, size=max(1, k // 64), replace=False)
    x[:, channels] *= np.float32(50.0)
    return x


def shapes(quick: bool) -> Iterator[tuple[int, int, int]]:
    """The T4 (M, K, N) grid, big combinations thinned as the module docstring says."""
    largest = (max(M_VALUES), max(K_VALUES), max(N_VALUES))
    for m in M_VALUES:
        for k in K_VALUES:
            for n in N_VALUES:
                work = m * k * n
                if (m, k, n) != largest and work > (MAX_WORK // 8 if quick else MAX_WORK):
                    continue
                yield m, k, n


def seeded_shapes(quick: bool) -> Iterator[tuple[int, int, int, int]]:
    """The grid with a seed: tiny outputs (M * N <= 8) over several seeds."""
    for m, k, n in shapes(quick):
        seeds = TINY_OUTPUT_SEEDS if m * n <= 8 and not quick else 1
        for seed in range(seeds):
            yield m, k, n, seed


def qmm_cases(quick: bool) -> Iterator[Case]:
    """Normal cases over the grid (tiny outputs over several seeds), then heavy-tailed ones."""
    for m, k, n, seed in seeded_shapes(quick):
        rng = np.random.default_rng([m, k, n, seed])
        parts = (0, n // 3, n) if n >= 24 else None  # fused partitions, their own globals
        w = ref.quantize(rng.standard_normal((n, k)).astype(np.float32), partitions=parts)
        x = rng.standard_normal((m, k)).astype(np.float32)
        yield Case(f"normal M={m} K={k} N={n} seed={seed}", x, w)
    for m in (1, 33, 300):
        for k in K_VALUES:
            for n in (7, 256):
                rng = np.random.default_rng([m, k, n, 99])
                w = ref.quantize(heavy_weights(rng, (n, k)))
                yield Case(f"heavy M={m} K={k} N={n}", heavy_x(rng, m, k), w)


# ------------------------------------------------------------ implementations (W4A16)
def split_k(x: F32, wv: F32, chunk: int) -> F32:
    """float32 partial sums over K chunks, added one after the other in float32; a K that
    is not a multiple of the chunk (a row-parallel rank's shard) ends in a masked chunk:
    its missing terms are zeros, which change no float32 sum."""
    m, k = x.shape
    c = min(chunk, k)
    if k % c:
        pad = c - k % c
        x = np.pad(x, ((0, 0), (0, pad)))
        wv = np.pad(wv, ((0, 0), (0, pad)))
        k += pad
    xb = x.reshape(m, k // c, c).transpose(1, 0, 2)  # [K/c, M, c]
    wb = wv.reshape(wv.shape[0], k // c, c).transpose(1, 2, 0)  # [K/c, c, N]
    partial = np.matmul(xb, wb)  # float32 [K/c, M, N]
    return np.asarray(np.cumsum(partial, axis=0, dtype=np.float32)[-1], dtype=np.float32)


def block_scaled(x: F32, w: NVFP4Planes) -> F32:
    """Per 16-block ``sum(x * e2m1) * e4m3``, blocks added one after the other in float32."""
    m, k = x.shape
    nb = k // BLOCK_SIZE
    e2m1 = E2M1_VALUES[ref.unpack_codes(w.codes)].reshape(w.n, nb, BLOCK_SIZE)
    xb = x.reshape(m, nb, BLOCK_SIZE).transpose(1, 0, 2)  # [nb, M, 16]
    partial = np.matmul(xb, e2m1.transpose(1, 2, 0))  # [nb, M, N]
    partial *= E4M3_VALUES[w.scales].T[:, None, :]  # [nb, 1, N]
    return np.asarray(np.cumsum(partial, axis=0, dtype=np.float32)[-1], dtype=np.float32)


Accumulate = Callable[[F32, NVFP4Planes, F32], F32]


def _f32(x: F32, w: NVFP4Planes, wv: F32) -> F32:
    return np.asarray(np.matmul(x, wv.T), dtype=np.float32)


def _split16(x: F32, w: NVFP4Planes, wv: F32) -> F32:
    return split_k(x, wv, 16)


def _split256(x: F32, w: NVFP4Planes, wv: F32) -> F32:
    return split_k(x, wv, 256)


def _blockscale16(x: F32, w: NVFP4Planes, wv: F32) -> F32:
    return block_scaled(x, w)


#: The accumulation orders measured (each followed by the global and the output cast).
VARIANTS: dict[str, Accumulate] = {
    "f32": _f32,
    "split16": _split16,
    "split256": _split256,
    "blockscale16": _blockscale16,
}

#: Suffix of the path under which the informational "x rounded inside" figures are kept.
INFORMATIONAL = " (informational: x float32, rounded to the output dtype inside)"


# ------------------------------------------------------------------------ bookkeeping
@dataclass
class Worst:
    """Largest error seen per (path, dtype, variant), with the case that produced it."""

    table: dict[tuple[str, str, str], tuple[float, str]] = field(default_factory=dict)

    def add(self, path: str, dtype: str, variant: str, err: float, label: str) -> None:
        key = (path, dtype, variant)
        if key not in self.table or err > self.table[key][0]:
            self.table[key] = (err, label)

    def paths(self) -> list[str]:
        return sorted({p for p, _, _ in self.table})

    def per_dtype(self, path: str) -> dict[str, tuple[float, str, str]]:
        out: dict[str, tuple[float, str, str]] = {}
        for (p, d, v), (err, label) in self.table.items():
            if p == path and (d not in out or err > out[d][0]):
                out[d] = (err, v, label)
        return out


def run_variants(
    worst: Worst,
    path: str,
    label: str,
    x: F32,
    reference: Callable[[F32], F64],
    compute: Callable[[F32, Accumulate], F32],
    *,
    informational: bool = True,
) -> None:
    """Evaluate every accumulation order for every output dtype and record the errors.

    For a float16 / bfloat16 output two inputs are measured: x in float32 (the backend
    keeps it) and x in the output dtype (the reference computed from that same x, as the
    tolerance definition says). With ``informational``, a float32 x that the backend
    rounds to the output dtype inside is measured against the float32-x reference too and
    kept apart: the tolerances do not cover it (see ``spec/1.0/tolerances.toml``).
    """
    y64 = reference(x)
    for dname, dt in OUTPUT_DTYPES.items():
        inputs = [("x float32", x, y64)]
        if dname != "float32":
            xd = x.astype(dt).astype(np.float32)
            inputs.append((f"x {dname}", xd, reference(xd)))
        for input_name, xin, yref in inputs:
            for vname, acc in VARIANTS.items():
                y = compute(xin, acc).astype(dt)
                worst.add(path, dname, f"{vname}, {input_name}", relative_error(y, yref), label)
        if informational and dname != "float32":
            y = compute(inputs[1][1], _f32).astype(dt)
            worst.add(path + INFORMATIONAL, dname, "f32", relative_error(y, y64), label)


def measure_qmm(worst: Worst, quick: bool) -> int:
    count = 0
    for case in qmm_cases(quick):
        wv = ref.dequantize_unscaled(case.w)
        g = case.w.row_global()

        def reference(xin: F32, w: NVFP4Planes = case.w) -> F64:
            return ref.qmm(xin, w, out_dtype=None)

        def compute(
            xin: F32, acc: Accumulate, w: NVFP4Planes = case.w, wv: F32 = wv, g: F32 = g
        ) -> F32:
            return (acc(xin, w, wv) * g).astype(np.float32)

        run_variants(worst, "qmm", case.label, case.x, reference, compute)
        count += 1
    return count


def gather_shapes(quick: bool) -> Iterator[tuple[int, int, int, int]]:
    """(M, K, N, seed) of the MoE cases: tiny outputs over several seeds, as for qmm."""
    for m in (1, 2, 3, 33, 300):
        for k in (16, 256, 4096):
            for n in (1, 7, 100, 256):
                if quick and m * k * n > MAX_WORK // 8:
                    continue
                seeds = TINY_OUTPUT_SEEDS if m * n <= 8 and not quick else 1
                for seed in range(seeds):
                    yield m, k, n, seed


def measure_gather_qmm(worst: Worst, quick: bool) -> int:
    """Per-expert globals, unsorted ids with out-of-range ones (their rows stay zero)."""
    count = 0
    experts = 4
    for m, k, n, seed in gather_shapes(quick):
        rng = np.random.default_rng([m, k, n, seed, 7])
        wf = rng.standard_normal((experts, n, k)).astype(np.float32)
        wf *= rng.uniform(0.1, 10.0, size=(experts, 1, 1)).astype(np.float32)
        w = ref.quantize(wf)
        x = rng.standard_normal((m, k)).astype(np.float32)
        ids = rng.integers(-1, experts + 1, size=m)
        ids[0] = int(rng.integers(0, experts))  # at least one in-range row
        wvs = [
            ref.dequantize_unscaled(NVFP4Planes(w.codes[e], w.scales[e], ONE, name="expert"))
            for e in range(experts)
        ]
        row_g = w.row_global()

        def reference(xin: F32, w: NVFP4Planes = w, ids: npt.NDArray[np.int64] = ids) -> F64:
            return ref.gather_qmm(xin, w, ids, out_dtype=None)

        def compute(
            xin: F32,
            acc: Accumulate,
            w: NVFP4Planes = w,
            ids: npt.NDArray[np.int64] = ids,
            wvs: list[F32] = wvs,
            row_g: F32 = row_g,
        ) -> F32:
            y = np.zeros((xin.shape[0], w.n), dtype=np.float32)
            for e in np.unique(ids[(ids >= 0) & (ids < experts)]):
                rows = ids == e
                we = NVFP4Planes(w.codes[e], w.scales[e], ONE, name="expert")
                y[rows] = acc(xin[rows], we, wvs[e]) * row_g[e]
            return y

        label = f"M={m} K={k} N={n} seed={seed}"
        run_variants(worst, "gather_qmm", label, x, reference, compute)
        count += 1
    return count


def quantized_x_shapes(quick: bool) -> Iterator[tuple[int, int, int, int]]:
    """The grid of the paths that quantize x (W4A4, W4A8): the seeded shapes up to a
    quarter of the work (and 300 x 4096 x 256), the first seeds only."""
    for m, k, n, seed in seeded_shapes(quick):
        if m * k * n > MAX_WORK // 4 and (m, k, n) != (300, 4096, 256):
            continue
        if seed < W4A4_TINY_OUTPUT_SEEDS:
            yield m, k, n, seed


def seeded_case(m: int, k: int, n: int, seed: int, salt: int) -> tuple[NVFP4Planes, F32, F32, F32]:
    """A random [N, K] weight quantized by the reference and a random [M, K] x (the generator
    seeded with the shape, the seed and ``salt``), with the weight's unscaled values and row
    globals."""
    rng = np.random.default_rng([m, k, n, seed, salt])
    w = ref.quantize(rng.standard_normal((n, k)).astype(np.float32))
    x = rng.standard_normal((m, k)).astype(np.float32)
    return w, x, ref.dequantize_unscaled(w), w.row_global()


def measure_w4a4(worst: Worst, quick: bool) -> int:
    """W4A4 against ``qmm_w4a4``: the activations quantized by the reference rule (dynamic
    global); the implementations differ only in accumulation order."""
    count = 0
    for m, k, n, seed in quantized_x_shapes(quick):
        w, x, wv, g = seeded_case(m, k, n, seed, 44)

        def reference(xin: F32, w: NVFP4Planes = w) -> F64:
            return ref.qmm_w4a4(xin, w, out_dtype=None)

        quantized: dict[bytes, NVFP4Planes] = {}

        def compute(
            xin: F32,
            acc: Accumulate,
            w: NVFP4Planes = w,
            wv: F32 = wv,
            g: F32 = g,
            quantized: dict[bytes, NVFP4Planes] = quantized,
        ) -> F32:
            key = xin.tobytes()
            if key not in quantized:
                quantized[key] = ref.quantize_activations(xin)
            xp = quantized[key]
            xv = ref.dequantize_unscaled(xp)
            if acc is _blockscale16:
                # tensor-core order: e2m1 x e2m1 per block, times both block scales
                xs = E4M3_VALUES[xp.scales]  # [M, nb]
                ws = E4M3_VALUES[w.scales]  # [N, nb]
                nb = w.k // BLOCK_SIZE
                xe = E2M1_VALUES[ref.unpack_codes(xp.codes)].reshape(-1, nb, BLOCK_SIZE)
                we = E2M1_VALUES[ref.unpack_codes(w.codes)].reshape(w.n, nb, BLOCK_SIZE)
                partial = np.matmul(xe.transpose(1, 0, 2), we.transpose(1, 2, 0))
                partial *= xs.T[:, :, None] * ws.T[:, None, :]
                y = np.cumsum(partial, axis=0, dtype=np.float32)[-1]
            else:
                y = acc(xv, w, wv)
            gxw = (g * np.float32(xp.global_scale)).astype(np.float32)
            return np.asarray(y * gxw, dtype=np.float32)

        # Not informational here: the activation codes are part of the W4A4 computation, so
        # the reference is always given the x the backend quantizes (spec 1.0, "Matmul").
        label = f"M={m} K={k} N={n} seed={seed}"
        run_variants(worst, "w4a4", label, x, reference, compute, informational=False)
        count += 1
    return count


# ------------------------------------------------------------------------------ W4A8
def w4a8_shapes(quick: bool) -> Iterator[tuple[int, int, int, int]]:
    """The W4A4 grid without K = 16 (W4A8 int8 needs K % 32 == 0)."""
    for m, k, n, seed in quantized_x_shapes(quick):
        if k % Q8_BLOCK_SIZE == 0:
            yield m, k, n, seed


def ggml_order(xq: Q8Activations, w: NVFP4Planes) -> F32:
    """``ggml_vec_dot_nvfp4_q8_0``: per 16-block ``isum = sum(code * 2 e2m1)`` (exact),
    ``term = (d_x * e4m3 / 2) * isum`` in float32, blocks added one after the other."""
    m, k = xq.shape
    nb = k // BLOCK_SIZE
    qx = xq.codes.astype(np.float32).reshape(m, nb, BLOCK_SIZE).transpose(1, 0, 2)
    w2 = (2 * E2M1_VALUES[ref.unpack_codes(w.codes)]).reshape(w.n, nb, BLOCK_SIZE)
    isum = np.matmul(qx, w2.transpose(1, 2, 0))  # [nb, M, N], exact integers
    dx = np.repeat(xq.d.astype(np.float32), 2, axis=1).T  # [nb, M]
    half = (E4M3_VALUES[w.scales] / np.float32(2.0)).T  # [nb, N]
    coef = (dx[:, :, None] * half[:, None, :]).astype(np.float32)
    return np.asarray(np.cumsum(coef * isum, axis=0, dtype=np.float32)[-1], dtype=np.float32)


def measure_w4a8(worst: Worst, quick: bool, info: dict[str, list[float]]) -> int:
    """W4A8 int8 against ``qmm_w4a8`` on the same x; the W4A16 gap kept as information."""
    count = 0
    for m, k, n, seed in w4a8_shapes(quick):
        w, x, wv, g = seeded_case(m, k, n, seed, 48)

        def reference(xin: F32, w: NVFP4Planes = w) -> F64:
            return ref.qmm_w4a8(xin, w, out_dtype=None)

        def compute(xin: F32, acc: Accumulate, w: NVFP4Planes = w, wv: F32 = wv, g: F32 = g) -> F32:
            xq = ref.quantize_activations_q8(xin)
            if acc is _blockscale16:
                y = ggml_order(xq, w)
            else:
                y = acc(xq.decoded().astype(np.float32), w, wv)
            return np.asarray(y * g, dtype=np.float32)

        label = f"M={m} K={k} N={n} seed={seed}"
        run_variants(worst, "w4a8", label, x, reference, compute, informational=False)
        info["w4a8"].append(relative_error(reference(x), ref.qmm(x, w, out_dtype=None)))
        count += 1
    return count


def measure_w4a8_fp8(worst: Worst, quick: bool, info: dict[str, list[float]]) -> int:
    """W4A8 FP8 against ``qmm_w4a8_fp8`` on the same x (dynamic input scale, and a static
    one 1.5x above it); the W4A16 gap kept as information."""
    count = 0
    for m, k, n, seed in w4a8_shapes(quick):
        w, x, wv, g = seeded_case(m, k, n, seed, 88)
        for scale in (None, float(np.abs(x).max() / np.float32(448.0) * np.float32(1.5))):

            def reference(xin: F32, w: NVFP4Planes = w, scale: float | None = scale) -> F64:
                return ref.qmm_w4a8_fp8(xin, w, input_scale=scale, out_dtype=None)

            def compute(
                xin: F32,
                acc: Accumulate,
                w: NVFP4Planes = w,
                wv: F32 = wv,
                g: F32 = g,
                scale: float | None = scale,
            ) -> F32:
                xq = ref.quantize_activations_fp8(xin, scale)
                xv = E4M3_VALUES[xq.codes]
                gx = (g * np.float32(xq.input_scale)).astype(np.float32)
                return np.asarray(acc(xv, w, wv) * gx, dtype=np.float32)

            kind = "dynamic" if scale is None else "static"
            label = f"M={m} K={k} N={n} seed={seed} {kind}"
            run_variants(worst, "w4a8_fp8", label, x, reference, compute, informational=False)
            info["w4a8_fp8"].append(relative_error(reference(x), ref.qmm(x, w, out_dtype=None)))
            count += 1
    return count


def q8_other(x: F32, rule: str) -> npt.NDArray[np.int8]:
    """int8 codes of another Q8_0 encoder: ``rne`` (half to even, ``id = 1 / d``),
    ``avx`` (half to even, ``id = 127 / amax``: ggml's AVX / NEON paths), ``away_avx``
    (half away from zero, ``id = 127 / amax``)."""
    m, k = x.shape
    blocks = x.reshape(m, k // Q8_BLOCK_SIZE, Q8_BLOCK_SIZE)
    amax = np.abs(blocks).max(axis=-1)
    with np.errstate(divide="ignore"):
        if rule == "rne":
            d = (amax / np.float32(Q8_MAX)).astype(np.float32)
            inv = np.where(d == 0, np.float32(0.0), np.float32(1.0) / d)
        else:
            inv = np.where(amax == 0, np.float32(0.0), np.float32(Q8_MAX) / amax)
    v = (blocks * inv.astype(np.float32)[..., None]).astype(np.float32)
    q = np.rint(v) if rule in ("rne", "avx") else ref.round_half_away(v)
    return np.asarray(q, dtype=np.int8).reshape(m, k)


def measure_q8_encoders(quick: bool) -> dict[str, dict[str, float]]:
    """Fraction of int8 codes other encoders change against the reference, per input
    dtype, and the largest relative distance of the reference's ``x * id`` from the
    midpoint of the two codes among the changes."""
    results: dict[str, dict[str, float]] = {}
    corpus: list[F32] = []
    for m, k, n in shapes(True):
        if k % Q8_BLOCK_SIZE == 0:
            rng = np.random.default_rng([m, k, n, 8])
            corpus.append(rng.standard_normal((max(n, m), k)).astype(np.float32))
    corpus.append(heavy_x(np.random.default_rng(12), 256, 4096))
    for dname in OUTPUT_DTYPES:
        xs = [c.astype(OUTPUT_DTYPES[dname]).astype(np.float32) for c in corpus]
        for rule in ("rne", "avx", "away_avx"):
            elements = changed = 0
            worst_dist = 0.0
            for x in xs:
                xq = ref.quantize_activations_q8(x)
                other = q8_other(x, rule)
                diff = other != xq.codes
                elements += x.size
                changed += int(np.count_nonzero(diff))
                if diff.any():
                    m, k = x.shape
                    d = np.abs(x.reshape(m, -1, Q8_BLOCK_SIZE)).max(-1) / np.float32(Q8_MAX)
                    d = d.astype(np.float32)
                    inv = np.where(d == 0, np.float32(0.0), np.float32(1.0) / d)
                    v = (x.reshape(m, -1, Q8_BLOCK_SIZE) * inv[..., None]).reshape(m, k)
                    a = xq.codes[diff].astype(np.float64)
                    b = other[diff].astype(np.float64)
                    mid = np.abs((a + b) / 2)
                    dist = np.abs(np.abs(v[diff].astype(np.float64)) - mid) / mid
                    worst_dist = max(worst_dist, float(dist.max()))
            results[f"{rule}, x {dname}"] = {
                "elements": float(elements),
                "elements_changed": float(changed),
                "fraction_changed": changed / elements,
                "max_boundary_distance": worst_dist,
            }
    return results


# ------------------------------------------------------------- other encoders (T2)
def _e4m3_bytes(s: F32) -> tuple[npt.NDArray[np.uint8], F32]:
    return e4m3_encode(np.where(s == 0, np.float32(1.0), s))


def _rne_codes(q: F32, neg: npt.NDArray[np.bool_]) -> npt.NDArray[np.uint8]:
    return ref.e2m1_encode(q, neg)


def _ties_down_codes(q: F32, neg: npt.NDArray[np.bool_]) -> npt.NDArray[np.uint8]:
    idx = np.searchsorted(E2M1_BOUNDS, np.abs(q), side="left").astype(np.uint8)
    return (idx | (neg.astype(np.uint8) << 3)).astype(np.uint8)


def other_encoder(x: F32, g: np.float32, order: str) -> tuple[npt.NDArray[np.uint8], ...]:
    """Scale bytes and codes of an encoder using another arithmetic order or tie rule.

    ``mlx``: ``s = (bamax / 6) * enc``, ``q = x * (enc / e4m3(s))``; ``ct``: ``s = enc *
    (bamax / 6)``, ``q = x / (e4m3(s) / enc)``; ``vllm``: ``s = enc * (bamax * (1/6))``,
    ``q = x * (1 / (e4m3(s) * (1 / enc)))``; ``ties_down``: the reference arithmetic with
    E2M1 ties toward zero (ggml, MLX's CPU fallback). ``enc = 1 / g`` in float32.
    """
    n, k = x.shape
    blocks = x.reshape(n, k // BLOCK_SIZE, BLOCK_SIZE)
    bamax = np.abs(blocks).max(axis=-1)
    enc = np.float32(1.0) / g
    six = np.float32(E2M1_MAX)
    with np.errstate(divide="ignore", invalid="ignore"):
        if order == "mlx":
            sb, sv = _e4m3_bytes((bamax / six) * enc)
            q = blocks * (enc / sv)[..., None]
        elif order == "ct":
            sb, sv = _e4m3_bytes(enc * (bamax / six))
            q = blocks / (sv / enc)[..., None]
        elif order == "vllm":
            sb, sv = _e4m3_bytes(enc * (bamax * (np.float32(1.0) / six)))
            q = blocks * (np.float32(1.0) / (sv * (np.float32(1.0) / enc)))[..., None]
        elif order == "ties_down":
            sb, sv = _e4m3_bytes(bamax / (six * g))
            q = blocks / (sv * g)[..., None]
        else:
            raise ValueError(f"unknown encoder order {order!r}")
    q = q.astype(np.float32)
    rule = _ties_down_codes if order == "ties_down" else _rne_codes
    return sb.astype(np.uint8), rule(q, blocks < 0).reshape(n, k)


def boundary_distance(q: F32, a: npt.NDArray[np.uint8], b: npt.NDArray[np.uint8]) -> F32:
    """Relative distance of ``|q|`` from the E2M1 midpoint between codes ``a`` and ``b``."""
    mags = np.abs(E2M1_VALUES)
    mid = (mags[a & 7] + mags[b & 7]) / np.float32(2.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(np.abs(np.abs(q) - mid) / mid, dtype=np.float32)


def scale_boundary_distance(wf: F32, p: NVFP4Planes, sb: npt.NDArray[np.uint8]) -> float:
    """Largest relative distance of the reference's clamped, unrounded block scale ``s``
    from the E4M3 midpoint between the reference byte and a differing byte ``sb``."""
    diff = sb != p.scales
    n, k = wf.shape
    bamax = np.abs(wf.reshape(n, k // BLOCK_SIZE, BLOCK_SIZE)).max(axis=-1)
    g = np.float32(p.global_scale)
    s = block_scale_unrounded(bamax, g)
    mid = (E4M3_VALUES[sb[diff]] + E4M3_VALUES[p.scales[diff]]) / np.float32(2.0)
    return float(np.max(np.abs(s[diff] - mid) / mid))


def measure_encoders(quick: bool) -> dict[str, dict[str, float]]:
    """Fraction of scale bytes / codes other encoders change on random weights, and the
    largest relative distance from a rounding boundary among the changed codes."""
    results: dict[str, dict[str, float]] = {}
    weights: list[F32] = []
    for m, k, n in shapes(True):
        rng = np.random.default_rng([m, k, n, 5])
        weights.append(rng.standard_normal((max(n, m), k)).astype(np.float32))
    rng = np.random.default_rng(11)
    weights.append(heavy_weights(rng, (256, 4096)))
    for order in ("mlx", "ct", "vllm", "ties_down"):
        elements = byte_diff = code_diff = 0
        worst_dist = worst_scale_dist = 0.0
        for wf in weights:
            p = ref.quantize(wf)
            g = np.float32(p.global_scale)
            sb, codes = other_encoder(wf, g, order)
            rcodes = ref.unpack_codes(p.codes)
            same_scale = np.repeat(sb == p.scales, BLOCK_SIZE, axis=-1)
            byte_diff += int(np.count_nonzero(sb != p.scales))
            if (sb != p.scales).any():
                worst_scale_dist = max(worst_scale_dist, scale_boundary_distance(wf, p, sb))
            diff = (codes != rcodes) & same_scale
            code_diff += int(np.count_nonzero(diff)) + int(np.count_nonzero(~same_scale))
            elements += wf.size
            if diff.any():
                sv = E4M3_VALUES[p.scales]
                denom = (np.repeat(sv, BLOCK_SIZE, axis=-1) * g).astype(np.float32)
                q = (wf / denom).astype(np.float32)
                dist = boundary_distance(q[diff], codes[diff], rcodes[diff])
                worst_dist = max(worst_dist, float(dist.max()))
        results[order] = {
            "elements": float(elements),
            "scale_bytes_changed": float(byte_diff),
            "elements_changed": float(code_diff),
            "fraction_changed": code_diff / elements,
            "max_boundary_distance": worst_dist,
            "max_scale_boundary_distance": worst_scale_dist,
        }
    return results


# ------------------------------------------------------------------------------ main
def script_parser(doc: str, quick: str) -> argparse.ArgumentParser:
    """The options every measurement script of this folder takes: ``--quick`` (what it
    does is ``quick``) and ``--json``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = script_parser(__doc__, "fewer, smaller shapes")
    parser.add_argument(
        "--only", choices=("w4a8",), help="measure only spec 1.1's W4A8 paths and encoders"
    )
    args = parser.parse_args(argv)

    t0 = time.perf_counter()
    worst = Worst()
    info: dict[str, list[float]] = {"w4a8": [], "w4a8_fp8": []}
    counts: dict[str, int] = {}
    encoders: dict[str, dict[str, float]] = {}
    if args.only is None:
        counts["qmm"] = measure_qmm(worst, args.quick)
        counts["gather_qmm"] = measure_gather_qmm(worst, args.quick)
        counts["w4a4"] = measure_w4a4(worst, args.quick)
        encoders = measure_encoders(args.quick)
    counts["w4a8"] = measure_w4a8(worst, args.quick, info)
    counts["w4a8_fp8"] = measure_w4a8_fp8(worst, args.quick, info)
    q8_encoders = measure_q8_encoders(args.quick)
    elapsed = time.perf_counter() - t0

    print(f"# nvfp4 {nvfp4.__version__}, spec {nvfp4.SPEC_VERSION}, numpy {np.__version__}")
    print(f"# cases: {counts}; {elapsed:.1f} s\n")
    for path in worst.paths():
        print(f"[{path}]  max over cases of max|y - ref| / max|ref|")
        for dname, (err, variant, label) in sorted(worst.per_dtype(path).items()):
            print(f"  {dname:9s} {err:.3e}  ({variant}, {label})")
        for (p, d, v), (err, label) in sorted(worst.table.items()):
            if p == path:
                print(f"      {d:9s} {v:15s} {err:.3e}  {label}")
        print()
    print("[quantize] other encoders vs the reference")
    for order, r in encoders.items():
        print(
            f"  {order:10s} changed {int(r['elements_changed'])}/{int(r['elements'])} elements "
            f"(fraction {r['fraction_changed']:.2e}), {int(r['scale_bytes_changed'])} scale "
            f"bytes; max relative distance from a boundary: codes "
            f"{r['max_boundary_distance']:.2e}, scale bytes {r['max_scale_boundary_distance']:.2e}"
        )
    print("\n[quantize_q8] other int8 activation encoders vs the reference")
    for rule, r in q8_encoders.items():
        print(
            f"  {rule:22s} changed {int(r['elements_changed'])}/{int(r['elements'])} codes "
            f"(fraction {r['fraction_changed']:.2e}); max relative distance from a boundary "
            f"{r['max_boundary_distance']:.2e}"
        )
    print(
        "\n(informational) W4A8 quantization error vs W4A16, max|ref_w4a8 - ref_w4a16| / max|ref|"
    )
    for path, errs in info.items():
        if errs:
            print(
                f"  {path:9s} median {float(np.median(errs)):.3e}  max {max(errs):.3e}"
                f"  over {len(errs)} cases"
            )
    if args.json:
        payload = {
            "elapsed_s": elapsed,
            "counts": counts,
            "matmul": [
                {"path": p, "dtype": d, "variant": v, "max_rel_err": e, "case": label}
                for (p, d, v), (e, label) in sorted(worst.table.items())
            ],
            "encoders": encoders,
            "q8_encoders": q8_encoders,
            "w4a8_vs_w4a16": {p: sorted(e) for p, e in info.items()},
        }
        args.json.write_text(json.dumps(payload, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
