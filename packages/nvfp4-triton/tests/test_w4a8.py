"""W4A8 (spec 1.1): the int8 (Q8_0) and FP8 activation encoders bit-exact to the reference
(codes, d bytes, the dynamic scale), and qmm_w4a8 / gather_w4a8 / w4a8_fp8 within
[w4a8] / [w4a8_fp8] of the float64 reference at ragged N, K = 32 / 64 / 96, M = 1..17,
with NaN / Inf rows, zero rows and out-of-range expert ids."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from nvfp4 import reference, spec
from nvfp4.planes import NVFP4Planes
from nvfp4.testing import nonfinite_blocks, q8_exact_halves, scattered_inf, zero_blocks
from nvfp4_triton import hardware, ops
from nvfp4_triton.config import KernelConfig
from nvfp4_triton.kernels.w4a8 import _e2m1_as_e4m3, _e2m1_doubled
from nvfp4_triton.testing import DTYPES, TORCH, check_close, to_numpy, torch_activations
from nvfp4_triton.weights import upload

E = 4


def _torch(x: np.ndarray) -> torch.Tensor:
    if x.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(x))


def _weight(rng: np.random.Generator, n: int, k: int, parts=None):
    w = rng.standard_normal((n, k)).astype(np.float32)
    w *= np.exp(rng.normal(0, 0.7, (n, 1))).astype(np.float32)
    if parts is not None:
        for i, (a, b) in enumerate(itertools.pairwise(parts)):
            w[a:b] *= np.float32(10.0**i)
    return reference.quantize(w, partitions=parts, name="w")


# ----------------------------------------------------------------------- decoders
@triton.jit
def _decode_codes(out_ptr):
    code = tl.arange(0, 16)
    tl.store(out_ptr + code, _e2m1_doubled(code))
    tl.store(out_ptr + 16 + code, _e2m1_as_e4m3(code))


def test_weight_decoders_on_all_16_codes() -> None:
    """2 * e2m1 as an integer (the int8 dot's operand) and e2m1 as an E4M3 byte (the FP8
    dot's operand), for every code, against the spec's E2M1 table."""
    out = torch.zeros(32, dtype=torch.int32)
    _decode_codes[(1,)](out)
    doubled, e4m3 = out[:16].numpy(), out[16:].numpy()
    values = spec.E2M1_VALUES.astype(np.float64)  # code -> value, sign included
    np.testing.assert_array_equal(doubled, 2 * values)
    decoded = e4m3.astype(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    np.testing.assert_array_equal(decoded, values)
    assert np.signbit(decoded[8]), "code 8 is -0.0"


# ------------------------------------------------------------------- int8 encoder
def _check_q8(x: np.ndarray, cfg: KernelConfig) -> None:
    ref = reference.quantize_activations_q8(x)
    codes, d = ops.quantize_q8(_torch(x), cfg)
    assert codes.dtype == torch.int8
    assert d.dtype == torch.float16
    np.testing.assert_array_equal(codes.numpy(), ref.codes)
    np.testing.assert_array_equal(d.numpy().view(np.uint16), ref.d.view(np.uint16))  # bytes


Q8_CASES = {
    "normal": lambda r: r.standard_normal((9, 96)).astype(np.float32),
    # blocks of amax 127 (d = 1, id = 1), other elements exact halves: roundf sends them
    # away from zero (126.5 -> 127, -0.5 -> -1)
    "exact_halves": lambda r: q8_exact_halves(r, 5, 64),
    "rows_1e-40_to_1e30": lambda r: (
        r.standard_normal((8, 64))
        * np.array([1e-40, 1e-38, 3e-37, 1e-30, 1e-7, 1, 1e8, 1e30])[:, None]
    ).astype(np.float32),
    "zeros_and_zero_blocks": lambda r: (
        zero_blocks(r, 4, 96, zeros=32) * np.array([0, 1, -1, 0], np.float32)[:, None]
    ),
    "negative_zero": lambda r: np.full((2, 32), -0.0, np.float32),
    "nonfinite_blocks": lambda r: nonfinite_blocks(r, 6, 96, 0.03),
    "float16": lambda r: r.standard_normal((17, 64)).astype(np.float16),
    "bfloat16": lambda r: r.standard_normal((3, 32)).astype(ml_dtypes.bfloat16),
}


@pytest.mark.parametrize("case", list(Q8_CASES))
def test_quantize_q8_bit_exact(any_cfg: KernelConfig, case: str) -> None:
    """Codes and d bytes equal the reference's: ties away from zero, d beyond float16
    (inf) and below it (0 or subnormal), id = 1/d infinite (d below 2^-128: codes +-127 and
    0, as the reference's casts give), zeros, -0.0, NaN / Inf blocks (codes 0, d 0x7E00),
    float16 and bfloat16 input."""
    x = Q8_CASES[case](np.random.default_rng(len(case)))
    _check_q8(x, any_cfg)


def test_quantize_q8_strided_rows(cfg: KernelConfig) -> None:
    wide = np.random.default_rng(3).standard_normal((5, 128)).astype(np.float32)
    x = torch.from_numpy(wide)[:, 32:96]
    assert x.stride(0) == 128
    codes, d = ops.quantize_q8(x, cfg)
    ref = reference.quantize_activations_q8(wide[:, 32:96])
    np.testing.assert_array_equal(codes.numpy(), ref.codes)
    np.testing.assert_array_equal(d.numpy().view(np.uint16), ref.d.view(np.uint16))


def test_quantize_q8_skips_unrouted_rows(cfg: KernelConfig) -> None:
    """With expert ids, a row whose id is out of range is not read: NaN there encodes as
    zeros (codes 0, d +0), the other rows as the reference."""
    x = np.random.default_rng(4).standard_normal((4, 64)).astype(np.float32)
    x[[1, 3]] = np.nan
    ids = torch.tensor([0, -1, 2, 9])
    codes, d = ops.quantize_q8(torch.from_numpy(x), cfg, ids, 3)
    ref = reference.quantize_activations_q8(x[[0, 2]])
    np.testing.assert_array_equal(codes.numpy()[[0, 2]], ref.codes)
    np.testing.assert_array_equal(d.numpy()[[0, 2]].view(np.uint16), ref.d.view(np.uint16))
    assert (codes.numpy()[[1, 3]] == 0).all()
    assert (d.numpy()[[1, 3]].view(np.uint16) == 0).all()


# -------------------------------------------------------------------- FP8 encoder
def _check_fp8(x: np.ndarray, input_scale, cfg: KernelConfig) -> None:
    ref = reference.quantize_activations_fp8(x, input_scale)
    s = ops.fp8_input_scale(_torch(x), input_scale)
    assert np.float32(s.item()).tobytes() == np.float32(ref.input_scale).tobytes()
    codes = ops.quantize_fp8(_torch(x), s, cfg)
    assert codes.dtype == torch.uint8
    np.testing.assert_array_equal(codes.numpy(), ref.codes)


def _every_e4m3_value_and_midpoint() -> np.ndarray:
    """Every finite E4M3 magnitude, the midpoints between neighbours (ties: RNE), points
    just beside them, values below 2^-10, beyond 448, both signs; 2 x 1024."""
    v = np.unique(np.abs(spec.E4M3_VALUES[np.isfinite(spec.E4M3_VALUES)])).astype(np.float64)
    mids = (v[1:] + v[:-1]) / 2
    pts = np.concatenate(
        [v, mids, mids * (1 + 2**-20), mids * (1 - 2**-20), [2**-10, 2**-11, 1e-30, 450, 464, 1e9]]
    ).astype(np.float32)
    pts = np.resize(pts, 1024)
    return np.stack([pts, -pts])


FP8_CASES = {
    "normal_dynamic": (lambda r: r.standard_normal((9, 96)).astype(np.float32), None),
    "normal_static": (lambda r: r.standard_normal((3, 64)).astype(np.float32), 0.01),
    "saturating_static": (lambda r: (r.standard_normal((4, 64)) * 100).astype(np.float32), 0.05),
    "subnormal_codes": (lambda r: (r.standard_normal((4, 64)) * 1e-3).astype(np.float32), 1.0),
    "every_value_midpoint": (lambda r: _every_e4m3_value_and_midpoint(), 1.0),
    "zeros_dynamic": (lambda r: np.zeros((2, 32), np.float32), None),
    "negative_zero": (lambda r: np.full((1, 32), -0.0, np.float32), 1.0),
    "nonfinite_dynamic": (lambda r: scattered_inf(r, 5, 64, 0.05), None),
    "float16_dynamic": (lambda r: r.standard_normal((17, 32)).astype(np.float16), None),
    "bfloat16_dynamic": (lambda r: r.standard_normal((3, 64)).astype(ml_dtypes.bfloat16), None),
}


@pytest.mark.parametrize("case", list(FP8_CASES))
def test_quantize_fp8_bit_exact(any_cfg: KernelConfig, case: str) -> None:
    """FP8 codes and the dynamic scale equal the reference's, bit for bit: every E4M3 value,
    every tie (RNE), saturation at 448, subnormals, below 2^-10, -0.0 (0x80), NaN / Inf
    (0x7F), the dynamic scale amax / 448 over finite values (1.0 for zeros)."""
    build, input_scale = FP8_CASES[case]
    _check_fp8(build(np.random.default_rng(len(case))), input_scale, any_cfg)


# --------------------------------------------------------------------- int8 matmul
# (M, N, K): M = 1..17 around the 16-row tile, N ragged, K = 32 / 64 / 96 (and 160: more
# than one chunk of the test config's SUB blocks)
W4A8_SHAPES = [(1, 7, 32), (2, 45, 64), (5, 1, 96), (16, 33, 64), (17, 20, 96), (3, 70, 160)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("m", "n", "k"), W4A8_SHAPES, ids=[f"M{m}_N{n}_K{k}" for m, n, k in W4A8_SHAPES]
)
def test_w4a8(any_cfg: KernelConfig, dtype: str, m: int, n: int, k: int) -> None:
    rng = np.random.default_rng(m * 1000 + n + k)
    planes = _weight(rng, n, k)
    x, x32 = torch_activations(rng, m, k, dtype)
    y = ops.w4a8(x, upload(planes, "cpu"), TORCH[dtype], any_cfg)
    assert y.dtype == TORCH[dtype]
    assert tuple(y.shape) == (m, n)
    check_close(y, reference.qmm_w4a8(x32, planes, out_dtype=None), "w4a8", dtype, f"w4a8 {dtype}")


def test_w4a8_partitions_nonfinite_and_zero_rows(cfg: KernelConfig) -> None:
    """Fused partitions with globals 100x apart; NaN in row 1, -Inf in row 3: those rows
    are NaN, a zero row is exactly +0, the others within [w4a8]."""
    rng = np.random.default_rng(7)
    planes = _weight(rng, 24, 96, parts=(0, 5, 21, 24))
    x, x32 = torch_activations(rng, 6, 96, "float32")
    x[1, 40] = float("nan")
    x[3, 95] = float("-inf")
    x[4] = 0.0
    x32 = x.numpy()
    y = to_numpy(ops.w4a8(x, upload(planes, "cpu"), torch.float32, cfg))
    assert np.isnan(y[[1, 3]]).all()
    assert (y[4] == 0).all()
    assert not np.signbit(y[4]).any()
    good = [0, 2, 5]
    ref = reference.qmm_w4a8(x32, planes, out_dtype=None)
    check_close(torch.from_numpy(y[good]), ref[good], "w4a8", "float32", "partitions")


def test_w4a8_exact_on_integers(cfg: KernelConfig) -> None:
    """Activations whose Q8 codes are exact (d = 1) and a weight with scale bytes 0x38
    (1.0) and global 1: every term is an integer, so the float32 result is exact."""
    rng = np.random.default_rng(8)
    x = rng.integers(-127, 128, size=(3, 64)).astype(np.float32)
    x[:, ::32] = 127.0
    codes = rng.integers(0, 256, size=(9, 32), dtype=np.uint8)
    planes = NVFP4Planes(codes, np.full((9, 4), 0x38, np.uint8), np.asarray(1.0, np.float32))
    y = to_numpy(ops.w4a8(torch.from_numpy(x), upload(planes, "cpu"), torch.float32, cfg))
    exact = reference.qmm_w4a8(x, planes, out_dtype=None)
    np.testing.assert_array_equal(y, exact)


# ---------------------------------------------------------------------- MoE int8
def _experts(rng: np.random.Generator, n: int, k: int, parts=None):
    w = rng.standard_normal((E, n, k)).astype(np.float32)
    w *= (4.0 ** np.arange(E, dtype=np.float32))[:, None, None]  # distinct expert globals
    return reference.quantize(w, partitions=parts, name="experts")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sort", [False, True], ids=["unsorted", "sorted"])
@pytest.mark.parametrize(("m", "k"), [(1, 32), (5, 64), (17, 96)])
def test_gather_w4a8(any_cfg: KernelConfig, sort: bool, dtype: str, m: int, k: int) -> None:
    """Ids out of range on both sides (with NaN in their rows of x: never read, so their
    rows are exactly +0), per-expert globals, sorted and unsorted."""
    rng = np.random.default_rng(m * 7 + k + sort)
    planes = _experts(rng, 21, k)
    x, x32 = torch_activations(rng, m, k, dtype)
    ids = rng.integers(0, E, m)
    if m >= 3:
        ids[rng.choice(m, size=m // 3, replace=False)] = rng.choice([-1, E, 1 << 20, -(1 << 20)])
    if sort:
        ids = np.sort(ids)
    oob = (ids < 0) | (ids >= E)
    x[torch.from_numpy(oob)] = float("nan")
    x32[oob] = 0.0
    y = ops.gather_w4a8(
        x, upload(planes, "cpu"), torch.from_numpy(ids), TORCH[dtype], any_cfg, sorted_indices=sort
    )
    assert y.dtype == TORCH[dtype]
    yn = to_numpy(y).astype(np.float64)
    assert (yn[oob] == 0).all()
    assert not np.signbit(yn[oob]).any()
    ref = reference.gather_qmm_w4a8(x32, planes, ids, out_dtype=None)
    check_close(y, ref, "w4a8", dtype, f"gather_w4a8 {dtype}")


def test_gather_w4a8_expert_partition_globals_and_false_hint(cfg: KernelConfig) -> None:
    """(E, P) globals; a "sorted" hint the ids do not honour is dropped."""
    rng = np.random.default_rng(12)
    planes = _experts(rng, 24, 64, parts=(0, 10, 24))
    assert planes.global_scale.shape == (E, 2)
    x, x32 = torch_activations(rng, 9, 64, "float32")
    ids = np.array([3, 0, 2, 2, -1, 1, 0, 3, 3])
    y = ops.gather_w4a8(
        x, upload(planes, "cpu"), torch.from_numpy(ids), torch.float32, cfg, sorted_indices=True
    )
    ref = reference.gather_qmm_w4a8(x32, planes, ids, out_dtype=None)
    check_close(y, ref, "w4a8", "float32", "gather (E, P) false hint")


# ---------------------------------------------------------------------- FP8 matmul
# K = 16, 48, 80: FP8 takes any multiple of 16 (a half 32-element step at the end)
FP8_SHAPES = [
    (1, 7, 32, None),
    (2, 5, 16, None),
    (4, 45, 64, "static"),
    (3, 9, 48, "static"),
    (17, 20, 96, "saturating"),
    (16, 33, 160, None),
    (5, 24, 80, None),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("m", "n", "k", "scale"), FP8_SHAPES, ids=[f"M{m}_N{n}_K{k}_{s}" for m, n, k, s in FP8_SHAPES]
)
def test_w4a8_fp8(any_cfg: KernelConfig, dtype: str, m: int, n: int, k: int, scale) -> None:
    rng = np.random.default_rng(m * 100 + n + k)
    planes = _weight(rng, n, k)
    x, x32 = torch_activations(rng, m, k, dtype)
    amax = float(np.abs(x32).max())
    input_scale = {None: None, "static": amax / 448 * 1.5, "saturating": amax / 448 / 4}[scale]
    y = ops.w4a8_fp8(x, upload(planes, "cpu"), input_scale, TORCH[dtype], any_cfg)
    assert y.dtype == TORCH[dtype]
    ref = reference.qmm_w4a8_fp8(x32, planes, input_scale=input_scale, out_dtype=None)
    check_close(y, ref, "w4a8_fp8", dtype, f"w4a8_fp8 {dtype} {scale}")


def test_w4a8_fp8_nonfinite_and_zero_rows(cfg: KernelConfig) -> None:
    """A NaN or an infinity gives the NaN code and a NaN row (set by the kernel: the
    interpreter's FP8 dot would widen 0x7F to 480); a zero row is exactly zero."""
    rng = np.random.default_rng(13)
    planes = _weight(rng, 16, 64)
    x, _ = torch_activations(rng, 5, 64, "float32")
    x[1, 3] = float("nan")
    x[2, 63] = float("inf")
    x[3] = 0.0
    y = to_numpy(ops.w4a8_fp8(x, upload(planes, "cpu"), None, torch.float32, cfg))
    assert np.isnan(y[[1, 2]]).all()
    assert (y[3] == 0).all()
    good = [0, 4]
    ref = reference.qmm_w4a8_fp8(x.numpy(), planes, out_dtype=None)
    check_close(torch.from_numpy(y[good]), ref[good], "w4a8_fp8", "float32", "finite rows")


# ------------------------------------------------------------------------ gating
@pytest.mark.parametrize(
    ("target", "fp8"),
    [
        (("cuda", 80, 32), False),
        (("cuda", 89, 32), True),
        (("cuda", 90, 32), True),
        (("cuda", 120, 32), True),
        (("hip", "gfx942", 64), True),
        (("hip", "gfx950", 64), True),
        (("hip", "gfx1100", 32), False),
        (("hip", "gfx1201", 32), False),
    ],
)
def test_fp8_targets(target, fp8: bool) -> None:
    assert hardware.target_has_fp8(target) is fp8


def test_int8_gating() -> None:
    assert [hardware.cuda_has_int8((c, 0)) for c in (8, 9, 10, 12)] == [True, True, False, False]
    assert [hardware.hip_has_int8(a) for a in ("gfx942", "gfx950", "gfx1100")] == [
        True,
        True,
        False,
    ]
