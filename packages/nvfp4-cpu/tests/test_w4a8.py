"""W4A8 (spec 1.1, "W4A8") at every supported instruction-set level: the Q8_0 activation
quantizer bit for bit against nvfp4.reference.quantize_activations_q8, qmm_w4a8 /
gather_qmm_w4a8 against nvfp4.reference within [w4a8] (the integer part exact), and W4A8 FP8:
the E4M3 activation encoder bit for bit, qmm_w4a8_fp8 within [w4a8_fp8]."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import nvfp4
import pytest
from cpu_helpers import check_close, check_gather, cpuinfo_flags, expert_stack, heavy_tailed_weight
from nvfp4 import reference
from nvfp4.activations import Q8Activations
from nvfp4.spec import Q8_BLOCK_SIZE, Q8_MAX
from nvfp4_cpu import CPUBackend, w4a8
from nvfp4_cpu._native import Native
from nvfp4_cpu.backend import CAPABILITIES
from nvfp4_cpu.layout import prepare

DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


# ------------------------------------------------------------------------ the levels
def test_w4a8_capabilities_are_declared() -> None:
    info = CPUBackend().info
    assert {"w4a8", "w4a8_fp8"} <= CAPABILITIES
    assert {"w4a8", "w4a8_fp8"} <= info.capabilities
    assert any("W4A8 int8 native" in note for note in info.notes)
    assert any("W4A8 FP8 emulated" in note for note in info.notes)


def test_each_level_runs_its_own_w4a8_kernels(native: Native) -> None:
    """portable -> portable C, avx2 -> vpmaddubsw, avx512 -> vpdpbusd where the CPU has
    AVX512_VNNI (checked against /proc/cpuinfo too, so a missing cpuid check shows); neon ->
    vdotq_laneq_s32 where the CPU has dotprod (HWCAP_ASIMDDP, read from /proc/self/auxv in
    test_native.py), else the portable C kernels."""
    expected = {"portable": "portable", "avx2": "avx2"}
    expected["neon"] = "neon_dotprod" if native.has("asimddp") else "portable"
    vnni = native.has("avx512vnni")
    flags = cpuinfo_flags()
    if flags and native.has("x86"):  # under qemu-user /proc/cpuinfo is the x86 host's
        assert vnni == ("avx512_vnni" in flags)
    expected["avx512"] = "avx512vnni" if vnni else "avx2"
    for isa in native.supported_levels():
        got = native.w4a8_kernels(isa)
        assert got == expected[isa], (
            f"level {isa} runs the {got} W4A8 kernels, expected {expected[isa]} "
            "(a unit left out of the build? hatch_build.py warns when it leaves one out)"
        )


def test_isa_env_forces_the_w4a8_level(native: Native, monkeypatch: pytest.MonkeyPatch) -> None:
    """$NVFP4_CPU_ISA picks the W4A8 kernels too; every level gives the same codes."""
    x = np.random.default_rng(0).standard_normal((3, 96)).astype(np.float32)
    ref = reference.quantize_activations_q8(x)
    for isa in native.supported_levels():
        monkeypatch.setenv("NVFP4_CPU_ISA", isa)
        b = CPUBackend()
        assert b.isa == isa
        q = b.quantize_activations_q8(x)
        np.testing.assert_array_equal(q.codes, ref.codes)


# ------------------------------------------------------------------------ quantizer
def _same_q8(got: Q8Activations, ref: Q8Activations, what: str) -> None:
    """Codes equal and d's float16 bytes equal (NaN blocks included), bit for bit."""
    assert isinstance(got, Q8Activations), type(got).__name__
    assert got.codes.dtype == np.int8
    assert got.d.dtype == np.float16
    assert got.shape == ref.shape
    bad = got.codes != ref.codes
    if bad.any():
        i, j = (int(v) for v in np.argwhere(bad)[0])
        raise AssertionError(
            f"{what}: code ({i}, {j}) = {got.codes[i, j]}, expected {ref.codes[i, j]} "
            f"({int(bad.sum())} differ)"
        )
    gd, rd = got.d.view(np.uint16), ref.d.view(np.uint16)
    if (gd != rd).any():
        i, j = (int(v) for v in np.argwhere(gd != rd)[0])
        raise AssertionError(f"{what}: d ({i}, {j}) = {gd[i, j]:#06x}, expected {rd[i, j]:#06x}")


def _ties(rng: np.random.Generator, m: int, k: int) -> np.ndarray:
    """Blocks whose d is a power of two 2^e (amax = 127 * 2^e), so x * id is exact: the
    other elements are exact halves c + 0.5 (ties: away from zero) and the floats just
    below and above them, times 2^e, e per block from -40 to 40."""
    nb = k // Q8_BLOCK_SIZE
    c = rng.integers(-126, 126, size=(m, k)).astype(np.float64) + 0.5
    kind = rng.integers(0, 3, size=(m, k))
    v = c.astype(np.float32)
    v = np.where(kind == 1, np.nextafter(v, np.float32(0)), v)
    v = np.where(kind == 2, np.nextafter(v, np.float32(np.inf) * np.sign(v)), v)
    e = rng.integers(-40, 41, size=(m, nb)).astype(np.float32)
    x = (v.reshape(m, nb, Q8_BLOCK_SIZE) * np.exp2(e)[..., None]).astype(np.float32)
    x[:, :, 0] = np.float32(Q8_MAX) * np.exp2(e) * np.where(rng.random((m, nb)) < 0.5, 1, -1)
    return x.reshape(m, k)


def _q8_cases() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(11)
    big = rng.standard_normal((4, 128)).astype(np.float32)
    big[0] *= np.float32(1e30)  # d beyond float16: inf
    big[1] *= np.float32(3e6)  # d around float16's largest (65504 * 127 = 8.3e6)
    big[2] *= np.float32(1e-30)  # d = 0 in float16
    big[3, :64] = np.float32(3.0e38)  # near float32's largest
    big[3, 64:] = -np.float32(3.4028235e38)
    tiny = rng.standard_normal((5, 96)).astype(np.float32)
    tiny[0] *= np.float32(1e-37)  # d float32-subnormal: 1 / d overflows to inf
    tiny[1] *= np.float32(1e-39)  # x itself subnormal
    tiny[2] = np.float32(1e-44)  # d underflows to exactly 0
    tiny[3, ::3] = 0.0  # zeros among tiny values with an infinite 1 / d
    tiny[3] *= np.float32(3e-37)
    tiny[4] *= np.float32(1e-7)  # d float16-subnormal
    nonfinite = rng.standard_normal((6, 160)).astype(np.float32)
    nonfinite[0, 5] = np.nan
    nonfinite[1, 40] = np.inf
    nonfinite[2, 159] = -np.inf
    nonfinite[3] = np.nan  # a whole row
    nonfinite[4, 64:96] = np.inf
    zero = rng.standard_normal((3, 128)).astype(np.float32)
    zero[:, 32:64] = 0.0  # zero blocks (d = 0, id = 0)
    zero[1] = 0.0
    zero[2, 96:] = -0.0
    mixed = rng.standard_normal((9, 320)).astype(np.float32)
    mixed *= np.exp2(rng.integers(-60, 60, size=(9, 10))).repeat(32, axis=1).astype(np.float32)
    return {
        "normal_1x32": rng.standard_normal((1, 32)).astype(np.float32),
        "normal_40x64": rng.standard_normal((40, 64)).astype(np.float32),
        "normal_7x4096": (rng.standard_normal((7, 4096)) * 3).astype(np.float32),
        "heavy_tailed": rng.standard_t(2, size=(16, 1024)).astype(np.float32),
        "ties_and_neighbours": _ties(rng, 24, 512),
        "large": big,
        "small": tiny,
        "nonfinite": nonfinite,
        "zero_blocks": zero,
        "mixed_block_magnitudes": mixed,
    }


Q8_CASES = _q8_cases()


@pytest.mark.parametrize("case", list(Q8_CASES))
def test_quantize_q8_bit_identical(isa: str, case: str) -> None:
    x = Q8_CASES[case]
    b = CPUBackend(isa=isa, threads=2)
    with np.errstate(all="ignore"):  # the reference's own overflow / NaN warnings
        ref = reference.quantize_activations_q8(x)
    _same_q8(b.quantize_activations_q8(x), ref, f"{isa} {case}")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_quantize_q8_half_inputs_bit_identical(isa: str, dtype: str) -> None:
    """float16 / bfloat16 x (exact halves are frequent there) convert exactly to float32."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((33, 1024)) * 4).astype(DTYPES[dtype])
    x[0, :32] = np.asarray([127.0, 0.5, 1.5, -2.5, 3.5] + [0.25] * 27).astype(DTYPES[dtype])
    b = CPUBackend(isa=isa)
    _same_q8(b.quantize_activations_q8(x), reference.quantize_activations_q8(x), f"{isa} {dtype}")


def test_quantize_q8_refuses_k_not_multiple_of_32(isa: str) -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        CPUBackend(isa=isa).quantize_activations_q8(np.ones((2, 48), np.float32))


# --------------------------------------------------------------------------- qmm_w4a8
def _x(m: int, k: int, dtype: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)) * np.exp(rng.normal(0.0, 1.0, size=(m, 1)))
    return x.astype(np.float32).astype(DTYPES[dtype])


def _qmm_case(isa: str, m: int, n: int, k: int, dtype: str = "float32", threads: int = 2) -> None:
    p = heavy_tailed_weight(n, k)
    b = CPUBackend(isa=isa, threads=threads)
    x = _x(m, k, dtype, m * 7 + n + k)
    y = b.qmm_w4a8(x, b.prepare(p))
    assert y.dtype == np.dtype(DTYPES[dtype])
    assert y.shape == (m, n)
    ref = reference.qmm_w4a8(x, p, out_dtype=None)  # float64, on the reference's codes
    check_close("w4a8", dtype, y, ref, f"{isa} M={m} N={n} K={k}")


@pytest.mark.parametrize("m", range(1, 41))
def test_qmm_w4a8_every_chunk_size(isa: str, m: int) -> None:
    """M = 1 .. 40: every row-chunk size of every level and the balanced splits above it."""
    _qmm_case(isa, m, 33, 96)


@pytest.mark.parametrize(
    ("m", "n", "k"),
    [
        (1, 1, 32),
        (2, 7, 32),
        (3, 16, 64),
        (5, 17, 64),
        (1, 100, 4096),
        (9, 31, 4096),
        (33, 48, 2048),
        (130, 23, 256),
        (1, 512, 8192),
    ],
)
def test_qmm_w4a8_shapes(isa: str, m: int, n: int, k: int) -> None:
    """Ragged N (not a multiple of 16 or 8), K = 32, 64 and large K, a few M."""
    _qmm_case(isa, m, n, k)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_qmm_w4a8_half_dtypes(isa: str, dtype: str) -> None:
    _qmm_case(isa, 6, 40, 512, dtype)
    _qmm_case(isa, 1, 7, 64, dtype)


def test_qmm_w4a8_integer_part_is_exact(isa: str) -> None:
    """Every scale 1.0, global 1, each block's d a power of two, sums below 2^24: every
    float step is exact, so the result must equal the reference bit for bit (an error in
    an integer dot product, a corr word or a d would show)."""
    rng = np.random.default_rng(17)
    n, k, m = 37, 1024, 19
    codes = rng.integers(0, 256, size=(n, k // 2), dtype=np.uint8)  # every code
    scales = np.full((n, k // 16), 0x38, np.uint8)  # E4M3 1.0
    p = nvfp4.NVFP4Planes(codes, scales, np.float32(1.0), name="exact")
    assert (nvfp4.dequantize(p) == reference.dequantize_unscaled(p)).all()
    x = rng.integers(-127, 128, size=(m, k)).astype(np.float32)
    x[:, ::Q8_BLOCK_SIZE] = 127.0  # amax 127: d = 1, codes = x
    x *= np.exp2(rng.integers(-3, 4, size=(m, 1))).astype(np.float32)  # d = 2^e per row
    b = CPUBackend(isa=isa, threads=2)
    y = b.qmm_w4a8(x, b.prepare(p))
    ref = reference.qmm_w4a8(x, p, out_dtype=None)
    np.testing.assert_array_equal(y, ref.astype(np.float32))
    np.testing.assert_array_equal(y.astype(np.float64), ref)


def test_qmm_w4a8_partitions_and_every_scale_byte(isa: str) -> None:
    """All 127 valid scale bytes (subnormals included) and all 256 code bytes, with
    per-partition globals."""
    k = 32 * 64
    rows = np.arange(45)[:, None]
    codes = ((np.arange(k // 2)[None, :] + 37 * rows) % 256).astype(np.uint8)
    scales = ((np.arange(k // 16)[None, :] + 5 * rows) % 127).astype(np.uint8)
    g = np.asarray([0.75, 300.0, 1e-3], np.float32)
    p = nvfp4.NVFP4Planes(codes, scales, g, partitions=(0, 20, 30, 45), name="all-bytes")
    b = CPUBackend(isa=isa)
    x = _x(5, k, "float32", 3)
    y = b.qmm_w4a8(x, b.prepare(p))
    ref = reference.qmm_w4a8(x, p, out_dtype=None)
    for a, c in ((0, 20), (20, 30), (30, 45)):
        check_close("w4a8", "float32", y[:, a:c], ref[:, a:c], f"{isa} partition {a}:{c}")


def test_qmm_w4a8_nonfinite_and_zero_rows(isa: str) -> None:
    """A NaN or Inf in a row makes that row's outputs NaN and no other; a zero row gives
    exactly zero."""
    p = heavy_tailed_weight(21, 128)
    x = _x(7, 128, "float32", 9)
    x[1, 3] = np.nan
    x[4, 100] = np.inf
    x[6, 0] = -np.inf
    x[5] = 0.0
    b = CPUBackend(isa=isa)
    y = b.qmm_w4a8(x, b.prepare(p))
    assert np.isnan(y[[1, 4, 6]]).all()
    assert (y[5] == 0).all()
    assert not np.signbit(y[5]).any()
    good = [0, 2, 3]
    check_close("w4a8", "float32", y[good], reference.qmm_w4a8(x[good], p, out_dtype=None), isa)


def test_qmm_w4a8_thread_count_does_not_change_bits(native: Native, isa: str) -> None:
    """Chunks and work items depend on the problem, never on the thread count."""
    w = prepare(heavy_tailed_weight(100, 512), native)
    x = _x(37, 512, "float32", 4)
    y1 = w4a8.qmm_w4a8(native, isa, 1, x, w)
    y3 = w4a8.qmm_w4a8(native, isa, 3, x, w)
    np.testing.assert_array_equal(y1, y3)


def test_qmm_w4a8_refuses_k_not_multiple_of_32(isa: str) -> None:
    b = CPUBackend(isa=isa)
    w = b.prepare(nvfp4.quantize(np.ones((4, 48), np.float32), name="k48"))
    with pytest.raises(ValueError, match="multiple of 32"):
        b.qmm_w4a8(np.ones((2, 48), np.float32), w)


def test_to_planes_unchanged_by_w4a8_use(isa: str) -> None:
    """W4A8 needs no extra prepared data: the canonical planes come back byte for byte."""
    p = heavy_tailed_weight(33, 96)
    b = CPUBackend(isa=isa)
    w = b.prepare(p)
    b.qmm_w4a8(_x(3, 96, "float32", 1), w)
    back = b.to_planes(w)
    np.testing.assert_array_equal(back.codes, p.codes)
    np.testing.assert_array_equal(back.scales, p.scales)


# --------------------------------------------------------------------- gather_qmm_w4a8
def test_gather_w4a8_many_rows_per_expert_and_idle_experts(isa: str) -> None:
    p = expert_stack(6, 33, 64, seed=3)
    ids = np.array([4] * 70 + [1] * 3 + [4] * 5 + [0], dtype=np.int64)
    x = np.random.default_rng(4).standard_normal((ids.size, 64)).astype(np.float32)
    check_gather("gather_qmm_w4a8", isa, p, x, ids, sort=False)


def test_gather_w4a8_per_expert_partition_globals_and_dtypes(isa: str) -> None:
    rng = np.random.default_rng(8)
    w = rng.standard_normal((3, 30, 128)).astype(np.float32)
    w[:, 10:] *= 50.0
    p = nvfp4.quantize(w, partitions=(0, 10, 30), name="moe-qkv")
    ids = rng.integers(0, 3, size=11)
    b = CPUBackend(isa=isa)
    for dtype in DTYPES:
        x = _x(11, 128, dtype, 6)
        y = b.gather_qmm_w4a8(x, b.prepare(p), ids)
        assert y.dtype == np.dtype(DTYPES[dtype])
        ref = reference.gather_qmm_w4a8(x, p, ids, out_dtype=None)
        for e in np.unique(ids):
            for a, c in ((0, 10), (10, 30)):
                rows = ids == e
                check_close("w4a8", dtype, y[rows, a:c], ref[rows, a:c], f"{isa} {dtype} e{e}")


# ------------------------------------------------------------------------------- FP8
def _fp8_cases() -> dict[str, tuple[np.ndarray, float | None]]:
    rng = np.random.default_rng(23)
    nonfinite = rng.standard_normal((5, 96)).astype(np.float32)
    nonfinite[0, 3] = np.nan
    nonfinite[2, 50] = np.inf
    nonfinite[4, 95] = -np.inf
    ties = (rng.integers(8, 64, size=(4, 128)) * 2.0 + 1.0).astype(np.float32) / 16
    ties[:, ::2] *= -1
    sub = (rng.standard_normal((4, 128)) * 2e-3).astype(np.float32)
    sub[0, :8] = np.float32(2.0**-10) * np.asarray([1, -1, 3, -3, 0.5, 1.5, 2.5, 0], np.float32)
    sub[1, :4] = np.asarray([-0.0, 0.0, -1e-30, 1e-30], np.float32)
    return {
        "normal_dynamic": (rng.standard_normal((33, 512)).astype(np.float32), None),
        "normal_static": (rng.standard_normal((8, 256)).astype(np.float32), 0.01),
        "saturating_static": ((rng.standard_normal((4, 128)) * 100).astype(np.float32), 0.05),
        "overflowing_quotient": ((rng.standard_normal((2, 64)) * 1e30).astype(np.float32), 1e-20),
        "subnormal_codes_and_signed_zeros": (sub, 1.0),
        "e4m3_ties": (ties, 1.0),
        "zeros": (np.zeros((3, 64), np.float32), None),
        "nonfinite": (nonfinite, None),
        "bfloat16_input": (rng.standard_normal((16, 512)).astype(ml_dtypes.bfloat16), None),
        "float16_input": (rng.standard_normal((4, 256)).astype(np.float16), 0.003),
    }


FP8_CASES = _fp8_cases()


@pytest.mark.parametrize("case", list(FP8_CASES))
def test_quantize_fp8_bit_identical(case: str) -> None:
    x, scale = FP8_CASES[case]
    got = CPUBackend(threads=2).quantize_activations_fp8(x, scale)
    with np.errstate(all="ignore"):
        ref = reference.quantize_activations_fp8(x, scale)
    assert got.input_scale.view(np.uint32) == ref.input_scale.view(np.uint32)
    bad = got.codes != ref.codes
    if bad.any():
        i, j = (int(v) for v in np.argwhere(bad)[0])
        raise AssertionError(
            f"{case}: code ({i}, {j}) = {got.codes[i, j]:#04x}, expected {ref.codes[i, j]:#04x}"
        )


@pytest.mark.parametrize("scale", [None, 0.02, 1e-4])
@pytest.mark.parametrize(("m", "n", "k"), [(1, 7, 16), (5, 33, 64), (33, 40, 4096)])
def test_qmm_w4a8_fp8(isa: str, m: int, n: int, k: int, scale: float | None) -> None:
    """Dynamic, static and saturating (1e-4: most activations clamp at 448) input scales."""
    p = heavy_tailed_weight(n, k)
    b = CPUBackend(isa=isa, threads=2)
    x = _x(m, k, "float32", m + n + k)
    y = b.qmm_w4a8_fp8(x, b.prepare(p), input_scale=scale)
    ref = reference.qmm_w4a8_fp8(x, p, input_scale=scale, out_dtype=None)
    check_close("w4a8_fp8", "float32", y, ref, f"{isa} M={m} N={n} K={k} scale={scale}")


def test_qmm_w4a8_fp8_half_dtypes_and_nonfinite_rows(isa: str) -> None:
    p = heavy_tailed_weight(21, 128)
    b = CPUBackend(isa=isa)
    for dtype in ("float16", "bfloat16"):
        x = _x(4, 128, dtype, 2)
        y = b.qmm_w4a8_fp8(x, b.prepare(p))
        assert y.dtype == np.dtype(DTYPES[dtype])
        check_close("w4a8_fp8", dtype, y, reference.qmm_w4a8_fp8(x, p, out_dtype=None), isa)
    x = _x(5, 128, "float32", 3)
    x[1, 7] = np.nan
    x[3, 0] = -np.inf
    x[4] = 0.0
    y = b.qmm_w4a8_fp8(x, b.prepare(p), input_scale=0.01)
    assert np.isnan(y[[1, 3]]).all()
    assert (y[4] == 0).all()
    good = [0, 2]
    ref = reference.qmm_w4a8_fp8(x[good], p, input_scale=0.01, out_dtype=None)
    check_close("w4a8_fp8", "float32", y[good], ref, isa)


def test_rows_with_an_infinite_d_give_the_spec_infinities(isa: str) -> None:
    """A finite block past 127 x 65504 (d = inf in float16): every level's outputs for that
    row are the reference's, +inf, -inf or NaN element for element (the kernels that add a
    32-element block's halves before d would give an infinity where a term is NaN; such rows
    are recomputed); the other rows are untouched, and NaN rows stay NaN."""
    rng = np.random.default_rng(12)
    p = heavy_tailed_weight(40, 96)
    x = rng.standard_normal((6, 96)).astype(np.float32)
    x[1, :32] *= 1e10  # d = inf in block 0 of row 1
    x[3, 40:64] = 3e38  # and in block 1 of row 3
    x[4, 7] = np.nan
    b = CPUBackend(isa=isa, threads=2)
    y = b.qmm_w4a8(x, b.prepare(p))
    want = reference.qmm_w4a8(x, p)
    for r in (1, 3, 4):
        np.testing.assert_array_equal(y[r], want[r], err_msg=f"{isa} row {r}")
    assert np.isinf(y[1]).any() or np.isnan(y[1]).all()
    finite = [0, 2, 5]
    check_close("w4a8", "float32", y[finite], reference.qmm_w4a8(x, p, out_dtype=None)[finite], isa)
    stack = reference.quantize(rng.standard_normal((2, 40, 96)).astype(np.float32))
    ids = np.array([1, 0, 1, 0, 1, -1])
    yg = b.gather_qmm_w4a8(x, b.prepare(stack), ids)
    wg = reference.gather_qmm_w4a8(x, stack, ids)
    np.testing.assert_array_equal(yg[[1, 3, 4, 5]], wg[[1, 3, 4, 5]], err_msg=f"{isa} gather")
