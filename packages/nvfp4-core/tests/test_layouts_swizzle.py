"""128x4 scale swizzle: round trips with padding, zero pad bytes, the spec's offset formula,
and an independent check against the reshape/permute form used by vLLM / torchao
(``to_blocked``)."""

from __future__ import annotations

import numpy as np
import pytest
from nvfp4 import PlaneError
from nvfp4.layouts import swizzle_scales, swizzled_size, unswizzle_scales
from nvfp4.spec import swizzle_128x4_offset, swizzled_scale_shape

SHAPES = [(n, kb) for n in (1, 33, 128, 200) for kb in (1, 3, 4, 9)]


def to_blocked(scales: np.ndarray) -> np.ndarray:
    """vLLM / torchao ``to_blocked``, written here independently of the package: pad rows
    to 128 and columns to 4 with zeros, view as (N/128, 4, 32, C/4, 4) and permute to
    (0, 3, 2, 1, 4)."""
    n, kb = scales.shape
    rows, cols = -(-n // 128) * 128, -(-kb // 4) * 4
    padded = np.zeros((rows, cols), np.uint8)
    padded[:n, :kb] = scales
    return padded.reshape(rows // 128, 4, 32, cols // 4, 4).transpose(0, 3, 2, 1, 4).reshape(-1)


def random_scales(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.integers(1, 0x7F, size=shape, dtype=np.uint8)  # nonzero: pads stand out


@pytest.mark.parametrize(("n", "kb"), SHAPES)
def test_round_trip_padding_and_to_blocked(n: int, kb: int) -> None:
    s = random_scales(np.random.default_rng(n * 10 + kb), n, kb)
    buf = swizzle_scales(s)
    rows, cols = swizzled_scale_shape(n, kb)
    assert buf.dtype == np.uint8
    assert buf.shape == (rows * cols,) == (swizzled_size(n, kb),)
    assert np.array_equal(buf, to_blocked(s))
    assert np.count_nonzero(buf) == n * kb  # every pad byte is zero, every scale is placed
    back = unswizzle_scales(buf, n, kb)
    assert back.shape == (n, kb)
    assert np.array_equal(back, s)


@pytest.mark.parametrize(("n", "kb"), [(33, 3), (200, 9), (256, 8)])
def test_matches_the_spec_formula_element_by_element(n: int, kb: int) -> None:
    s = random_scales(np.random.default_rng(5), n, kb)
    buf = swizzle_scales(s)
    rr, cc = np.meshgrid(np.arange(n), np.arange(kb), indexing="ij")
    offsets = swizzle_128x4_offset(rr, cc, kb)
    assert np.array_equal(buf[offsets], s)
    assert len(np.unique(offsets)) == n * kb


def test_expert_stacked() -> None:
    s = random_scales(np.random.default_rng(6), 3, 33, 5)
    buf = swizzle_scales(s)
    assert buf.shape == (3, swizzled_size(33, 5))
    for e in range(3):
        assert np.array_equal(buf[e], to_blocked(s[e]))
    assert np.array_equal(unswizzle_scales(buf, 33, 5), s)


def test_non_contiguous_input() -> None:
    full = random_scales(np.random.default_rng(7), 64, 12)
    view = full[::2, 2:9]
    assert np.array_equal(swizzle_scales(view), to_blocked(np.ascontiguousarray(view)))


def test_refusals() -> None:
    with pytest.raises(PlaneError, match="uint8"):
        swizzle_scales(np.zeros((4, 4), np.float32))
    with pytest.raises(PlaneError, match="non-empty"):
        swizzle_scales(np.zeros((0, 4), np.uint8))
    with pytest.raises(PlaneError, match=r"uint8 \[512\]"):
        unswizzle_scales(np.zeros(511, np.uint8), 1, 1)
    with pytest.raises(PlaneError, match="positive"):
        unswizzle_scales(np.zeros(512, np.uint8), 0, 1)
