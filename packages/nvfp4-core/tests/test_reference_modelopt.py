"""T2: the reference encoder is bit-identical to NVIDIA ModelOpt's ``NVFP4QTensor.quantize``.

Every case quantizes the same values with both encoders and compares the code bytes, the
scale bytes and the float32 global bit for bit, block by block. The last test reruns every
case and prints the totals (``pytest -s`` shows them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt
import pytest
from nvfp4 import NVFP4Planes, dequantize, quantize
from nvfp4.reference import unpack_codes
from nvfp4.spec import BLOCK_SIZE, GLOBAL_AMAX_DIVISOR

U8 = npt.NDArray[np.uint8]
F32 = npt.NDArray[np.float32]
F4 = ml_dtypes.float4_e2m1fn
F8 = ml_dtypes.float8_e4m3fn

#: Lower bounds on what the summary must have compared (guards against cases silently
#: shrinking to nothing).
MIN_TENSORS = 60
MIN_BLOCKS = 100_000


@pytest.fixture(scope="module")
def modelopt() -> Any:
    """``NVFP4QTensor`` (imports torch and ModelOpt once per module: a few seconds)."""
    mod: ModuleType = pytest.importorskip("modelopt.torch.quantization.qtensor.nvfp4_tensor")
    return mod.NVFP4QTensor


@dataclass
class Triplet:
    """Codes ``[..., N, K/2]``, scale bytes ``[..., N, K/16]`` and the float32 global."""

    codes: U8
    scales: U8
    global_scale: F32


@dataclass
class Tally:
    tensors: int = 0
    blocks: int = 0
    mismatched_blocks: int = 0
    mismatched_globals: int = 0


def _torch_input(w: npt.NDArray[Any]) -> Any:
    """The same values as a torch tensor of the same dtype (bfloat16 through float32)."""
    import torch

    if w.dtype == np.dtype(ml_dtypes.bfloat16):
        return torch.from_numpy(w.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(w).copy())


def _theirs(nvfp4_qtensor: Any, w: npt.NDArray[Any], g: float | None = None) -> Triplet:
    """ModelOpt's bytes for ``w`` (with an explicit decode global ``g`` when given)."""
    import torch

    kwargs = {}
    if g is not None:
        kwargs["weights_scaling_factor_2"] = torch.tensor(float(g), dtype=torch.float32)
    q, wsf, wsf2 = nvfp4_qtensor.quantize(_torch_input(w), BLOCK_SIZE, **kwargs)
    assert wsf.dtype == torch.float8_e4m3fn
    assert wsf2.dtype == torch.float32
    return Triplet(
        codes=q._quantized_data.numpy(),
        scales=wsf.view(torch.uint8).numpy(),
        global_scale=wsf2.numpy().astype(np.float32),
    )


def _ours(p: NVFP4Planes, *, expert: int | None = None, part: int | None = None) -> Triplet:
    codes, scales, g = p.codes, p.scales, np.asarray(p.global_scale)
    if expert is not None:
        codes, scales = codes[expert], scales[expert]
        g = g[expert] if g.ndim else g
    if part is not None:
        assert p.partitions is not None
        a, b = p.partitions[part], p.partitions[part + 1]
        codes, scales = codes[..., a:b, :], scales[..., a:b, :]
        g = g[..., part] if g.ndim else g
    return Triplet(codes, scales, np.asarray(g, dtype=np.float32))


def _compare(ours: Triplet, theirs: Triplet, tally: Tally) -> None:
    """Add one tensor's block and global mismatches to ``tally``."""
    assert ours.codes.shape == theirs.codes.shape, (ours.codes.shape, theirs.codes.shape)
    assert ours.scales.shape == theirs.scales.shape, (ours.scales.shape, theirs.scales.shape)
    code_diff = (ours.codes != theirs.codes).reshape(*ours.scales.shape, BLOCK_SIZE // 2)
    bad_block = code_diff.any(axis=-1) | (ours.scales != theirs.scales)
    tally.tensors += 1
    tally.blocks += int(ours.scales.size)
    tally.mismatched_blocks += int(bad_block.sum())
    g_ours = np.asarray(ours.global_scale, np.float32).reshape(-1).view(np.uint32)
    g_theirs = np.asarray(theirs.global_scale, np.float32).reshape(-1).view(np.uint32)
    tally.mismatched_globals += int(g_ours.shape != g_theirs.shape or (g_ours != g_theirs).any())


# ------------------------------------------------------------------------------ cases
Case = Callable[[Any, Tally], None]
CASES: dict[str, Case] = {}


def case(fn: Case) -> Case:
    CASES[fn.__name__] = fn
    return fn


def _same(mo: Any, w: npt.NDArray[Any], tally: Tally, g: float | None = None) -> NVFP4Planes:
    """Quantize ``w`` with both encoders (explicit global ``g`` or both default) and compare."""
    p = quantize(w) if g is None else quantize(w, global_scale=np.float32(g))
    _compare(_ours(p), _theirs(mo, w, g), tally)
    return p


SHAPES = [(1, 16), (3, 32), (8, 64), (16, 128), (5, 48), (64, 256), (128, 512), (32, 1024)]
SCALES = [1e-3, 1.0, 37.5]


@case
def random_normal(mo: Any, tally: Tally) -> None:
    rng = np.random.default_rng(10)
    for shape in SHAPES:
        for scale in SCALES:
            _same(mo, (rng.standard_normal(shape) * scale).astype(np.float32), tally)


@case
def random_normal_large(mo: Any, tally: Tally) -> None:
    rng = np.random.default_rng(11)
    for shape in [(512, 512), (256, 1536), (1024, 1024)]:
        _same(mo, rng.standard_normal(shape).astype(np.float32), tally)


@case
def heavy_tailed_student_t(mo: Any, tally: Tally) -> None:
    rng = np.random.default_rng(12)
    for df in (1.0, 2.0, 3.0, 5.0):
        _same(mo, rng.standard_t(df, size=(96, 256)).astype(np.float32), tally)


@case
def huge_outliers(mo: Any, tally: Tally) -> None:
    rng = np.random.default_rng(13)
    for n_out in (1, 5, 40):
        w = rng.standard_normal((64, 256)).astype(np.float32)
        idx = rng.choice(w.size, n_out, replace=False)
        w.reshape(-1)[idx] *= np.float32(1e4)
        _same(mo, w, tally)


# Decode-side (s, g) pairs whose product is exact: every tie lands exactly on x/(s*g).
TIE_SCALES = [
    (1.0, 1.0),
    (0.375, 2.0**-12),
    (2.0**-7, 1.0),  # a subnormal E4M3 scale (4 * 2^-9)
    (3 * 2.0**-9, 2.0**-3),  # subnormal
    (448.0, 2.0**-20),  # the largest scale
    (1.125, 3 * 2.0**-14),
    (13.0, 0.5),
]


def _tie_tensor(s: float, g: float) -> tuple[F32, F32]:
    """Rows of 16 whose first element sets the block scale to exactly ``s`` and whose
    others are every E2M1 tie (and +-1 ulp around it), both signs, times ``s * g``."""
    mags = np.arange(8, dtype=np.uint8).view(F4).astype(np.float32)
    ties = ((mags[:-1] + mags[1:]) / np.float32(2)).astype(np.float32)
    sg = np.float32(np.float32(s) * np.float32(g))
    x = (ties * sg).astype(np.float32)
    x = np.concatenate(
        [x, np.nextafter(x, np.float32(-np.inf)), np.nextafter(x, np.float32(np.inf))]
    )
    x = np.concatenate([x, -x]).astype(np.float32)
    pad = (-x.size) % (BLOCK_SIZE - 1)
    x = np.concatenate([x, np.zeros(pad, np.float32)]).reshape(-1, BLOCK_SIZE - 1)
    amax = np.float32(np.float32(6.0) * sg)
    w = np.concatenate([np.full((x.shape[0], 1), amax, np.float32), x], axis=1)
    return w.astype(np.float32), (ties * sg).astype(np.float32)


@case
def e2m1_rounding_boundaries(mo: Any, tally: Tally) -> None:
    for s, g in TIE_SCALES:
        w, exact_ties = _tie_tensor(s, g)
        g32, s32 = np.float32(g), np.float32(s)
        # The construction is exact: the block scale is s and every tie divides back exactly.
        assert np.float32(w[0, 0] / (np.float32(6.0) * g32)) == s32
        np.testing.assert_array_equal(
            (exact_ties / (s32 * g32)).astype(np.float32), [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
        )
        p = _same(mo, w, tally, g=g)
        # Second oracle: ml_dtypes rounds q = x / (s * g) the same way (sign from x < 0).
        np.testing.assert_array_equal(
            p.scales, np.full(p.scales.shape, s32).astype(F8).view(np.uint8)
        )
        q = (w / (s32 * g32)).astype(np.float32)
        expect = (np.abs(q).astype(F4).view(np.uint8) & 7) | ((w < 0).astype(np.uint8) << 3)
        np.testing.assert_array_equal(unpack_codes(p.codes), expect)


def _ulp_steps(x: F32, steps: npt.ArrayLike) -> F32:
    """Positive float32 ``x`` moved by ``steps`` ulps (through the bit pattern)."""
    b = np.asarray(x, np.float32).view(np.int32).astype(np.int64) + np.asarray(steps, np.int64)
    return b.astype(np.int32).view(np.float32)


def _random_globals(rng: np.random.Generator, count: int) -> F32:
    """Arbitrary float32 globals (full mantissas), log-uniform over 1e-7 .. 1e2."""
    return np.exp(rng.uniform(np.log(1e-7), np.log(1e2), count)).astype(np.float32)


@case
def near_e2m1_ties_arbitrary_scales(mo: Any, tally: Tally) -> None:
    """Values within 3 ulps of ``tie * s * g`` for full-mantissa globals: the order of
    ``x / (s * g)`` (product first, one division) decides the code here."""
    rng = np.random.default_rng(20)
    mags = np.arange(8, dtype=np.uint8).view(F4).astype(np.float32)
    ties = ((mags[:-1] + mags[1:]) / np.float32(2)).astype(np.float32)
    for g in _random_globals(rng, 12):
        rows, k_blocks = 32, 8
        s = rng.integers(0x01, 0x7F, size=(rows, k_blocks, 1), dtype=np.uint8)
        sg = (s.view(F8).astype(np.float32) * g).astype(np.float32)
        t = rng.choice(ties, size=(rows, k_blocks, BLOCK_SIZE - 1))
        x = _ulp_steps((t * sg).astype(np.float32), rng.integers(-3, 4, size=t.shape))
        x = np.where(rng.random(t.shape) < 0.5, -x, x).astype(np.float32)
        amax = (np.float32(6.0) * sg).astype(np.float32)
        w = np.concatenate([amax, x], axis=-1).reshape(rows, k_blocks * BLOCK_SIZE)
        _same(mo, w, tally, g=float(g))


@case
def near_e4m3_midpoints(mo: Any, tally: Tally) -> None:
    """Block amaxes within 3 ulps of ``m * 6 * g`` for every E4M3 midpoint ``m``: the order
    of ``block_amax / (6 * g)`` and its rounding decide the scale byte here."""
    rng = np.random.default_rng(21)
    grid = np.arange(0x01, 0x7F, dtype=np.uint8).view(F8).astype(np.float32)
    mids = ((grid[:-1] + grid[1:]) / np.float32(2)).astype(np.float32)
    for g in _random_globals(rng, 8):
        six_g = np.float32(np.float32(6.0) * g)
        m = np.tile(mids, 2)[:, None]  # every midpoint, twice: 250 rows of one block
        amax = _ulp_steps((m * six_g).astype(np.float32), rng.integers(-3, 4, size=m.shape))
        rest = (rng.uniform(-1.0, 1.0, size=(m.shape[0], BLOCK_SIZE - 1)) * amax).astype(np.float32)
        sign = np.where(rng.random(m.shape) < 0.5, np.float32(-1), np.float32(1))
        w = np.concatenate([amax * sign, rest], axis=-1).astype(np.float32)
        _same(mo, w, tally, g=float(g))


@case
def subnormal_block_scales(mo: Any, tally: Tally) -> None:
    """Blocks far below the tensor amax: s in the E4M3 subnormals and below 2^-9 (clamped)."""
    rng = np.random.default_rng(14)
    n_rows = 48
    w = rng.standard_normal((n_rows, 128)).astype(np.float32)
    w[0, 0] = 1000.0
    # block amax relative to the tensor amax from 1e-2 down to 1e-9
    rel = np.logspace(-2, -9, n_rows - 1).astype(np.float32)
    w[1:] *= (np.float32(1000.0) * rel / np.abs(w[1:]).max(axis=1))[:, None]
    p = _same(mo, w, tally)
    s = p.scales.view(F8).astype(np.float32)
    assert (s < 2.0**-6).sum() > 50  # subnormal scales occur
    assert (p.scales == 0x01).sum() > 10  # clamped at 2^-9


@case
def maximal_block_scales(mo: Any, tally: Tally) -> None:
    """An explicit global far below amax/2688: s > 448 clamps to 448 and codes saturate."""
    rng = np.random.default_rng(15)
    w = rng.standard_normal((32, 128)).astype(np.float32)
    amax = float(np.abs(w).max())
    for factor in (1.0 / 10.0, 1.0 / 1000.0, 1.0 / 3.0e6):
        p = _same(mo, w, tally, g=amax / GLOBAL_AMAX_DIVISOR * factor)
        assert (p.scales == 0x7E).any()


@case
def zero_blocks_and_signed_zeros(mo: Any, tally: Tally) -> None:
    rng = np.random.default_rng(16)
    w = rng.standard_normal((16, 128)).astype(np.float32)
    w[3] = 0.0  # a zero row
    w[5, 16:48] = 0.0  # two zero blocks inside a row
    w[7, 64:80] = -0.0  # a block of negative zeros
    w[9, ::3] = -0.0  # scattered negative zeros
    p = _same(mo, w, tally)
    codes = unpack_codes(p.codes)
    assert (codes[7, 64:80] == 0).all()
    assert (codes[9, ::3] == 0).all()
    assert (p.scales[3] == 0x38).all()  # s == 0 -> 1.0


@case
def tiny_negatives_round_to_code_8(mo: Any, tally: Tally) -> None:
    w = np.zeros((4, 32), np.float32)
    w[:, 0] = 6.0
    w[:, 1:16] = -np.linspace(1e-6, 0.24, 15, dtype=np.float32)  # |q| < 0.25
    w[:, 16] = 1.0
    w[:, 17:] = -np.float32(1e-30)
    p = _same(mo, w, tally, g=1.0)
    codes = unpack_codes(p.codes)
    assert (codes[:, 1:16] == 8).all()
    assert (codes[:, 17:] == 8).all()


@case
def fused_qkv_shared_global(mo: Any, tally: Tally) -> None:
    """ModelOpt's preprocess_linear_fusion: q/k/v share the global of the largest amax."""
    rng = np.random.default_rng(17)
    q = (rng.standard_normal((64, 128)) * 0.5).astype(np.float32)
    k = (rng.standard_normal((32, 128)) * 2.0).astype(np.float32)
    v = (rng.standard_normal((32, 128)) * 0.05).astype(np.float32)
    amax = max(float(np.abs(t).max()) for t in (q, k, v))
    shared = np.float32(np.float32(amax) / np.float32(GLOBAL_AMAX_DIVISOR))
    for t in (q, k, v):
        _same(mo, t, tally, g=float(shared))
    # One fused tensor with a global per partition = each part quantized on its own.
    fused = np.concatenate([q, k, v])
    parts = (0, 64, 96, 128)
    p = quantize(fused, partitions=parts)
    assert p.global_scale.shape == (3,)
    for i, t in enumerate((q, k, v)):
        _compare(_ours(p, part=i), _theirs(mo, t), tally)
    # ... and with the shared global given explicitly
    p = quantize(fused, global_scale=shared, name="qkv")
    _compare(_ours(p), _theirs(mo, fused, float(shared)), tally)


@case
def expert_stacked(mo: Any, tally: Tally) -> None:
    rng = np.random.default_rng(18)
    w = (rng.standard_normal((4, 32, 64)) * np.array([0.1, 1.0, 10.0, 3.0])[:, None, None]).astype(
        np.float32
    )
    p = quantize(w)  # a global per expert
    assert p.global_scale.shape == (4,)
    for e in range(4):
        _compare(_ours(p, expert=e), _theirs(mo, w[e]), tally)
    # ModelOpt's 3-D quantize uses one global for the whole tensor: give ours the same one.
    theirs = _theirs(mo, w)
    p = quantize(w, global_scale=theirs.global_scale)
    _compare(_ours(p), theirs, tally)


@case
def half_precision_inputs(mo: Any, tally: Tally) -> None:
    rng = np.random.default_rng(19)
    for shape in [(16, 64), (64, 256)]:
        base = rng.standard_normal(shape).astype(np.float32) * np.float32(3.0)
        _same(mo, base.astype(ml_dtypes.bfloat16), tally)
        _same(mo, base.astype(np.float16), tally)
        _same(mo, base.astype(ml_dtypes.bfloat16), tally, g=0.001)
        _same(mo, base.astype(np.float16), tally, g=0.001)


# ------------------------------------------------------------------------------ tests
@pytest.mark.parametrize("name", list(CASES))
def test_bit_identical_to_modelopt(modelopt: Any, name: str) -> None:
    tally = Tally()
    CASES[name](modelopt, tally)
    assert tally.tensors > 0
    assert tally.blocks > 0
    assert tally.mismatched_blocks == 0, f"{name}: {tally}"
    assert tally.mismatched_globals == 0, f"{name}: {tally}"


def test_all_zero_tensor_documented_difference(modelopt: Any) -> None:
    """ModelOpt divides 0 by a 0 global: NaN scale bytes. Ours: global 1.0, byte 0x38."""
    w = np.zeros((4, 64), np.float32)
    theirs = _theirs(modelopt, w)
    assert float(theirs.global_scale) == 0.0
    assert np.isnan(theirs.scales.view(F8).astype(np.float32)).all()
    assert ((theirs.scales & 0x7F) == 0x7F).all()
    p = quantize(w)
    assert p.global_scale.shape == ()
    assert float(p.global_scale) == 1.0
    assert (p.scales == 0x38).all()
    assert (p.codes == 0).all()
    d = dequantize(p)
    assert (d == 0).all()
    assert not np.signbit(d).any()
    # ModelOpt's own planes decode to NaN (the NaN scale), ours to exact zeros.
    vals = unpack_codes(theirs.codes).view(F4).astype(np.float32).reshape(4, 4, BLOCK_SIZE)
    assert np.isnan(vals * theirs.scales.view(F8).astype(np.float32)[..., None]).all()


@pytest.mark.parametrize(
    ("shape", "index", "bad"),
    [
        ((4, 32), (2, 5), np.nan),
        ((4, 32), (0, 0), np.inf),
        ((4, 32), (3, 31), -np.inf),
        ((2, 3, 16), (1, 2, 7), np.nan),
    ],
)
def test_non_finite_input_is_refused_naming_the_index(
    shape: tuple[int, ...], index: tuple[int, ...], bad: float
) -> None:
    w = np.ones(shape, np.float32)
    w[index] = bad
    with pytest.raises(ValueError, match=r"index") as info:
        quantize(w, name="blk.0.w")
    assert str(index) in str(info.value)
    assert "blk.0.w" in str(info.value)


def test_summary_every_case_zero_mismatches(modelopt: Any) -> None:
    tally = Tally()
    for fn in CASES.values():
        fn(modelopt, tally)
    print(
        f"\nModelOpt parity: compared {tally.tensors} tensors, {tally.blocks} blocks, "
        f"{tally.mismatched_blocks} mismatches ({tally.mismatched_globals} global mismatches)"
    )
    assert tally.tensors >= MIN_TENSORS
    assert tally.blocks >= MIN_BLOCKS
    assert tally.mismatched_blocks == 0
    assert tally.mismatched_globals == 0
