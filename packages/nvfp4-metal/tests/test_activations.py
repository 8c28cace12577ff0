"""quantize_activations in MLX ops is bit-identical to nvfp4.reference.quantize_activations
(global, every scale byte, every code), ties and edges included."""

from __future__ import annotations

import ml_dtypes
import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from nvfp4 import reference
from nvfp4.planes import NVFP4Planes
from nvfp4.spec import E2M1_BOUNDS, E4M3_VALUES
from nvfp4.testing.properties import draw_activations, reproducible
from nvfp4_metal import MetalBackend, ops


def assert_identical(got: NVFP4Planes, ref: NVFP4Planes, what: str) -> None:
    assert got.global_scale.tobytes() == np.asarray(ref.global_scale, np.float32).tobytes(), (
        f"{what}: global {got.global_scale!r} vs {ref.global_scale!r}"
    )
    bad = np.argwhere(got.scales != ref.scales)
    assert bad.size == 0, f"{what}: {len(bad)} scale bytes differ, first at {tuple(bad[0])}"
    cg, cr = reference.unpack_codes(got.codes), reference.unpack_codes(ref.codes)
    bad = np.argwhere(cg != cr)
    assert bad.size == 0, (
        f"{what}: {len(bad)} codes differ, first at {tuple(bad[0])}: "
        f"{int(cg[tuple(bad[0])])} vs {int(cr[tuple(bad[0])])}"
    )


def ties(rng: np.random.Generator, m: int, k: int) -> np.ndarray:
    """Blocks whose amax is 6 (scale 1.0 at global 1): most elements exact E2M1 ties."""
    pool = np.concatenate([E2M1_BOUNDS, [0.0, -0.0, 0.1, 2.9, 4.5]]).astype(np.float32)
    x = rng.choice(pool, size=(m, k)).astype(np.float32)
    x *= np.where(rng.random((m, k)) < 0.5, -1, 1).astype(np.float32)
    x[:, ::16] = 6.0
    return x


CASES = {
    "ties_static_1": (lambda r: ties(r, 16, 256), 1.0),
    "ties_dynamic": (lambda r: ties(r, 8, 128) * np.float32(448.0), None),
    "normal_m1_k4096": (lambda r: r.standard_normal((1, 4096)).astype(np.float32), None),
    "normal_m33_k272": (lambda r: r.standard_normal((33, 272)).astype(np.float32), None),
    "k16": (lambda r: r.standard_normal((3, 16)).astype(np.float32), None),
    "static_scale": (lambda r: r.standard_normal((8, 512)).astype(np.float32), 0.003),
    "tiny_static_scale_saturates": (lambda r: r.standard_normal((4, 64)).astype(np.float32), 1e-30),
    "rows_1e-30_to_1e30": (
        lambda r: (r.standard_normal((7, 64)) * np.logspace(-30, 30, 7)[:, None]).astype(
            np.float32
        ),
        None,
    ),
    "subnormal_inputs": (lambda r: (r.standard_normal((3, 64)) * 1e-40).astype(np.float32), None),
    "zeros": (lambda r: np.zeros((4, 64), np.float32), None),
    "zero_and_negative_zero_blocks": (
        lambda r: np.where(np.arange(64) < 32, -0.0, r.standard_normal((5, 64))).astype(np.float32),
        None,
    ),
    "float16_input": (lambda r: r.standard_normal((9, 256)).astype(np.float16), None),
    "bfloat16_input": (lambda r: r.standard_normal((9, 256)).astype(ml_dtypes.bfloat16), None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bit_identical(case: str) -> None:
    build, scale = CASES[case]
    x = build(np.random.default_rng(len(case)))
    with np.errstate(over="ignore", under="ignore"):
        ref = reference.quantize_activations(x, scale)
    got = ops.quantize_activations(mx.array(x), scale)
    assert_identical(got, ref, case)


def test_nonfinite_blocks_marked_and_global_ignores_them() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    x[1, 3] = np.nan
    x[2, 40] = np.inf
    x[3, 63] = -np.inf
    got = ops.quantize_activations(mx.array(x))
    assert_identical(got, reference.quantize_activations(x), "non-finite")
    assert got.scales[1, 0] == 0x7F
    assert got.scales[2, 2] == 0x7F
    assert got.scales[3, 3] == 0x7F
    assert np.isnan(E4M3_VALUES[0x7F])


def test_refusals() -> None:
    """Core's verbs refuse before the MLX encoder runs."""
    b = MetalBackend()
    with pytest.raises(ValueError, match="multiple of 16"):
        b.quantize_activations(mx.ones((2, 24)))
    with pytest.raises(ValueError, match=r"\[M, K\]"):
        b.quantize_activations(mx.ones((2, 2, 16)))
    with pytest.raises(ValueError, match="input_scale"):
        b.quantize_activations(mx.ones((2, 16)), 0.0)


_finite = st.floats(width=32, allow_nan=False, allow_infinity=False)
_special = st.sampled_from([0.0, -0.0, 0.25, -0.75, 1.25, 1.75, -3.5, 5.0, 6.0, 1e-30, -1e-45])


@reproducible(max_examples=60)
@given(data=st.data())
def test_bit_identical_property(data: st.DataObject) -> None:
    x = draw_activations(data, st.one_of(_finite, _special))
    scale = data.draw(st.sampled_from([None, None, 1.0, 0.01, 7.5, 1e-20]), label="input_scale")
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        ref = reference.quantize_activations(x, scale)
    what = f"m{x.shape[0]} k{x.shape[1]} s{scale}"
    assert_identical(ops.quantize_activations(mx.array(x), scale), ref, what)
