"""T3/T4: the reference decoder and matmuls against decoders written here with ml_dtypes.

The oracle decodes codes through ``ml_dtypes.float4_e2m1fn`` and scale bytes through
``ml_dtypes.float8_e4m3fn`` (never through :mod:`nvfp4.spec`'s tables), unpacks nibbles with
its own bit operations and applies per-row globals with an explicit loop over experts and
partitions. Matmul inputs are chosen so that float64 sums are exact (few significant bits),
which makes every comparison exact whatever order BLAS sums in.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt
import pytest
from nvfp4 import NVFP4Planes, dequantize, quantize
from nvfp4.reference import (
    gather_qmm,
    global_from_amax,
    qmm,
    qmm_w4a4,
    quantize_activations,
    unpack_codes,
)
from nvfp4.spec import GLOBAL_AMAX_DIVISOR

F4 = ml_dtypes.float4_e2m1fn
F8 = ml_dtypes.float8_e4m3fn
BF16 = ml_dtypes.bfloat16
F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]


# ----------------------------------------------------------------------------- oracle
def oracle_unscaled(codes: npt.NDArray[np.uint8], scales: npt.NDArray[np.uint8]) -> F32:
    """``e2m1(code) * e4m3(scale)`` in float32 (exact), decoded with ml_dtypes."""
    lo = (codes & 0x0F).astype(np.uint8)
    hi = (codes >> 4).astype(np.uint8)
    nib = np.stack([lo, hi], axis=-1).reshape(*codes.shape[:-1], codes.shape[-1] * 2)
    vals = nib.view(F4).astype(np.float32)
    s = scales.view(F8).astype(np.float32)
    blocks: F32 = (vals.reshape(*scales.shape, 16) * s[..., None]).astype(np.float32)
    return blocks.reshape(vals.shape)


def oracle_row_global(p: NVFP4Planes) -> F32:
    """The global of every output row, ``(N,)`` or ``(E, N)``, by explicit loops."""
    g = np.asarray(p.global_scale, np.float32)
    experts = [None] if p.num_experts is None else list(range(p.num_experts))
    out = np.empty((len(experts), p.n), np.float32)
    for i, e in enumerate(experts):
        ge = g if (g.ndim == 0 or e is None) else g[e]
        if p.partitions is None or ge.ndim == 0:
            out[i, :] = ge
        else:
            for j in range(len(p.partitions) - 1):
                out[i, p.partitions[j] : p.partitions[j + 1]] = ge[j]
    return out[0] if p.num_experts is None else out


def oracle_decode(p: NVFP4Planes) -> F32:
    v = oracle_unscaled(p.codes, p.scales)
    return (v * oracle_row_global(p)[..., None]).astype(np.float32)


def random_planes(
    rng: np.random.Generator,
    shape: tuple[int, ...],
    global_scale: Any,
    partitions: tuple[int, ...] | None = None,
    scale_range: tuple[int, int] = (0x00, 0x7E),
) -> NVFP4Planes:
    """Planes with uniformly random code bytes and valid scale bytes."""
    *lead, k = shape
    codes = rng.integers(0, 256, size=(*lead, k // 2), dtype=np.uint8)
    scales = rng.integers(scale_range[0], scale_range[1] + 1, size=(*lead, k // 16), dtype=np.uint8)
    g = np.asarray(global_scale, np.float32)
    return NVFP4Planes(codes, scales, g, partitions=partitions, name="w")


def exact_x(rng: np.random.Generator, shape: tuple[int, ...]) -> F32:
    """Activations with 4 significant bits: every float64 sum of products is exact."""
    return (rng.integers(-8, 9, size=shape) * 2.0**-3).astype(np.float32)


def bits(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
    a = np.ascontiguousarray(a)
    return a.view({4: np.uint32, 2: np.uint16, 8: np.uint64}[a.dtype.itemsize])


# ------------------------------------------------------------------------- dequantize
GLOBALS = [1.0, 2.0**-12, 1.0 / 3.0, 0.0123456789, 7.25e-5]


@pytest.mark.parametrize("g", GLOBALS)
def test_dequantize_float32_is_exact(g: float) -> None:
    rng = np.random.default_rng(100)
    p = random_planes(rng, (64, 256), g)
    # every code and every valid scale byte occurs
    assert len(np.unique(unpack_codes(p.codes))) == 16
    assert len(np.unique(p.scales)) == 127
    got = dequantize(p)
    assert got.dtype == np.float32
    assert got.shape == (64, 256)
    np.testing.assert_array_equal(bits(got), bits(oracle_decode(p)))  # -0.0 included


def test_dequantize_of_quantize_output_is_exact() -> None:
    rng = np.random.default_rng(101)
    p = quantize(rng.standard_normal((32, 128)).astype(np.float32))
    np.testing.assert_array_equal(bits(dequantize(p)), bits(oracle_decode(p)))


@pytest.mark.parametrize(
    ("dtype", "np_dtype"),
    [
        ("float16", np.float16),
        (np.float16, np.float16),
        ("bfloat16", BF16),
        (BF16, BF16),
        ("float32", np.float32),
    ],
)
@pytest.mark.parametrize("g", [1.0 / 3.0, 300.0, 2.0**-30])
@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_dequantize_half_dtypes_are_float32_then_cast(dtype: Any, np_dtype: Any, g: float) -> None:
    # g = 300 overflows float16 (inf) and g = 2^-30 underflows into its subnormals.
    rng = np.random.default_rng(102)
    p = random_planes(rng, (16, 128), g)
    got = dequantize(p, dtype)
    assert got.dtype == np.dtype(np_dtype)
    with np.errstate(over="ignore"):
        expect = oracle_decode(p).astype(np_dtype)
    np.testing.assert_array_equal(bits(got), bits(expect))


def test_dequantize_refuses_unknown_dtype() -> None:
    p = random_planes(np.random.default_rng(0), (2, 16), 1.0)
    with pytest.raises(ValueError, match="expected"):
        dequantize(p, np.int8)


PARTS = (0, 3, 7, 12)


@pytest.mark.parametrize(
    ("shape", "global_scale", "partitions"),
    [
        ((12, 64), [0.5, 1.0 / 3.0, 1e-3], PARTS),
        ((3, 12, 64), [0.5, 1.0 / 3.0, 1e-3], None),
        ((3, 12, 64), 0.1, None),
        ((2, 12, 64), [[0.5, 0.25, 3.0], [1.0 / 7.0, 2.0, 1e-4]], PARTS),
        ((2, 12, 64), 0.1, PARTS),
    ],
)
def test_dequantize_per_partition_and_per_expert_globals(
    shape: tuple[int, ...], global_scale: Any, partitions: tuple[int, ...] | None
) -> None:
    p = random_planes(np.random.default_rng(103), shape, global_scale, partitions)
    np.testing.assert_array_equal(bits(dequantize(p)), bits(oracle_decode(p)))
    np.testing.assert_array_equal(p.row_global(), oracle_row_global(p))


# ------------------------------------------------------------------------------- qmm
def oracle_qmm(x: F32, p: NVFP4Planes) -> F64:
    wd = oracle_unscaled(p.codes, p.scales).astype(np.float64)
    return (x.astype(np.float64) @ wd.T) * oracle_row_global(p).astype(np.float64)


@pytest.mark.parametrize(
    ("global_scale", "partitions"), [(1.0 / 3.0, None), ([0.5, 1.0 / 3.0, 1e-3], PARTS)]
)
def test_qmm_matches_float64_oracle(global_scale: Any, partitions: Any) -> None:
    rng = np.random.default_rng(104)
    p = random_planes(rng, (12, 128), global_scale, partitions)
    x = exact_x(rng, (5, 128))
    ref = oracle_qmm(x, p)
    np.testing.assert_array_equal(qmm(x, p, out_dtype=None), ref)
    np.testing.assert_array_equal(qmm(x, p, out_dtype=np.float64), ref)
    got32 = qmm(x, p)
    assert got32.dtype == np.float32
    np.testing.assert_array_equal(got32, ref.astype(np.float32))
    for dt in (np.float16, BF16):
        got = qmm(x, p, out_dtype=dt)
        assert got.dtype == np.dtype(dt)
        np.testing.assert_array_equal(bits(got), bits(ref.astype(np.float32).astype(dt)))
    # leading batch axes
    xb = exact_x(rng, (2, 3, 128))
    np.testing.assert_array_equal(
        qmm(xb, p, out_dtype=None), oracle_qmm(xb.reshape(6, 128), p).reshape(2, 3, 12)
    )
    # activations with full float32 mantissas: close to the oracle (sum order may differ)
    xr = rng.standard_normal((7, 128)).astype(np.float32)
    np.testing.assert_allclose(qmm(xr, p, out_dtype=None), oracle_qmm(xr, p), rtol=1e-12, atol=0)


def test_qmm_applies_the_global_after_accumulation() -> None:
    rng = np.random.default_rng(105)
    g = np.float32(1.0 / 3.0)
    p = random_planes(rng, (16, 256), g, scale_range=(0x30, 0x48))
    x = exact_x(rng, (8, 256))
    wd = oracle_unscaled(p.codes, p.scales)
    after = (x.astype(np.float64) @ wd.astype(np.float64).T) * np.float64(g)
    before64 = x.astype(np.float64) @ (wd * g).astype(np.float32).astype(np.float64).T
    before32 = (x @ (wd * g).astype(np.float32).T).astype(np.float32)
    # The case separates the two orders ...
    assert (after != before64).sum() > 10
    assert (after.astype(np.float32) != before32).sum() > 10
    # ... and the reference takes the after-accumulation one, exactly.
    np.testing.assert_array_equal(qmm(x, p, out_dtype=None), after)
    np.testing.assert_array_equal(qmm(x, p), after.astype(np.float32))


def test_qmm_refuses_bad_inputs() -> None:
    rng = np.random.default_rng(106)
    p = random_planes(rng, (4, 32), 1.0)
    with pytest.raises(ValueError, match="K = 32"):
        qmm(np.ones((2, 48), np.float32), p)
    with pytest.raises(ValueError, match="dtype int"):
        qmm(np.ones((2, 32), np.int32), p)
    with pytest.raises(ValueError, match="gather_qmm"):
        qmm(np.ones((2, 32), np.float32), random_planes(rng, (2, 4, 32), 1.0))


# ------------------------------------------------------------------------ gather_qmm
E, N, K = 4, 12, 64


def expert_planes(w: NVFP4Planes, e: int) -> NVFP4Planes:
    g = np.asarray(w.global_scale)
    return NVFP4Planes(
        w.codes[e], w.scales[e], g if g.ndim == 0 else g[e], partitions=w.partitions, name="e"
    )


@pytest.fixture(scope="module")
def moe() -> NVFP4Planes:
    return random_planes(np.random.default_rng(107), (E, N, K), [0.5, 1.0 / 3.0, 1e-3, 7.0])


def test_gather_qmm_sorted_and_unsorted_match_per_row_qmm(moe: NVFP4Planes) -> None:
    rng = np.random.default_rng(108)
    ids = np.array([0, 0, 1, 1, 1, 2, 3, 3, 3, 3], dtype=np.int64)
    x = exact_x(rng, (ids.size, K))
    y_sorted = gather_qmm(x, moe, ids, sorted_indices=True, out_dtype=None)
    for m, e in enumerate(ids):
        np.testing.assert_array_equal(
            y_sorted[m], qmm(x[m : m + 1], expert_planes(moe, int(e)), out_dtype=None)[0]
        )
    perm = rng.permutation(ids.size)
    y_unsorted = gather_qmm(x[perm], moe, ids[perm], out_dtype=None)
    np.testing.assert_array_equal(y_unsorted, y_sorted[perm])
    np.testing.assert_array_equal(gather_qmm(x, moe, ids), y_sorted.astype(np.float32))
    with pytest.raises(ValueError, match="sorted"):
        gather_qmm(x[perm], moe, ids[perm], sorted_indices=True)


@pytest.mark.parametrize("id_dtype", [np.int64, np.int32])
def test_gather_qmm_out_of_range_experts_give_exact_zero_rows(
    moe: NVFP4Planes, id_dtype: Any
) -> None:
    rng = np.random.default_rng(109)
    huge = np.iinfo(id_dtype).max
    ids = np.array([2, -1, E, huge, -huge, 0, E + 1, 3], dtype=id_dtype)
    x = exact_x(rng, (ids.size, K))
    x[1, 3] = np.nan  # an out-of-range row is never read
    x[2, :] = np.inf
    out = (ids < 0) | (ids >= E)
    for dt in (None, np.float32, BF16):
        y = gather_qmm(x, moe, ids, out_dtype=dt)
        assert (y[out] == 0).all()
        assert not np.signbit(y[out].astype(np.float32)).any()
        assert np.isfinite(y[~out].astype(np.float32)).all()
    y = gather_qmm(x, moe, ids, out_dtype=None)
    for m in np.flatnonzero(~out):
        np.testing.assert_array_equal(
            y[m], qmm(x[m : m + 1], expert_planes(moe, int(ids[m])), out_dtype=None)[0]
        )


@pytest.mark.parametrize(
    ("global_scale", "partitions"),
    [(0.25, None), ([[0.5, 0.25, 3.0]] * 2 + [[1 / 7, 2.0, 1e-4]] * 2, PARTS)],
)
def test_gather_qmm_scalar_and_expert_partition_globals(global_scale: Any, partitions: Any) -> None:
    rng = np.random.default_rng(110)
    w = random_planes(rng, (E, N, K), global_scale, partitions)
    ids = np.array([3, 0, 2, 2, 1, 3], dtype=np.int64)
    x = exact_x(rng, (ids.size, K))
    y = gather_qmm(x, w, ids, out_dtype=None)
    wd = oracle_unscaled(w.codes, w.scales).astype(np.float64)
    rg = oracle_row_global(w).astype(np.float64)
    ref = np.stack([(x[m].astype(np.float64) @ wd[e].T) * rg[e] for m, e in enumerate(ids)])
    np.testing.assert_array_equal(y, ref)


# ----------------------------------------------------------------------- activations
def dynamic_global(x: F32) -> np.float32:
    finite = x[np.isfinite(x)]
    return np.float32(np.float32(np.abs(finite).max()) / np.float32(GLOBAL_AMAX_DIVISOR))


def test_quantize_activations_dynamic_and_static() -> None:
    rng = np.random.default_rng(111)
    x = (rng.standard_normal((8, 64)) * 5).astype(np.float32)
    dyn = quantize_activations(x)
    assert dyn.global_scale.dtype == np.float32
    assert bits(dyn.global_scale) == bits(np.asarray(dynamic_global(x)))
    ref = quantize(x, dynamic_global(x))
    np.testing.assert_array_equal(dyn.codes, ref.codes)
    np.testing.assert_array_equal(dyn.scales, ref.scales)

    input_scale = np.float32(0.05)
    st = quantize_activations(x, input_scale)
    assert float(st.global_scale) == float(input_scale)
    ref = quantize(x, input_scale)
    np.testing.assert_array_equal(st.codes, ref.codes)
    np.testing.assert_array_equal(st.scales, ref.scales)
    assert (st.scales != dyn.scales).any()
    with pytest.raises(ValueError, match="input_scale"):
        quantize_activations(x, 0.0)


@pytest.mark.parametrize("input_scale", [None, 0.01])
def test_nonfinite_activations_poison_only_their_rows(input_scale: float | None) -> None:
    rng = np.random.default_rng(112)
    x = (rng.standard_normal((6, 64)) * 2).astype(np.float32)
    x[1, 5] = np.nan
    x[3, 40] = np.inf
    x[3, 41] = -np.inf
    x[4, 63] = -np.inf
    clean = np.where(np.isfinite(x), x, np.float32(0.0)).astype(np.float32)
    xp = quantize_activations(x, input_scale)
    bad_blocks = [(1, 0), (3, 2), (4, 3)]
    mask = np.zeros(xp.scales.shape, bool)
    for b in bad_blocks:
        mask[b] = True
    assert (xp.scales[mask] == 0x7F).all()
    g = dynamic_global(x) if input_scale is None else np.float32(input_scale)
    ref = quantize(clean, g)
    np.testing.assert_array_equal(xp.scales[~mask], ref.scales[~mask])
    codes, ref_codes = unpack_codes(xp.codes), unpack_codes(ref.codes)
    blk = codes.reshape(6, 4, 16)
    assert (blk[mask] == 0).all()
    np.testing.assert_array_equal(blk[~mask], ref_codes.reshape(6, 4, 16)[~mask])

    w = random_planes(rng, (10, 64), 1.0 / 3.0)
    y = qmm_w4a4(x, w, input_scale=input_scale)
    y_clean = qmm_w4a4(clean, w, input_scale=input_scale)
    bad_rows = np.array([False, True, False, True, True, False])
    assert not np.isfinite(y[bad_rows]).any()
    assert np.isfinite(y[~bad_rows]).all()
    np.testing.assert_array_equal(y[~bad_rows], y_clean[~bad_rows])


@pytest.mark.parametrize("input_scale", [None, 0.003])
def test_qmm_w4a4_matches_float64_oracle(input_scale: float | None) -> None:
    rng = np.random.default_rng(113)
    w = random_planes(rng, (12, 128), [0.5, 1.0 / 3.0, 1e-3], PARTS)
    x = (rng.standard_normal((2, 3, 128)) * 3).astype(np.float32)
    xp = quantize_activations(x.reshape(6, 128), input_scale)
    xd = oracle_unscaled(xp.codes, xp.scales).astype(np.float64)
    wd = oracle_unscaled(w.codes, w.scales).astype(np.float64)
    # gw * gx is exact in float64 (two 24-bit significands): one rounding after the sum
    gscale = oracle_row_global(w).astype(np.float64) * np.float64(xp.global_scale)
    ref = ((xd @ wd.T) * gscale).reshape(2, 3, 12)
    np.testing.assert_array_equal(qmm_w4a4(x, w, input_scale=input_scale, out_dtype=None), ref)
    np.testing.assert_array_equal(qmm_w4a4(x, w, input_scale=input_scale), ref.astype(np.float32))


# -------------------------------------------------------------------------- quantize
def test_quantize_relative_mse_on_gaussian() -> None:
    x = np.random.default_rng(114).standard_normal((1024, 1024)).astype(np.float32)
    xh = dequantize(quantize(x)).astype(np.float64)
    rel_mse = float(((x - xh) ** 2).sum() / (x.astype(np.float64) ** 2).sum())
    print(f"\nrelative MSE of NVFP4 on N(0,1), 2^20 values: {rel_mse:.6f}")
    assert abs(rel_mse / 0.00905 - 1.0) < 0.03


def test_requantizing_the_decoded_tensor_with_its_global() -> None:
    rng = np.random.default_rng(115)
    w = rng.standard_normal((64, 256)).astype(np.float32)
    p = quantize(w)
    q = quantize(dequantize(p), p.global_scale)
    # Same scales; same codes except code 8 (-0.0 decodes to -0.0, which encodes as 0).
    np.testing.assert_array_equal(q.scales, p.scales)
    pc, qc = unpack_codes(p.codes), unpack_codes(q.codes)
    assert (pc == 8).sum() > 100
    np.testing.assert_array_equal(qc, np.where(pc == 8, 0, pc))
    np.testing.assert_array_equal(dequantize(q), dequantize(p))
    # Without -0.0 in the input the round trip is the identity on the bytes.
    r = quantize(dequantize(q), q.global_scale)
    np.testing.assert_array_equal(r.codes, q.codes)
    np.testing.assert_array_equal(r.scales, q.scales)
    assert bits(r.global_scale) == bits(q.global_scale)


def test_quantize_rounds_float64_to_float32_first() -> None:
    w = np.zeros((2, 16), np.float64)
    w[:, 0] = 6.0  # block scale exactly 1 with global 1
    w[0, 1:8] = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]) + 1e-12  # ties in float32
    w[1, 1:8] = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]) - 1e-12
    p = quantize(w, 1.0)
    p32 = quantize(w.astype(np.float32), 1.0)
    np.testing.assert_array_equal(p.codes, p32.codes)
    np.testing.assert_array_equal(p.scales, p32.scales)
    # float32 sees exact ties, which round to even (the float64 values would not).
    np.testing.assert_array_equal(unpack_codes(p.codes)[:, 1:8], [[0, 2, 2, 4, 4, 6, 6]] * 2)
    assert bits(quantize(w).global_scale) == bits(quantize(w.astype(np.float32)).global_scale)


@pytest.mark.parametrize("dtype", [np.float16, BF16])
def test_quantize_half_inputs_equal_float32_of_the_same_values(dtype: Any) -> None:
    w = (np.random.default_rng(116).standard_normal((8, 64)) * 4).astype(dtype)
    p, p32 = quantize(w), quantize(w.astype(np.float32))
    np.testing.assert_array_equal(p.codes, p32.codes)
    np.testing.assert_array_equal(p.scales, p32.scales)
    assert bits(p.global_scale) == bits(p32.global_scale)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.bool_, np.complex64])
def test_quantize_refuses_non_float_input(dtype: Any) -> None:
    w = np.ones((2, 16), dtype=dtype)
    with pytest.raises(ValueError, match="found dtype"):
        quantize(w, name="w")


@pytest.mark.parametrize("g", [0.0, -1.0, np.nan, np.inf])
def test_quantize_refuses_bad_explicit_global(g: float) -> None:
    with pytest.raises(ValueError, match="global_scale"):
        quantize(np.ones((2, 16), np.float32), g)


@pytest.mark.parametrize(
    ("shape", "what"), [((2, 24), "multiple of 16"), ((16,), "expected"), ((0, 16), "expected")]
)
def test_quantize_refuses_bad_shapes(shape: tuple[int, ...], what: str) -> None:
    with pytest.raises(ValueError, match=what):
        quantize(np.ones(shape, np.float32))


_TINY = np.float32(2.0**-149)  # the smallest float32 subnormal


@pytest.mark.parametrize(
    ("amax_steps", "want_global"), [(1344, 1.0), (1345, 2.0**-149), (1, 1.0), (0, 1.0)]
)
def test_global_is_one_where_amax_over_2688_underflows(amax_steps: int, want_global: float) -> None:
    """Spec 1.0 step 1 (erratum of 2026-11-29): ``amax / 2688`` rounds to 0 for amax up to
    1344 * 2^-149 (1344 / 2688 = 1/2 of the smallest subnormal: a tie, to even 0); such a
    group gets global 1.0 and, its elements being far below the smallest scale, codes 0/8
    decoding to zeros. One step above, the global is 2^-149 and the tensor encodes."""
    w = np.zeros((3, 32), np.float32)
    w[1, 7] = np.float32(amax_steps) * _TINY
    w[2, 20] = -np.float32(amax_steps // 2) * _TINY
    assert global_from_amax(np.abs(w).max()) == np.float32(want_global)
    p = quantize(w)
    assert p.global_scale == np.float32(want_global)
    d = dequantize(p)
    if want_global == 1.0:
        assert not d.any()
        assert set(np.unique(p.codes & 0x77).tolist()) == {0}  # only zeros, signed or not
    else:
        # amax 1345 steps: s = 1345 / 6 -> E4M3 224, q = 1345 / 224 -> 6: 6 * 224 = 1344 steps
        assert d[1, 7] == np.float32(1344) * _TINY
    a = quantize_activations(w)  # the dynamic activation global follows the same rule
    assert a.global_scale == np.float32(want_global)
    assert np.array_equal(a.codes, p.codes)
    assert np.array_equal(a.scales, p.scales)
