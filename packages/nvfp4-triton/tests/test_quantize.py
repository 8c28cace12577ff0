"""Activation quantization: bit-exact to nvfp4.reference.quantize_activations (global,
scale bytes and codes), linear and 128x4-swizzled scales."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from nvfp4 import layouts, reference, spec
from nvfp4.testing import rows_across_magnitudes, zero_blocks
from nvfp4.testing.properties import draw_activations, reproducible
from nvfp4_triton import ops
from nvfp4_triton.config import KernelConfig
from triton_helpers import AMD_LIKE, NVIDIA_LIKE


def _quantize(x: np.ndarray, input_scale, cfg: KernelConfig, swizzled: bool = False):
    xt = (
        torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
        if x.dtype == ml_dtypes.bfloat16
        else torch.from_numpy(x)
    )
    g = ops.activation_global(xt, input_scale)
    codes, scales = ops.quantize_activations(xt, g, cfg, swizzled=swizzled)
    return np.float32(g.item()), codes.numpy(), scales.numpy()


def _check(x: np.ndarray, input_scale, cfg: KernelConfig) -> None:
    ref = reference.quantize_activations(x, input_scale)
    g, codes, scales = _quantize(x, input_scale, cfg)
    assert g.tobytes() == np.float32(ref.global_scale).tobytes()
    np.testing.assert_array_equal(scales, ref.scales)
    np.testing.assert_array_equal(codes, ref.codes)
    _, codes_s, swz = _quantize(x, input_scale, cfg, swizzled=True)
    np.testing.assert_array_equal(codes_s, ref.codes)
    np.testing.assert_array_equal(swz, layouts.swizzle_scales(ref.scales))


def _ties(rng: np.random.Generator, m: int, k: int) -> np.ndarray:
    """Blocks of amax 6 (scale 1.0 at global 1) full of exact E2M1 ties, zeros, -0.0."""
    pool = np.concatenate([spec.E2M1_BOUNDS, [0.0, -0.0, 0.1, 2.9], spec.E2M1_BOUNDS]).astype(
        np.float32
    )
    x = rng.choice(pool, (m, k)).astype(np.float32) * np.where(
        rng.random((m, k)) < 0.5, -1, 1
    ).astype(np.float32)
    x[:, ::16] = 6.0
    return x


CASES = {
    "ties_static": (lambda r: _ties(r, 3, 64), 1.0),
    "normal_dynamic_m1": (lambda r: r.standard_normal((1, 272)).astype(np.float32), None),
    "normal_dynamic_m33": (lambda r: r.standard_normal((33, 80)).astype(np.float32), None),
    "static_scale": (lambda r: r.standard_normal((5, 64)).astype(np.float32), 0.003),
    "rows_1e-3_to_1e3": (lambda r: rows_across_magnitudes(r, 7, 48, -3, 3), None),
    "tiny_scales_subnormal_e4m3": (
        lambda r: (r.standard_normal((4, 64)) * 1e-3).astype(np.float32),
        1.0,
    ),
    "saturating_scales": (lambda r: (r.standard_normal((4, 64)) * 1e4).astype(np.float32), 1e-3),
    "zeros": (lambda r: np.zeros((4, 32), np.float32), None),
    "zero_blocks": (lambda r: zero_blocks(r, 5, 64), None),
    "nonfinite_blocks": (lambda r: _nonfinite(r), None),
    "swizzle_past_128_rows": (lambda r: r.standard_normal((130, 48)).astype(np.float32), None),
    "float16": (lambda r: r.standard_normal((9, 64)).astype(np.float16), None),
    "bfloat16": (lambda r: r.standard_normal((9, 64)).astype(ml_dtypes.bfloat16), None),
}


def _nonfinite(rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal((6, 64)).astype(np.float32)
    x[1, 3], x[4, 40], x[5, 63] = np.nan, np.inf, -np.inf
    return x


@pytest.mark.parametrize("case", list(CASES))
def test_quantize_bit_exact(any_cfg: KernelConfig, case: str) -> None:
    build, scale = CASES[case]
    _check(build(np.random.default_rng(len(case))), scale, any_cfg)


_finite = st.floats(-3.0e4, 3.0e4, width=32, allow_nan=False, allow_infinity=False)
_special = st.sampled_from([0.0, -0.0, 0.25, -0.75, 1.25, 3.5, -5.0, 6.0, 1e-30, -1e-30])


@reproducible(max_examples=25)
@given(data=st.data())
def test_quantize_property(data: st.DataObject) -> None:
    x = draw_activations(data, st.one_of(_finite, _special))
    scale = data.draw(st.sampled_from([None, None, 1.0, 0.01, 7.5]), label="input_scale")
    _check(x, scale, AMD_LIKE if x.shape[0] % 2 else NVIDIA_LIKE)
