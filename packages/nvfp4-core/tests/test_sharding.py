"""Row / K slicing and tensor-parallel shards: the decode of a shard equals the slice of
the decode exactly; partitions clipped and dropped with their globals; refusals."""

from __future__ import annotations

import numpy as np
import pytest
from nvfp4 import NVFP4Planes, PlaneError, dequantize
from nvfp4.fusion import fuse
from nvfp4.sharding import shard, shard_bounds, slice_k, slice_rows


def random_planes(
    rng: np.random.Generator, shape: tuple[int, ...], *, g: float | None = None
) -> NVFP4Planes:
    *lead, n, k = shape
    codes = rng.integers(0, 256, size=(*lead, n, k // 2), dtype=np.uint8)
    scales = rng.integers(0, 0x7F, size=(*lead, n, k // 16), dtype=np.uint8)
    glob = (
        np.exp2(rng.uniform(-12, 2, size=tuple(lead))).astype(np.float32)
        if g is None
        else np.full(tuple(lead), g, np.float32)
    )
    return NVFP4Planes(codes, scales, glob, name="w")


def fused(experts: int | None = None) -> NVFP4Planes:
    rng = np.random.default_rng(0)
    lead = () if experts is None else (experts,)
    parts = [
        random_planes(rng, (*lead, 8, 128), g=0.5),
        random_planes(rng, (*lead, 4, 128), g=2.0),
        random_planes(rng, (*lead, 6, 128), g=0.125),
    ]
    return fuse(parts, "qkv")  # partitions (0, 8, 12, 18)


@pytest.mark.parametrize("experts", [None, 2])
@pytest.mark.parametrize(("start", "stop"), [(0, 18), (3, 5), (7, 9), (8, 12), (5, 17), (17, 18)])
def test_slice_rows_of_fused_planes(experts: int | None, start: int, stop: int) -> None:
    f = fused(experts)
    s = slice_rows(f, start, stop)
    assert np.array_equal(dequantize(s), dequantize(f)[..., start:stop, :])
    assert np.shares_memory(s.codes, f.codes)
    # partitions: the clipped non-empty ones, each with its own global
    bounds = np.array(f.partitions)
    kept = [i for i in range(3) if min(bounds[i + 1], stop) > max(bounds[i], start)]
    assert s.num_partitions == len(kept) >= 1
    assert s.partitions is not None
    assert s.partitions[0] == 0
    assert s.partitions[-1] == stop - start
    assert np.array_equal(s.global_scale, f.global_scale[..., kept])


def test_slice_rows_of_plain_planes_and_experts() -> None:
    p = random_planes(np.random.default_rng(1), (3, 10, 64))
    s = slice_rows(p, 2, 7)
    assert s.partitions is None
    assert np.array_equal(s.global_scale, p.global_scale)
    assert np.array_equal(dequantize(s), dequantize(p)[:, 2:7])


@pytest.mark.parametrize(("start", "stop"), [(0, 128), (16, 48), (112, 128), (0, 16)])
def test_slice_k(start: int, stop: int) -> None:
    f = fused(2)
    s = slice_k(f, start, stop)
    assert s.k == stop - start
    assert s.partitions == f.partitions
    assert np.array_equal(s.global_scale, f.global_scale)
    assert np.array_equal(dequantize(s), dequantize(f)[..., start:stop])


def test_slice_refusals() -> None:
    f = fused()
    with pytest.raises(
        PlaneError, match=r"K slice bounds: expected multiples of 16.*start=8, stop=32"
    ):
        slice_k(f, 8, 32)
    with pytest.raises(PlaneError, match="start=0, stop=40"):
        slice_k(f, 0, 40)
    with pytest.raises(PlaneError, match=r"K slice range: expected 0 <= start < stop <= 128"):
        slice_k(f, 0, 144)
    with pytest.raises(PlaneError, match=r"row slice range.*<= 18"):
        slice_rows(f, 4, 4)
    with pytest.raises(PlaneError, match="integers"):
        slice_rows(f, 0.0, 4)  # type: ignore[arg-type]


@pytest.mark.parametrize("world", [1, 2, 3, 6])
def test_shard_n_reassembles_exactly(world: int) -> None:
    f = fused()
    full = dequantize(f)
    pieces = [dequantize(shard(f, "n", r, world)) for r in range(world)]
    assert np.array_equal(np.concatenate(pieces, axis=-2), full)
    per = f.n // world
    for r in range(world):
        assert shard_bounds(f, "n", r, world) == (r * per, (r + 1) * per)


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_shard_k_reassembles_exactly(world: int) -> None:
    f = fused(2)
    full = dequantize(f)
    pieces = [dequantize(shard(f, "k", r, world)) for r in range(world)]
    assert np.array_equal(np.concatenate(pieces, axis=-1), full)
    # row-parallel partial sums add up to the unsharded unscaled product
    x = np.random.default_rng(2).standard_normal(f.k)
    y = sum(p[0] @ x[r * (f.k // world) : (r + 1) * (f.k // world)] for r, p in enumerate(pieces))
    assert np.allclose(y, full[0] @ x, rtol=1e-12, atol=1e-12)


def test_shard_refusals() -> None:
    f = fused()  # N = 18, K = 128
    with pytest.raises(
        PlaneError, match=r"N for an even split: expected a multiple of world_size = 4, found 18"
    ):
        shard(f, "n", 0, 4)
    with pytest.raises(
        PlaneError,
        match=r"per-rank K: expected a multiple of 16 \(K = 128, world_size = 16\), found 8",
    ):
        shard(f, "k", 0, 16)
    with pytest.raises(PlaneError, match="K for an even split"):
        shard(f, "k", 0, 3)
    with pytest.raises(PlaneError, match="rank"):
        shard(f, "n", 2, 2)
    with pytest.raises(PlaneError, match="world_size"):
        shard(f, "n", 0, 0)
    with pytest.raises(PlaneError, match="shard axis"):
        shard(f, "m", 0, 1)  # type: ignore[arg-type]
