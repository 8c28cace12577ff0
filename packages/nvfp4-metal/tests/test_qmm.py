"""qmm: MLX's nvfp4 quantized_matmul then the sidecar global, against the float64
reference within spec 1.0's tolerances."""

from __future__ import annotations

import itertools

import mlx.core as mx
import numpy as np
import pytest
from metal_helpers import NP_DTYPES, check_close, realistic_planes, to_np
from nvfp4 import reference
from nvfp4.spec import GLOBAL_AMAX_DIVISOR
from nvfp4.testing import activations
from nvfp4_metal import MetalBackend, ops
from nvfp4_metal.transcode import transcode

SHAPES = [
    (m, k, n) for m in (1, 3, 33) for k, n in ((16, 1), (16, 7), (48, 13), (272, 24), (1024, 129))
]


@pytest.mark.parametrize("dtype", list(NP_DTYPES))
@pytest.mark.parametrize(("m", "k", "n"), SHAPES, ids=[f"M{m}_K{k}_N{n}" for m, k, n in SHAPES])
def test_qmm(m: int, k: int, n: int, dtype: str) -> None:
    rng = np.random.default_rng(m * 10007 + k * 31 + n)
    p = realistic_planes(rng, n, k)
    x = activations(rng, m, k, dtype)
    y = to_np(ops.qmm(mx.array(x), transcode(p)))
    assert y.shape == (m, n)
    assert y.dtype == NP_DTYPES[dtype]
    check_close(y, reference.qmm(x, p, out_dtype=None), "qmm", dtype, f"qmm M{m} K{k} N{n}")


@pytest.mark.parametrize("dtype", list(NP_DTYPES))
@pytest.mark.parametrize("parts", [(0, 64, 80, 96), (0, 7, 16, 17)], ids=["qkv", "uneven"])
def test_qmm_fused_partitions(parts: tuple[int, ...], dtype: str) -> None:
    rng = np.random.default_rng(len(parts) + parts[1])
    p = realistic_planes(rng, parts[-1], 128, partitions=parts)
    assert len(set(p.global_scale.tolist())) == len(parts) - 1
    x = activations(rng, 5, 128, dtype)
    y = to_np(ops.qmm(mx.array(x), transcode(p)))
    ref = reference.qmm(x, p, out_dtype=None)
    check_close(y, ref, "qmm", dtype, f"fused {parts}")
    # each partition on its own is right too (a mixed-up global would show here)
    for a, b in itertools.pairwise(parts):
        check_close(y[:, a:b], ref[:, a:b], "qmm", dtype, f"partition rows {a}..{b}")


def test_qmm_leading_axes_and_out_dtype() -> None:
    rng = np.random.default_rng(7)
    p = realistic_planes(rng, 24, 64)
    x = rng.standard_normal((2, 3, 64)).astype(np.float32)
    b = MetalBackend()
    y = b.qmm(mx.array(x), p, out_dtype="bfloat16")
    assert y.shape == (2, 3, 24)
    assert y.dtype == mx.bfloat16
    ref = reference.qmm(x.reshape(6, 64), p, out_dtype=None).reshape(2, 3, 24)
    check_close(to_np(y), ref, "qmm", "bfloat16", "leading axes")
    # numpy input is accepted (float64 rounded to float32 once, the result widened back)
    y64 = b.qmm(x.astype(np.float64), p)
    assert y64.dtype == np.float64
    y32 = to_np(b.qmm(x, p))
    assert np.array_equal(y64, y32.astype(np.float64))


def test_qmm_refuses_wrong_k_and_experts() -> None:
    rng = np.random.default_rng(8)
    b = MetalBackend()
    w = b.prepare(realistic_planes(rng, 8, 64, name="w_k64"))
    with pytest.raises(ValueError, match="K = 64"):
        b.qmm(mx.ones((2, 48)), w)
    with pytest.raises(ValueError, match="expected a float32"):
        b.qmm(mx.ones((2, 64), dtype=mx.int32), w)
    moe = b.prepare(realistic_planes(rng, 8, 64, experts=2, name="moe"))
    with pytest.raises(ValueError, match="gather_qmm"):
        b.qmm(mx.ones((2, 64)), moe)


def test_compiled_graph_matches_eager_bits() -> None:
    """The compiled graph (quantized matmul, sidecar multiply, cast) gives the same bits as
    the same ops run eagerly: compiling fuses, it does not change the arithmetic."""
    rng = np.random.default_rng(9)
    p = realistic_planes(rng, 40, 256, partitions=(0, 24, 40))
    w = transcode(p)
    x = mx.array(activations(rng, 9, 256, "bfloat16"))
    y = ops.qmm(x, w)
    eager = (
        mx.quantized_matmul(
            x.astype(mx.float32),
            w.weight,
            w.scales,
            transpose=True,
            group_size=16,
            bits=4,
            mode="nvfp4",
        )
        * w.row_global
    ).astype(mx.bfloat16)
    assert np.array_equal(to_np(y).view(np.uint16), to_np(eager).view(np.uint16))


def test_float16_activations_do_not_overflow_before_the_global() -> None:
    """x @ (e2m1 * e4m3) reaches 6 * 448 * sum|x| before the global brings it down: computed
    in float16 it would overflow; the float32 compute keeps it finite."""
    k, n = 1024, 4
    codes = np.full((n, k // 2), 0x77, np.uint8)  # every element +6
    scales = np.full((n, k // 16), 0x7E, np.uint8)  # 448
    from nvfp4.planes import NVFP4Planes

    p = NVFP4Planes(codes, scales, np.float32(1.0 / GLOBAL_AMAX_DIVISOR), name="big")
    x = np.full((1, k), 0.5, np.float16)
    y = to_np(ops.qmm(mx.array(x), transcode(p)))
    assert np.isfinite(y).all()
    check_close(y, reference.qmm(x, p, out_dtype=None), "qmm", "float16", "overflow case")
