"""``nvfp4.deviation_emulators``: with no deviation the emulated encoder and decoder are the
reference bit for bit; each emulated deviation changes what its registry entry says and
stays within the registry's bound (measured here on a seeded corpus); the set emulated is
the registry's ``emulated = true`` set. (The engines package checks the emulations against
the engines themselves.)"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from nvfp4 import deviation_emulators as emu
from nvfp4 import deviation_registry as reg
from nvfp4 import reference
from nvfp4.spec import E4M3_VALUES

DTYPES = (np.float32, np.float16, ml_dtypes.bfloat16)


def _corpus(seed: int) -> list[np.ndarray]:
    """Normal, heavy-tailed, rows from 1e-3 to 1e3, rows far below the amax, zeros."""
    rng = np.random.default_rng(seed)
    normal = rng.standard_normal((16, 128)).astype(np.float32)
    heavy = (rng.standard_t(2, (16, 128))).astype(np.float32)
    rows = (rng.standard_normal((16, 128)) * np.logspace(-3, 3, 16)[:, None]).astype(np.float32)
    tiny = rng.standard_normal((16, 128)).astype(np.float32)
    tiny[1:] *= np.float32(1e-6)  # blocks whose scale falls below 2^-6, 2^-9 and 2^-10
    zeros = np.zeros((2, 64), np.float32)
    zeros[0, :16] = 1.0
    return [normal, heavy, rows, tiny, zeros]


def test_the_emulated_set_is_the_registry_s() -> None:
    declared = {d.id for d in reg.deviations() if d.emulated}
    assert declared == emu.EMULATED
    assert {d.id for d in reg.deviations()} - declared == emu.NOT_EMULATED
    assert "out_of_range_expert_id" in emu.NOT_EMULATED


@pytest.mark.parametrize("dtype", DTYPES)
def test_no_deviation_is_the_reference_bit_for_bit(dtype: type) -> None:
    for x in _corpus(1):
        xs = x.astype(dtype)
        for scale in (None, 0.01):
            ref = reference.quantize_activations(xs, scale)
            got = emu.quantize_activations(xs, scale)
            np.testing.assert_array_equal(got.codes, ref.codes)
            np.testing.assert_array_equal(got.scales, ref.scales)
            assert got.global_scale.tobytes() == np.asarray(ref.global_scale, np.float32).tobytes()
            for out in ("float32", "float16", "bfloat16"):
                a = emu.dequantize(ref, out)
                b = reference.dequantize(ref, out)
                assert a.dtype == b.dtype
                assert a.tobytes() == b.tobytes()


def test_nonfinite_blocks_as_the_reference() -> None:
    x = np.ones((2, 32), np.float32)
    x[0, 3] = np.nan
    x[1, 20] = np.inf
    ref = reference.quantize_activations(x)
    got = emu.quantize_activations(x)
    np.testing.assert_array_equal(got.scales, ref.scales)
    np.testing.assert_array_equal(got.codes, ref.codes)
    one = emu.quantize_activations(x, deviations=["ct_nonfinite_global_one"])
    assert float(one.global_scale) == 1.0
    assert float(ref.global_scale) != 1.0
    tiny = np.full((1, 16), 2.0**-149, np.float32)  # 2688 / amax overflows float32
    assert (
        float(emu.quantize_activations(tiny, deviations=["ct_nonfinite_global_one"]).global_scale)
        == 1.0
    )
    assert float(emu.quantize_activations(tiny).global_scale) == 1.0  # the spec's 1.0 for 0
    small = np.full((1, 16), 1e-37, np.float32)  # 2688 / 1e-37 overflows; amax / 2688 does not
    assert (
        float(emu.quantize_activations(small, deviations=["ct_nonfinite_global_one"]).global_scale)
        == 1.0
    )
    assert float(reference.quantize_activations(small).global_scale) != 1.0


def _ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ia = a.astype(np.float32).view(np.int32).astype(np.int64)
    ib = b.astype(np.float32).view(np.int32).astype(np.int64)
    ia = np.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
    ib = np.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return np.abs(ia - ib)


def test_scale_times_global_first_is_within_one_ulp_and_moves_some() -> None:
    bound = reg.deviation("scale_times_global_first").bound_value
    moved = total = 0
    for x in _corpus(2):
        p = reference.quantize_activations(x)
        a = emu.dequantize(p, deviations=["scale_times_global_first"])
        b = reference.dequantize(p)
        assert _ulps(a, b).max() <= bound
        moved += int((a != b).sum())
        total += a.size
    assert moved > 0.01 * total  # about 1 in 12 on random data
    # the engines' reproducer: 1.5 x 0.6875 x 0.1
    codes = np.full((1, 8), 0x33, np.uint8)
    one = reference.quantize_activations(np.ones((1, 16), np.float32)).replace(
        codes=codes, scales=np.full((1, 1), 0x33, np.uint8), global_scale=np.float32(0.1)
    )
    spec = np.float32(np.float32(1.5 * 0.6875) * np.float32(0.1))
    assert reference.dequantize(one)[0, 0] == spec
    assert emu.dequantize(one, deviations=["scale_times_global_first"])[0, 0] != spec


def test_bfloat16_decompress_is_one_bfloat16_rounding() -> None:
    bound = reg.deviation("ct_bfloat16_decompress").bound_value
    for x in _corpus(3):
        p = reference.quantize_activations(x)
        ref = reference.dequantize(p).astype(np.float64)
        got = emu.dequantize(p, deviations=["ct_bfloat16_decompress"]).astype(np.float64)
        assert (np.abs(got - ref) <= bound * np.abs(ref)).all()
        assert np.array_equal(
            got, reference.dequantize(p, "bfloat16").astype(np.float64)
        )  # float32 read = the bfloat16 value


@pytest.mark.parametrize("dtype", DTYPES)
def test_ct_encode_global_is_within_its_bound(dtype: type) -> None:
    bound = reg.deviation("ct_encode_global").bound_value
    worst = 0.0
    for seed in range(20):
        x = (np.random.default_rng(seed).standard_normal((4, 64)) * 10.0 ** (seed % 7 - 3)).astype(
            dtype
        )
        ref = float(reference.quantize_activations(x).global_scale)
        got = float(emu.quantize_activations(x, deviations=["ct_encode_global"]).global_scale)
        worst = max(worst, abs(got - ref) / ref)
    assert worst <= bound
    if dtype is not np.float32:
        assert worst > 2.0**-12  # narrow x: the ENCODE global carries x's rounding


@pytest.mark.parametrize("ident", ["ct_zero_scale_eps", "scale_byte_zero", "torchao_scale_floor"])
def test_small_block_deviations_stay_within_their_max_relative_bound(ident: str) -> None:
    bound = reg.deviation(ident).bound_value
    differ = 0
    for x in _corpus(4):
        ref = reference.quantize_activations(x)
        got = emu.quantize_activations(x, deviations=[ident])
        top = 2688.0 * float(ref.global_scale)
        err = np.abs(reference.dequantize(got).astype(np.float64) - reference.dequantize(ref))
        assert err.max() / top <= bound, (ident, err.max() / top)
        differ += int((got.scales != ref.scales).sum())
    assert differ > 0  # the corpus reaches the blocks the deviation changes


def test_scale_floor_bytes_match_the_engines_readings() -> None:
    x = np.zeros((1, 32), np.float32)
    x[0, 16] = 6.0
    g = 1.0
    assert emu.quantize_activations(x, g, deviations=["torchao_scale_floor"]).scales[0, 0] == 0x08
    assert emu.quantize_activations(x, g, deviations=["ct_zero_scale_eps"]).scales[0, 0] == 0x20
    assert emu.quantize_activations(x, g, deviations=["scale_byte_zero"]).scales[0, 0] == 0x00
    assert reference.quantize_activations(x, g).scales[0, 0] == 0x38


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_mlx_float16_encoder_moves_a_scale_by_at_most_one_step(dtype: type) -> None:
    bound = reg.deviation("mlx_float16_encoder").bound_value
    x = np.array([[1.6044921875] + [0.0] * 31], dtype)
    g = np.float32(1000.0 / 2688.0)
    ref = reference.quantize_activations(x, g)
    got = emu.quantize_activations(x, g, deviations=["mlx_float16_encoder"])
    if dtype is np.float16:  # the engines' reproducer: 0x34 by the spec, 0x33 in float16
        assert (ref.scales[0, 0], got.scales[0, 0]) == (0x34, 0x33)
    rng = np.random.default_rng(5)
    for _ in range(10):
        xs = rng.standard_normal((8, 128)).astype(dtype)
        a = reference.quantize_activations(xs).scales.astype(int)
        b = emu.quantize_activations(xs, deviations=["mlx_float16_encoder"]).scales.astype(int)
        assert np.abs(a - b).max() <= bound


def test_negative_zero_code_decodes_to_equal_values() -> None:
    x = np.array([[6.0] + [-0.1] * 31], np.float32)
    got = emu.quantize_activations(x, deviations=["mlx_negative_zero_code"])
    ref = reference.quantize_activations(x)
    assert reference.unpack_codes(ref.codes)[0, 1] == 8
    assert reference.unpack_codes(got.codes)[0, 1] == 0
    assert (reference.dequantize(got) == reference.dequantize(ref)).all()


def test_ggml_no_global_saturates_and_carries_one() -> None:
    x = np.full((1, 64), 10000.0, np.float32)
    got = emu.quantize_activations(x, deviations=["ggml_no_global"])
    assert float(got.global_scale) == 1.0
    assert got.scales[0, 0] == 0x7E
    assert reference.dequantize(got)[0, 0] == 2688.0
    assert reference.dequantize(reference.quantize_activations(x))[0, 0] == pytest.approx(10000.0)


def test_reciprocal_scale_differs_only_with_a_subnormal_global() -> None:
    rng = np.random.default_rng(6)
    x = rng.standard_normal((8, 64)).astype(np.float32)
    ref = reference.quantize_activations(x)
    got = emu.quantize_activations(x, deviations=["torchao_reciprocal_scale"])
    assert np.array_equal(got.codes, ref.codes)
    tiny = (x * np.float32(1e-42 / 3)).astype(np.float32)
    sub = np.float32(2.0**-149)
    a = reference.quantize_activations(tiny, sub)
    b = emu.quantize_activations(tiny, sub, deviations=["torchao_reciprocal_scale"])
    assert not np.array_equal(a.codes, b.codes)


def test_refusals_raise_naming_the_deviation() -> None:
    x = np.ones((2, 32), np.float32)
    with pytest.raises(emu.DeviationRefusal, match="k_multiple_of_64: K = 32"):
        emu.quantize_activations(x, deviations=["k_multiple_of_64"])
    with pytest.raises(emu.DeviationRefusal, match="mlx_k_multiple_of_32: K = 48"):
        emu.quantize_activations(np.ones((2, 48), np.float32), deviations=["mlx_k_multiple_of_32"])
    emu.quantize_activations(x, deviations=["mlx_k_multiple_of_32"])  # K = 32 is taken
    with pytest.raises(emu.DeviationRefusal, match="torchao_no_float16"):
        emu.quantize_activations(x.astype(np.float16), deviations=["torchao_no_float16"])
    p = reference.quantize_activations(x)
    with pytest.raises(emu.DeviationRefusal, match="k_multiple_of_64"):
        emu.dequantize(p, deviations=["k_multiple_of_64"])
    with pytest.raises(ValueError, match="'out_of_range_expert_id' is not emulated here"):
        emu.quantize_activations(x, deviations=["out_of_range_expert_id"])
    with pytest.raises(ValueError, match="'scale_times_global_first' is not emulated here"):
        emu.quantize_activations(x, deviations=["scale_times_global_first"])


def test_scale_bytes_of_every_emulation_are_valid_planes() -> None:
    for x in _corpus(7):
        for ident in sorted(emu.ENCODER_DEVIATIONS):
            try:
                p = emu.quantize_activations(x, deviations=[ident])
            except emu.DeviationRefusal:
                continue
            assert p.scales.max() <= 0x7E, ident
            assert np.isfinite(E4M3_VALUES[p.scales]).all(), ident
            assert np.isfinite(reference.dequantize(p)).all(), ident
