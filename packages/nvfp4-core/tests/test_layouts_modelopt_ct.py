"""ModelOpt and compressed-tensors layouts: byte-exact round trips, the reciprocal global
within 1 ulp, refusals, and cross-checks against nvidia-modelopt and compressed-tensors."""

from __future__ import annotations

from typing import Any

import layout_planes
import ml_dtypes
import numpy as np
import pytest
from nvfp4 import NVFP4Planes, PlaneError, dequantize, quantize
from nvfp4.layouts import (
    INPUT_SCALE,
    WEIGHT,
    WEIGHT_SCALE,
    WEIGHT_SCALE_2,
    decode_global,
    encode_global,
    from_compressed_tensors,
    from_modelopt,
    input_global_scale_from_input_scale,
    input_scale_from_input_global_scale,
    to_compressed_tensors,
    to_modelopt,
)
from nvfp4.layouts import compressed_tensors as ct
from nvfp4.spec import GLOBAL_AMAX_DIVISOR


def random_planes(
    rng: np.random.Generator, shape: tuple[int, ...], *, name: str = "w"
) -> NVFP4Planes:
    """Layout planes with globals from 2^-20 to 2^5."""
    return layout_planes.random_planes(rng, shape, name=name, log2_globals=(-20, 5))


def same_bytes(a: NVFP4Planes, b: NVFP4Planes) -> bool:
    return (
        a.codes.dtype == b.codes.dtype == np.uint8
        and np.array_equal(a.codes, b.codes)
        and np.array_equal(a.scales, b.scales)
    )


def ulp_distance(a: Any, b: Any) -> Any:
    """Distance in float32 ulps between positive float32 arrays (their bit patterns are
    ordered like their values)."""
    ia = np.asarray(a, np.float32).view(np.int32).astype(np.int64)
    ib = np.asarray(b, np.float32).view(np.int32).astype(np.int64)
    return np.abs(ia - ib)


# ----------------------------------------------------------------------------- ModelOpt
@pytest.mark.parametrize("shape", [(5, 32), (64, 256), (3, 7, 48)])
def test_modelopt_round_trip_is_byte_exact_and_a_view(shape: tuple[int, ...]) -> None:
    p = random_planes(np.random.default_rng(1), shape)
    t = to_modelopt(p)
    assert set(t) == {WEIGHT, WEIGHT_SCALE, WEIGHT_SCALE_2}
    assert t[WEIGHT].dtype == np.uint8
    assert t[WEIGHT].shape == p.codes.shape
    assert t[WEIGHT_SCALE].dtype == np.dtype(ml_dtypes.float8_e4m3fn)
    assert t[WEIGHT_SCALE].shape == p.scales.shape
    assert np.shares_memory(t[WEIGHT], p.codes)
    assert np.shares_memory(t[WEIGHT_SCALE], p.scales)
    assert t[WEIGHT_SCALE_2].dtype == np.float32
    assert t[WEIGHT_SCALE_2].shape == ((shape[0],) if len(shape) == 3 else ())
    back = from_modelopt(t, name="w")
    assert same_bytes(back, p)
    assert np.array_equal(back.global_scale, p.global_scale)
    assert back.global_scale.shape == p.global_scale.shape
    assert np.array_equal(dequantize(back), dequantize(p))


def test_modelopt_weight_scale_values_match_ml_dtypes() -> None:
    """The float8 view holds the E4M3 values the spec decodes (ml_dtypes as the oracle)."""
    all_bytes = np.arange(0x7F, dtype=np.uint8).reshape(127, 1)
    p = NVFP4Planes(np.zeros((127, 8), np.uint8), all_bytes, np.asarray(1.0, np.float32))
    ws = to_modelopt(p)[WEIGHT_SCALE]
    oracle = all_bytes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    assert np.array_equal(ws.astype(np.float32), oracle)
    assert np.all(np.diff(oracle[:, 0]) > 0)


def test_modelopt_scalar_global_of_experts_becomes_per_expert() -> None:
    p = random_planes(np.random.default_rng(2), (4, 3, 32)).replace(global_scale=np.float32(0.5))
    s2 = to_modelopt(p)[WEIGHT_SCALE_2]
    assert s2.shape == (4,)
    assert np.all(s2 == np.float32(0.5))


def test_from_modelopt_accepts_raw_bytes_and_older_global_dtypes() -> None:
    p = random_planes(np.random.default_rng(3), (6, 64))
    t = to_modelopt(p)
    raw = {WEIGHT: t[WEIGHT], WEIGHT_SCALE: p.scales, WEIGHT_SCALE_2: np.float32(0.375)}
    assert same_bytes(from_modelopt(raw), p)
    for dt in (np.float16, ml_dtypes.bfloat16):
        old = dict(raw, **{WEIGHT_SCALE_2: np.array([0.01171875], dtype=dt)})  # shape (1,)
        got = from_modelopt(old)
        assert got.global_scale.shape == ()
        assert got.global_scale.dtype == np.float32
        assert got.global_scale == np.float32(np.array(0.01171875, dtype=dt).astype(np.float32))
    exact64 = dict(raw, **{WEIGHT_SCALE_2: np.float64(0.25)})
    assert from_modelopt(exact64).global_scale == np.float32(0.25)
    inexact64 = dict(raw, **{WEIGHT_SCALE_2: np.float64(0.1)})
    with pytest.raises(PlaneError, match="weight_scale_2 dtype"):
        from_modelopt(inexact64)


def test_from_modelopt_refusals_name_the_tensor() -> None:
    p = random_planes(np.random.default_rng(4), (4, 32))
    good = to_modelopt(p)
    with pytest.raises(PlaneError, match=r"'layer.q'.*'weight_scale_2'.*missing"):
        from_modelopt({WEIGHT: good[WEIGHT], WEIGHT_SCALE: good[WEIGHT_SCALE]}, name="layer.q")
    with pytest.raises(PlaneError, match="weight dtype: expected uint8, found int8"):
        from_modelopt(dict(good, **{WEIGHT: good[WEIGHT].view(np.int8)}))
    with pytest.raises(PlaneError, match="weight_scale dtype"):
        from_modelopt(dict(good, **{WEIGHT_SCALE: good[WEIGHT_SCALE].astype(np.float32)}))
    with pytest.raises(PlaneError, match="weight_scale_2 shape"):
        from_modelopt(dict(good, **{WEIGHT_SCALE_2: np.ones(2, np.float32)}))
    for bad in (0x7F, 0x80, 0xFF):
        scales = p.scales.copy()
        scales[2, 1] = bad
        with pytest.raises(PlaneError, match=rf"scale byte at \(2, 1\).*0x{bad:02X}"):
            from_modelopt(dict(good, **{WEIGHT_SCALE: scales}))
    for g in (0.0, -1.0, np.inf, np.nan):
        with pytest.raises(PlaneError, match="global_scale"):
            from_modelopt(dict(good, **{WEIGHT_SCALE_2: np.float32(g)}))


def test_to_modelopt_refuses_fused_planes() -> None:
    p = random_planes(np.random.default_rng(5), (6, 32))
    fused = p.replace(partitions=(0, 2, 6), global_scale=np.array([1.0, 2.0], np.float32))
    with pytest.raises(PlaneError, match="unfuse"):
        to_modelopt(fused)
    with pytest.raises(PlaneError, match="unfuse"):
        to_compressed_tensors(fused)


def test_input_scale_name_constant() -> None:
    assert INPUT_SCALE == "input_scale"
    assert (WEIGHT, WEIGHT_SCALE, WEIGHT_SCALE_2) == ("weight", "weight_scale", "weight_scale_2")


# --------------------------------------------------------------------- compressed-tensors
@pytest.mark.parametrize("shape", [(5, 32), (3, 7, 48)])
def test_compressed_tensors_round_trip(shape: tuple[int, ...]) -> None:
    p = random_planes(np.random.default_rng(6), shape)
    t = to_compressed_tensors(p)
    assert set(t) == {ct.WEIGHT_PACKED, ct.WEIGHT_SCALE, ct.WEIGHT_GLOBAL_SCALE}
    assert np.shares_memory(t[ct.WEIGHT_PACKED], p.codes)
    assert t[ct.WEIGHT_SCALE].dtype == np.dtype(ml_dtypes.float8_e4m3fn)
    enc = t[ct.WEIGHT_GLOBAL_SCALE]
    assert enc.dtype == np.float32
    assert enc.shape == ((shape[0],) if len(shape) == 3 else (1,))
    # ENCODE = 1 / decode, correctly rounded (float64 reciprocal, one rounding)
    expected = (1.0 / p.global_scale.astype(np.float64)).astype(np.float32).reshape(enc.shape)
    assert np.array_equal(enc, expected)
    back = from_compressed_tensors(t, name="w")
    assert same_bytes(back, p)
    assert back.global_scale.shape == p.global_scale.shape
    assert np.all(ulp_distance(back.global_scale, p.global_scale) <= 1)


def test_global_reciprocal_round_trip_within_one_ulp(capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(7)
    # log-uniform over most of the normal float32 range, plus every mantissa near 1.0/2.0
    g = np.exp2(rng.uniform(-120, 120, size=200_000)).astype(np.float32)
    near = np.float32(1.0) + np.arange(-4096, 4096, dtype=np.float32) * np.float32(2.0**-23)
    g = np.concatenate([g, near, np.float32(2.0) * near])
    back = decode_global(encode_global(g))
    dist = ulp_distance(back, g)
    exact = int(np.count_nonzero(dist == 0))
    with capsys.disabled():
        print(
            f"\n[ct global round trip] {g.size} globals: {exact} exact "
            f"({100.0 * exact / g.size:.2f}%), {g.size - exact} off by 1 ulp, max {dist.max()}"
        )
    assert dist.max() <= 1
    assert exact > g.size // 2  # most come back exactly
    # and encode -> decode -> encode too
    enc = np.exp2(rng.uniform(-120, 120, size=50_000)).astype(np.float32)
    assert ulp_distance(encode_global(decode_global(enc)), enc).max() <= 1


def test_reciprocal_refusals() -> None:
    for bad in (0.0, -2.0, np.inf, np.nan):
        with pytest.raises(PlaneError, match="finite and > 0"):
            encode_global(np.float32(bad))
    tiny = np.float32(1e-40)  # subnormal: its reciprocal overflows float32
    with pytest.raises(PlaneError, match="normal float32"):
        encode_global(tiny)
    with pytest.raises(PlaneError, match="normal float32"):
        decode_global(np.float32(3e38))  # reciprocal would be subnormal


def test_input_scale_helpers() -> None:
    x = np.float32(12.0 / GLOBAL_AMAX_DIVISOR)
    ig = input_global_scale_from_input_scale(x)
    assert ig.shape == (1,)
    assert ig.dtype == np.float32
    assert ig[0] == np.float32(1.0 / np.float64(x))
    back = input_scale_from_input_global_scale(ig)
    assert back.shape == ()
    assert ulp_distance(back, x) <= 1
    # the anchors' worked example: amax 12 -> decode 1/224 -> encode 224 (within 1 ulp: 1/224
    # is not a float32, so its stored value's reciprocal is 223.99998)
    enc = input_global_scale_from_input_scale(np.float32(1.0 / 224.0))
    assert ulp_distance(enc, np.float32(224.0)) <= 1


def test_from_compressed_tensors_refusals() -> None:
    p = random_planes(np.random.default_rng(8), (4, 32))
    t = to_compressed_tensors(p)
    with pytest.raises(PlaneError, match=r"'weight_packed'.*missing"):
        from_compressed_tensors({k: v for k, v in t.items() if k != ct.WEIGHT_PACKED}, "m.k")
    with pytest.raises(PlaneError, match="finite and > 0"):
        from_compressed_tensors(dict(t, **{ct.WEIGHT_GLOBAL_SCALE: np.zeros(1, np.float32)}))
    with pytest.raises(PlaneError, match="weight_global_scale shape"):
        from_compressed_tensors(dict(t, **{ct.WEIGHT_GLOBAL_SCALE: np.ones((1, 1), np.float32)}))


# ---------------------------------------------------------------------------- oracles
def test_modelopt_quantizer_output_loads_and_decodes_like_modelopt() -> None:
    """nvidia-modelopt quantizes; from_modelopt reads its tensors; our exact decode equals
    ModelOpt's own dequantize, and to_modelopt gives the very same bytes back."""
    torch = pytest.importorskip("torch")
    nvfp4_tensor = pytest.importorskip("modelopt.torch.quantization.qtensor.nvfp4_tensor")
    rng = np.random.default_rng(9)
    w = (rng.standard_normal((48, 128)) * 0.05).astype(np.float32)
    qt, ws, ws2 = nvfp4_tensor.NVFP4QTensor.quantize(torch.from_numpy(w), 16)
    tensors = {
        WEIGHT: qt._quantized_data.numpy(),
        WEIGHT_SCALE: ws.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn),
        WEIGHT_SCALE_2: ws2.numpy(),
    }
    p = from_modelopt(tensors, name="mo")
    theirs = qt.dequantize(dtype=torch.float32, scale=ws, double_scale=ws2, block_sizes={-1: 16})
    assert np.array_equal(dequantize(p), theirs.numpy())
    again = to_modelopt(p)
    assert np.array_equal(again[WEIGHT], tensors[WEIGHT])
    assert np.array_equal(again[WEIGHT_SCALE].view(np.uint8), tensors[WEIGHT_SCALE].view(np.uint8))
    assert again[WEIGHT_SCALE_2] == tensors[WEIGHT_SCALE_2]
    assert same_bytes(p, quantize(w))  # and the reference encoder agrees


def test_compressed_tensors_converter_agrees_with_ours() -> None:
    """compressed-tensors' own ModelOpt -> CT converter gives exactly our CT tensors, and
    its fp4 unpacker reads our weight_packed nibbles as our decoder does."""
    torch = pytest.importorskip("torch")
    conv = pytest.importorskip("compressed_tensors.entrypoints.convert.converters.modelopt_nvfp4")
    helpers = pytest.importorskip("compressed_tensors.compressors.nvfp4.helpers")
    rng = np.random.default_rng(10)
    p = random_planes(rng, (16, 64)).replace(global_scale=np.float32(0.0123))
    mo = to_modelopt(p)
    src = {
        "layer.weight": torch.from_numpy(mo[WEIGHT].copy()),
        "layer.weight_scale": torch.from_numpy(p.scales.copy()).view(torch.float8_e4m3fn),
        "layer.weight_scale_2": torch.tensor(float(mo[WEIGHT_SCALE_2]), dtype=torch.float32),
    }
    out = conv.ModelOptNvfp4Converter(targets=["re:.*"]).process(src)
    theirs = {
        ct.WEIGHT_PACKED: out["layer.weight_packed"].numpy(),
        ct.WEIGHT_SCALE: out["layer.weight_scale"].view(torch.uint8).numpy(),
        ct.WEIGHT_GLOBAL_SCALE: out["layer.weight_global_scale"].numpy().reshape(-1),
    }
    ours = to_compressed_tensors(p)
    assert np.array_equal(ours[ct.WEIGHT_PACKED], theirs[ct.WEIGHT_PACKED])
    assert np.array_equal(ours[ct.WEIGHT_SCALE].view(np.uint8), theirs[ct.WEIGHT_SCALE])
    assert np.array_equal(ours[ct.WEIGHT_GLOBAL_SCALE], theirs[ct.WEIGHT_GLOBAL_SCALE])
    back = from_compressed_tensors(theirs, name="ct")
    assert same_bytes(back, p)
    assert ulp_distance(back.global_scale, p.global_scale) <= 1

    e2m1 = helpers.unpack_fp4_from_uint8(
        torch.from_numpy(ours[ct.WEIGHT_PACKED].copy()), 16, 64, dtype=torch.float32
    ).numpy()
    block = np.repeat(p.scales.view(ml_dtypes.float8_e4m3fn).astype(np.float32), 16, axis=-1)
    unscaled = p.replace(global_scale=np.float32(1.0))
    assert np.array_equal(e2m1 * block, dequantize(unscaled))
