"""The direct transcode: bytes reinterpreted, never a dense matrix, the global as a sidecar
of the right shape, inverse byte for byte; and the dense re-quantize path it replaces."""

from __future__ import annotations

import tracemalloc

import mlx.core as mx
import numpy as np
import pytest
from metal_helpers import realistic_planes, to_np
from nvfp4 import reference
from nvfp4.fusion import fuse, stack_experts
from nvfp4.planes import NVFP4Planes, PlaneError
from nvfp4.testing import random_planes, relative_error
from nvfp4_metal.transcode import prepare, requantize_dense, to_planes, transcode


def test_codes_are_the_checkpoint_bytes_as_le_words() -> None:
    p = random_planes(np.random.default_rng(0), 5, 48)
    w = transcode(p)
    words = np.array(w.weight)
    assert words.dtype == np.uint32
    assert words.shape == (5, 6)
    # element i of a word sits at bits 4i..4i+3; word j of a row holds elements 8j..8j+7
    codes = reference.unpack_codes(p.codes)
    rebuilt = np.zeros((5, 6), np.uint64)
    for i in range(8):
        rebuilt |= codes[:, i::8].astype(np.uint64) << np.uint64(4 * i)
    assert np.array_equal(words, rebuilt.astype(np.uint32))
    assert np.array_equal(np.array(w.scales), p.scales)
    assert w.source == "direct"
    assert w.impl == "native"


@pytest.mark.parametrize(
    ("experts", "partitions", "sidecar_shape"),
    [(None, None, ()), (None, (0, 8, 12, 16), (16,)), (3, None, (3, 1)), (3, (0, 10, 16), (3, 16))],
    ids=["scalar", "partitions", "experts", "experts_partitions"],
)
def test_sidecar_shapes_and_inverse(
    experts: int | None, partitions: tuple[int, ...] | None, sidecar_shape: tuple[int, ...]
) -> None:
    p = random_planes(np.random.default_rng(1), 16, 64, experts=experts, partitions=partitions)
    w = transcode(p)
    assert tuple(w.row_global.shape) == sidecar_shape
    expected = p.row_global()
    got = np.broadcast_to(np.array(w.row_global), expected.shape)
    assert np.array_equal(got, expected)
    back = to_planes(w)
    assert np.array_equal(back.codes, p.codes)
    assert np.array_equal(back.scales, p.scales)
    assert back.partitions == p.partitions
    assert np.array_equal(back.global_scale, p.global_scale)


def test_no_dense_matrix_at_any_point() -> None:
    """Peak memory of the transcode stays near the planes' bytes: a float16 decode of this
    weight alone would be 3.6x them."""
    p = random_planes(np.random.default_rng(2), 1024, 4096)
    planes_bytes = p.codes.nbytes + p.scales.nbytes
    mx.eval(mx.zeros(1))
    mx.clear_cache()
    mx.reset_peak_memory()
    tracemalloc.start()
    w = transcode(p)
    mx.eval(w.weight, w.scales, w.row_global)
    _, numpy_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    mlx_peak = mx.get_peak_memory()
    assert mlx_peak <= 1.5 * planes_bytes, f"MLX peak {mlx_peak} for {planes_bytes} planes bytes"
    assert numpy_peak <= 0.5 * planes_bytes, f"numpy peak {numpy_peak} for {planes_bytes} bytes"


def test_fused_and_stacked_planes_keep_every_global() -> None:
    rng = np.random.default_rng(3)
    q, k, v = (realistic_planes(rng, n, 32, name=f"p{n}") for n in (16, 8, 8))
    qkv = transcode(fuse([q, k, v], "qkv"))
    g = np.array(qkv.row_global)
    assert np.array_equal(g[:16], np.full(16, q.global_scale))
    assert np.array_equal(g[16:24], np.full(8, k.global_scale))
    assert np.array_equal(g[24:], np.full(8, v.global_scale))
    experts = [realistic_planes(rng, 8, 32, name=f"e{i}") for i in range(4)]
    stacked = transcode(stack_experts(experts, "experts"))
    assert np.array_equal(
        np.array(stacked.row_global).reshape(-1), [e.global_scale for e in experts]
    )


def test_prepare_validates_content_first() -> None:
    p = random_planes(np.random.default_rng(4), 8, 32, name="w_bad")
    s = p.scales.copy()
    s[0, 0] = 0x7F
    with pytest.raises(PlaneError, match="w_bad"):
        prepare(NVFP4Planes(p.codes, s, p.global_scale, name="w_bad"))


def test_dense_path_changes_bytes_and_global() -> None:
    """The dense path (decode to float16, mx.quantize again) is what the direct transcode
    avoids: it re-derives block scales and the global, so its decode differs."""
    rng = np.random.default_rng(5)
    p = realistic_planes(rng, 64, 256, name="dense")
    direct = transcode(p)
    dense = requantize_dense(p)
    assert dense.source == "dense"
    d_direct = reference.dequantize(to_planes(direct))
    d_dense = reference.dequantize(to_planes(dense))
    assert np.array_equal(d_direct, reference.dequantize(p))
    # close (same tensor) but not identical
    assert relative_error(to_np(d_dense), d_direct) < 0.2
    assert not np.array_equal(d_dense, d_direct)
