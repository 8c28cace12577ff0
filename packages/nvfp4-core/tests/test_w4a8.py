"""W4A8 (spec 1.1, "W4A8"): the reference's int8 and FP8 activation encoders against
implementations nobody here wrote (gguf-py's Q8_0, ml_dtypes' float8_e4m3fn), its matmuls
against a direct integer computation of ggml's ``ggml_vec_dot_nvfp4_q8_0``, the activation
planes' validation and the verbs' checks."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt
import nvfp4
import pytest
from nvfp4 import reference as ref
from nvfp4.activations import FP8Activations, Q8Activations
from nvfp4.planes import NVFP4Planes, PlaneError
from nvfp4.spec import E2M1_VALUES, E4M3_VALUES
from nvfp4.testing import unit_scale_planes

F32 = npt.NDArray[np.float32]


def _corpus() -> list[F32]:
    """Random float32 activations over many magnitudes, exact halves, zeros and bfloat16 /
    float16-valued data (where ties are frequent)."""
    rng = np.random.default_rng(2026)
    out = [
        (rng.standard_normal((256, 1024)) * np.exp(rng.normal(0, 3, size=(256, 1)))).astype(
            np.float32
        ),
        rng.standard_t(3, size=(64, 4096)).astype(np.float32),
        rng.standard_normal((64, 1024)).astype(ml_dtypes.bfloat16).astype(np.float32),
        rng.standard_normal((64, 1024)).astype(np.float16).astype(np.float32),
        np.zeros((2, 64), np.float32),
    ]
    halves = (rng.integers(-126, 126, size=(16, 256)) + 0.5).astype(np.float32)
    halves[:, ::32] = 127.0
    out.append(halves)
    return out


def test_q8_matches_gguf_py_bit_for_bit() -> None:
    """gguf-py's Q8_0 (``gguf.quants.Q8_0``, a port of ggml's ``quantize_row_q8_0_ref``):
    d bytes and codes identical on every block, exact halves included (both round half
    away from zero)."""
    quants = pytest.importorskip("gguf.quants")
    blocks = disagreements = 0
    for x in _corpus():
        mine = ref.quantize_activations_q8(x)
        raw = quants.Q8_0.quantize_blocks(x.reshape(-1, 32))  # [blocks, 2 + 32] bytes
        d = raw[:, :2].copy().view(np.float16).reshape(mine.d.shape)
        codes = raw[:, 2:].copy().view(np.int8).reshape(mine.codes.shape)
        assert (d.view(np.uint16) == mine.d.view(np.uint16)).all()
        disagreements += int(np.count_nonzero(codes != mine.codes))
        blocks += d.size
    assert blocks > 10_000
    assert disagreements == 0, f"{disagreements} codes differ from gguf-py in {blocks} blocks"


def test_q8_rules() -> None:
    x = np.zeros((1, 64), np.float32)
    x[0, 0] = 127.0  # d = 1, id = 1: codes are round(x)
    x[0, 1:6] = [0.5, -0.5, 1.5, -2.5, 126.5]
    x[0, 32] = 1e9  # d = 1e9 / 127 overflows float16
    x[0, 33] = 1.0
    q = ref.quantize_activations_q8(x)
    assert q.d[0, 0] == 1.0
    assert q.codes[0, :6].tolist() == [127, 1, -1, 2, -3, 127]  # half away from zero
    assert np.isinf(q.d[0, 1])
    assert q.codes[0, 32] == 127
    assert q.codes[0, 33] == 0
    x[0, 40] = np.nan
    q = ref.quantize_activations_q8(x)
    assert np.isnan(q.d[0, 1])
    assert (q.codes[0, 32:] == 0).all()
    assert q.d[0, 0] == 1.0


def test_fp8_matches_ml_dtypes() -> None:
    """``e4m3(x / input_scale)``: equal to ml_dtypes' float8_e4m3fn cast (RNE) of the
    float32 quotient clamped to +-448, on every element (subnormals and ties included)."""
    for x in _corpus():
        for scale in (None, 0.01, 1.0):
            mine = ref.quantize_activations_fp8(x, scale)
            s = np.float32(mine.input_scale)
            v = np.clip((x / s).astype(np.float32), -448, 448)
            theirs = v.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
            assert (theirs == mine.codes).all()
    ties = (np.arange(1, 2048, 2, dtype=np.float32) / 2**10).reshape(2, -1)  # below and on grid
    mine = ref.quantize_activations_fp8(ties, 1.0)
    assert (mine.codes == ties.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)).all()


def test_fp8_scale_and_nonfinite() -> None:
    x = np.array([[1.0, -896.0, np.nan, np.inf] + [0.0] * 12], np.float32)
    q = ref.quantize_activations_fp8(x)
    assert np.float32(q.input_scale) == np.float32(896.0) / np.float32(448.0)
    assert q.codes[0, 2] == q.codes[0, 3] == 0x7F
    q = ref.quantize_activations_fp8(x, 0.5)  # saturates: 1792 -> 448
    assert E4M3_VALUES[q.codes[0, 1] & 0x7F] == 448.0
    assert q.codes[0, 1] & 0x80
    assert np.float32(ref.quantize_activations_fp8(np.zeros((1, 16), np.float32)).input_scale) == 1


def _ggml_integer(x: F32, w: NVFP4Planes) -> npt.NDArray[np.float64]:
    """ggml's ``ggml_vec_dot_nvfp4_q8_0`` written with integers: per 16-block the int sum of
    ``2 * e2m1`` times the int8 codes, times ``e4m3 / 2`` and ``d`` (exact in float64)."""
    xq = ref.quantize_activations_q8(x)
    m, k = x.shape
    w2 = (2 * E2M1_VALUES[ref.unpack_codes(w.codes)]).astype(np.int64).reshape(w.n, k // 16, 16)
    qx = xq.codes.astype(np.int64).reshape(m, k // 16, 16)
    isum = np.einsum("mbt,nbt->mnb", qx, w2)
    assert np.abs(isum).max() <= 12 * 127 * 16
    coef = np.repeat(xq.d.astype(np.float64), 2, axis=1)[:, None, :] * (
        E4M3_VALUES[w.scales].astype(np.float64) / 2
    )
    out: npt.NDArray[np.float64] = (isum * coef).sum(axis=-1) * w.row_global()
    return out


def test_qmm_w4a8_is_the_integer_product() -> None:
    rng = np.random.default_rng(7)
    w = ref.quantize(rng.standard_normal((13, 256)).astype(np.float32))
    x = rng.standard_normal((5, 256)).astype(np.float32)
    got = ref.qmm_w4a8(x, w, out_dtype=None)
    np.testing.assert_allclose(got, _ggml_integer(x, w), rtol=1e-14, atol=0)
    err = float(np.abs(got - ref.qmm(x, w, out_dtype=None)).max() / np.abs(got).max())
    assert 0 < err < 0.05  # the activation quantization error: present and small


def _all_ones(n: int, k: int, *, negative_second_block: bool = False) -> NVFP4Planes:
    """Weights of 1.0 (code 2, scale byte 0x38, global 1); -1.0 (code 10) in the second
    16-element block of every row when asked."""
    codes = np.full((n, k), 2, np.uint8)
    if negative_second_block:
        codes[:, 16:32] = 10
    return unit_scale_planes(codes)


def test_an_infinite_d_follows_the_spec_terms() -> None:
    """A finite block past 127 x 65504 has d = inf (float16). The spec's terms are
    ``isum_j * (e4m3 / 2) * d`` per 16-element weight block: both blocks' sums positive
    give +inf (per element, the codes that round to 0 would make 0 * inf = NaN); opposite
    signs give NaN, as does a block whose sum is 0; a NaN block stays NaN."""
    x = np.ones((4, 32), np.float32)
    x[:, ::2] = 1e10  # d = 1e10 / 127: inf in float16; the 1.0 elements get code 0
    x[2, 16:] = 0.0  # the second weight block's integer sum is 0
    x[3, 5] = np.nan
    q = ref.quantize_activations_q8(x)
    assert np.isinf(q.d[:3]).all()
    assert (q.codes[0, 1::2] == 0).all()
    y = ref.qmm_w4a8(x, _all_ones(2, 32), out_dtype=None)
    assert (y[0] == np.inf).all()
    assert (y[1] == np.inf).all()
    assert np.isnan(y[2]).all()  # 0 * inf in the second block's term
    assert np.isnan(y[3]).all()
    mixed = ref.qmm_w4a8(x[:1], _all_ones(2, 32, negative_second_block=True), out_dtype=None)
    assert np.isnan(mixed).all()  # +inf and -inf terms
    # rows with a finite d are the exact product, as before
    z = np.linspace(-1, 1, 64, dtype=np.float32)[None, :]
    w = _all_ones(3, 64)
    np.testing.assert_array_equal(
        ref.qmm_w4a8(z, w, out_dtype=None),
        ref.quantize_activations_q8(z).decoded()
        @ ref.dequantize(w, "float32").T.astype(np.float64),
    )


def test_gather_qmm_w4a8_rows_and_globals() -> None:
    rng = np.random.default_rng(8)
    w = ref.quantize(rng.standard_normal((3, 7, 64)).astype(np.float32) * [[[1]], [[10]], [[100]]])
    x = rng.standard_normal((5, 64)).astype(np.float32)
    x[1] = np.nan
    ids = np.array([2, 3, 0, 1, -1])
    y = ref.gather_qmm_w4a8(x, w, ids, out_dtype=None)
    assert (y[[1, 4]] == 0).all()
    for r, e in ((0, 2), (2, 0), (3, 1)):
        we = NVFP4Planes(w.codes[e], w.scales[e], w.global_scale[e])
        np.testing.assert_array_equal(y[r], ref.qmm_w4a8(x[r : r + 1], we, out_dtype=None)[0])


def test_qmm_w4a8_fp8_product() -> None:
    rng = np.random.default_rng(9)
    w = ref.quantize(rng.standard_normal((9, 128)).astype(np.float32))
    x = rng.standard_normal((4, 128)).astype(np.float32)
    q = ref.quantize_activations_fp8(x, 0.01)
    want = (
        E4M3_VALUES[q.codes].astype(np.float64) @ ref.dequantize_unscaled(w).T.astype(np.float64)
    ) * (np.float64(np.float32(0.01)) * np.float64(np.float32(w.global_scale)))
    got = ref.qmm_w4a8_fp8(x, w, input_scale=0.01, out_dtype=None)
    np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: Q8Activations(np.zeros((2, 48), np.int8), np.zeros((2, 1), np.float16)), "K"),
        (lambda: Q8Activations(np.zeros((2, 64), np.int16), np.zeros((2, 2), np.float16)), "int8"),
        (
            lambda: Q8Activations(np.zeros((2, 64), np.int8), np.zeros((2, 3), np.float16)),
            "d shape",
        ),
        (
            lambda: Q8Activations(np.zeros((2, 64), np.int8), np.zeros((2, 2), np.float32)),
            "float16",
        ),
        (lambda: FP8Activations(np.zeros((2, 16), np.uint8), np.float32(0.0)), "input_scale"),
        (lambda: FP8Activations(np.zeros((2, 16), np.uint8), np.float32(np.inf)), "input_scale"),
        (lambda: FP8Activations(np.zeros((16,), np.uint8), np.float32(1.0)), "rank"),
    ],
)
def test_activation_planes_are_validated(build: Any, match: str) -> None:
    with pytest.raises(PlaneError, match=match):
        build()


def test_verbs_check_k_and_capability() -> None:
    rng = np.random.default_rng(10)
    w48 = ref.quantize(rng.standard_normal((4, 48)).astype(np.float32), name="w48")
    with pytest.raises(ValueError, match="multiple of 32"):
        nvfp4.qmm_w4a8(np.ones((1, 48), np.float32), w48)
    with pytest.raises(ValueError, match="multiple of 32"):
        nvfp4.get_backend("reference").quantize_activations_q8(np.ones((1, 48), np.float32))
    with pytest.raises(ValueError, match="input_scale"):
        nvfp4.qmm_w4a8_fp8(np.ones((1, 48), np.float32), w48, input_scale=-1.0)
    w = ref.quantize(rng.standard_normal((4, 64)).astype(np.float32))
    x = rng.standard_normal((2, 3, 64)).astype(np.float32)
    y = nvfp4.qmm_w4a8(x, w)
    assert y.shape == (2, 3, 4)
    assert y.dtype == np.float32
    np.testing.assert_array_equal(
        y.reshape(6, 4), ref.qmm_w4a8(x.reshape(6, 64), w).astype(np.float32)
    )
    assert nvfp4.qmm_w4a8_fp8(x, w, out_dtype="bfloat16").dtype == ml_dtypes.bfloat16


def test_undeclared_w4a8_is_not_run() -> None:
    from dataclasses import replace

    from nvfp4.reference_backend import ReferenceKernels

    kernels = ReferenceKernels()
    kernels.info = replace(kernels.info, capabilities=kernels.info.capabilities - {"w4a8"})
    backend = nvfp4.Frontend(kernels)
    assert not backend.has("qmm_w4a8")
    assert backend.has("qmm_w4a8_fp8")
    w = backend.prepare(ref.quantize(np.ones((2, 32), np.float32)))
    with pytest.raises(NotImplementedError, match="'w4a8' capability"):
        backend.qmm_w4a8(np.ones((1, 32), np.float32), w)
