"""Cutting planes by a shard plan: codes and scales from the same blocks, zero padding that
decodes and multiplies to exactly 0, views without padding, fused q/k/v and gate/up per
partition, experts with their globals, 128x4 swizzled scales (unswizzle, cut, reswizzle),
and reassembly bit-identical to the source, over many shapes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nvfp4 import NVFP4Planes, PlaneError, dequantize
from nvfp4.fusion import fuse
from nvfp4.layouts.swizzle import swizzle_scales
from nvfp4.reference import qmm
from nvfp4.shard_plan import expert_plan, head_plan, paired_plan, shard_plan
from nvfp4.shard_planes import (
    check_padding,
    pad_shard,
    reassemble,
    reassemble_fused,
    reassemble_swizzled_scales,
    shard_fused,
    shard_planes,
    shard_swizzled_scales,
)


def planes(seed: int, shape: tuple[int, ...], name: str = "w") -> NVFP4Planes:
    rng = np.random.default_rng(seed)
    *lead, n, k = shape
    codes = rng.integers(0, 256, size=(*lead, n, k // 2), dtype=np.uint8)
    scales = rng.integers(1, 0x7F, size=(*lead, n, k // 16), dtype=np.uint8)
    g = np.exp2(rng.uniform(-10, 0, size=tuple(lead))).astype(np.float32)
    return NVFP4Planes(codes, scales, g, name=name)


def same_bits(a: NVFP4Planes, b: NVFP4Planes) -> bool:
    return (
        np.array_equal(a.codes, b.codes)
        and np.array_equal(a.scales, b.scales)
        and a.global_scale.tobytes() == b.global_scale.tobytes()
        and a.partitions == b.partitions
    )


def test_nemotron_down_proj_1856_at_tp8() -> None:
    w = planes(0, (24, 1856), "experts.0.down_proj")  # K = 1,856: the row-parallel layer
    plan = shard_plan(1856, 8, dim="k", name=w.name)
    shards = [shard_planes(w, plan, r) for r in range(8)]
    assert [s.scales.shape[-1] for s in shards] == [15] * 4 + [14] * 4
    assert [s.codes.shape[-1] for s in shards] == [120] * 4 + [112] * 4
    assert all(np.shares_memory(s.codes, w.codes) for s in shards)  # views, no padding
    full = dequantize(w)
    for s, r in zip(shards, plan, strict=True):
        assert np.array_equal(dequantize(s), full[:, r.start : r.stop])
    assert same_bits(reassemble(shards, plan), w)
    # the row-parallel partial sums add up to the unsharded product (float64 reference)
    x = np.random.default_rng(1).standard_normal((3, 1856)).astype(np.float32)
    parts = [
        qmm(x[:, r.start : r.stop], s, out_dtype=None) for s, r in zip(shards, plan, strict=True)
    ]
    np.testing.assert_allclose(sum(parts), qmm(x, w, out_dtype=None), rtol=1e-12, atol=1e-12)


def test_padded_k_shard_contributes_exactly_zero() -> None:
    w = planes(2, (5, 1856))
    plan = shard_plan(1856, 8, dim="k", align=8)  # the last rank holds 64 values + 64 padding
    last = shard_planes(w, plan, 7)
    assert last.k == 128
    assert plan[7].padding == 64
    assert not np.any(last.codes[:, 32:])
    assert not np.any(last.scales[:, 4:])
    assert not np.any(dequantize(last)[:, 64:])
    check_padding(last, plan, 7)
    # whatever the activations hold in the padded columns, the product is unchanged
    x = np.random.default_rng(3).standard_normal((4, 128)) * 1e6
    unpadded = shard_planes(w, shard_plan(1856, 29, dim="k"), 28)  # the same 64 values
    assert np.array_equal(unpadded.codes, last.codes[:, :32])
    assert np.array_equal(qmm(x, last, out_dtype=None), qmm(x[:, :64], unpadded, out_dtype=None))
    assert same_bits(reassemble([shard_planes(w, plan, r) for r in range(8)], plan), w)


def test_padding_that_is_not_zero_is_refused() -> None:
    w = planes(4, (5, 1856))
    plan = shard_plan(1856, 8, dim="k", align=8)
    shards = [shard_planes(w, plan, r) for r in range(8)]
    bad = shards[7].scales.copy()
    bad[2, 6] = 0x38
    shards[7] = shards[7].replace(scales=bad)
    with pytest.raises(PlaneError, match=r"rank 7 padding scales .*expected 0x00, found 0x38"):
        reassemble(shards, plan)


def test_padded_rows_are_zero_rows() -> None:
    w = planes(5, (100, 64))
    plan = shard_plan(100, 3, dim="n", align=16)
    last = shard_planes(w, plan, 2)
    assert last.n == 32
    assert not np.any(dequantize(last)[20:])
    assert np.array_equal(dequantize(last)[:20], dequantize(w)[80:])
    assert same_bits(reassemble([shard_planes(w, plan, r) for r in range(3)], plan), w)


def test_fused_gate_up_takes_the_down_projection_split() -> None:
    # Nemotron-3-Nano expert MLP at TP8: gate/up N = 1,856 each (fused), down K = 1,856
    k = 64
    gate, up = planes(6, (1856, k), "gate"), planes(7, (1856, k), "up")
    gate_up = fuse([gate, up], "gate_up")
    down_k = shard_plan(1856, 8, dim="k", name="down")
    col = paired_plan(down_k)
    shards = [shard_fused(gate_up, [col, col], r) for r in range(8)]
    for r, s in enumerate(shards):
        size = down_k[r].size
        assert s.partitions == (0, size, 2 * size)
        assert np.array_equal(s.global_scale, gate_up.global_scale)
        assert np.array_equal(
            dequantize(s)[:size], dequantize(gate)[down_k[r].start : down_k[r].stop]
        )
        assert np.array_equal(
            dequantize(s)[size:], dequantize(up)[down_k[r].start : down_k[r].stop]
        )
    assert same_bits(reassemble_fused(shards, [col, col]), gate_up)
    rows = shard_plan(2 * 1856, 8, dim="n", name="rows")  # one row range of the fused tensor
    with pytest.raises(
        PlaneError,
        match=r"tensor 'gate_up': rows of a fused tensor \(partitions \(0, 1856, 3712\)\) split "
        r"by one plan 'rows': expected one plan a partition",
    ):
        shard_planes(gate_up, rows, 0)
    piece = gate_up.replace(
        codes=gate_up.codes[:464], scales=gate_up.scales[:464], partitions=(0, 232, 464)
    )
    with pytest.raises(PlaneError, match="never split as one range of rows"):
        pad_shard(piece, rows, 0)


def test_fused_qkv_follows_the_head_plan_at_tp2() -> None:
    # SmolLM2-135M: 9 heads, 3 KV heads, head_dim 64, hidden 576
    h = head_plan(9, 3, 64, 2)
    q, kk, v = planes(8, (576, 576), "q"), planes(9, (192, 576), "k"), planes(10, (192, 576), "v")
    qkv = fuse([q, kk, v], "qkv")
    kv_plan = h.kv_rows_plan()
    plans = [h.q_rows(), kv_plan, kv_plan]
    shards = [shard_fused(qkv, plans, r) for r in range(2)]
    assert [s.partitions for s in shards] == [(0, 384, 512, 640), (0, 192, 256, 320)]
    assert np.array_equal(dequantize(shards[1])[:192], dequantize(q)[384:])
    assert np.array_equal(dequantize(shards[1])[192:256], dequantize(kk)[128:])
    assert same_bits(reassemble_fused(shards, plans), qkv)


def test_experts_travel_with_their_globals() -> None:
    w = planes(11, (10, 8, 32))
    plan = expert_plan(10, 3)
    shards = [shard_planes(w, plan, r) for r in range(3)]
    assert [s.num_experts for s in shards] == [4, 3, 3]
    assert np.array_equal(shards[1].global_scale, w.global_scale[4:7])
    assert np.array_equal(dequantize(shards[2]), dequantize(w)[7:])
    assert same_bits(reassemble(shards, plan), w)


@pytest.mark.parametrize(
    ("n", "k", "dim", "world", "align"),
    [
        (1856, 2880, "n", 8, 1),  # Nemotron gate/up rows; hidden 2,880 (not a multiple of 128)
        (2880, 1856, "k", 8, 4),  # down_proj K at TP8 in 64-value units (4 scale columns)
        (576, 1536, "k", 3, 1),  # SmolLM2 down_proj
        (160, 640, "k", 8, 4),  # the 640-wide expert, kernel alignment 64
        (300, 1856, "k", 8, 8),  # a padded last rank
    ],
)
def test_swizzled_scales_are_unswizzled_cut_and_reswizzled(n, k, dim, world, align) -> None:
    w = planes(12, (n, k))
    buf = swizzle_scales(w.scales)
    plan = shard_plan(n if dim == "n" else k, world, dim=dim, align=align)
    bufs = [shard_swizzled_scales(buf, n, k // 16, plan, r) for r in range(world)]
    for r, b in enumerate(bufs):
        assert np.array_equal(b, swizzle_scales(shard_planes(w, plan, r).scales))
    assert np.array_equal(reassemble_swizzled_scales(bufs, n, k // 16, plan), buf)


def test_expert_stacked_swizzled_scales() -> None:
    w = planes(13, (3, 40, 640))
    buf = swizzle_scales(w.scales)
    plan = shard_plan(640, 8, dim="k", align=4)
    bufs = [shard_swizzled_scales(buf, 40, 40, plan, r) for r in range(8)]
    assert bufs[0].shape[0] == 3
    assert np.array_equal(reassemble_swizzled_scales(bufs, 40, 40, plan), buf)


def test_a_plan_for_another_size_is_refused() -> None:
    w = planes(14, (8, 64))
    with pytest.raises(
        PlaneError, match=r"tensor 'w': k size for plan 'x': expected 128, found 64"
    ):
        shard_planes(w, shard_plan(128, 2, dim="k", name="x"), 0)
    with pytest.raises(PlaneError, match="no expert axis"):
        shard_planes(w, expert_plan(4, 2), 0)


def test_a_rank_piece_of_another_size_is_refused() -> None:
    """pad_shard checks the piece a loader read against the rank's range, by the same rule."""
    plan = shard_plan(64, 2, dim="n", name="x")
    with pytest.raises(
        PlaneError,
        match=r"tensor 'w': rank 1 n size before padding \(plan 'x'\): expected 32, found 8",
    ):
        pad_shard(planes(15, (8, 64)), plan, 1)
    with pytest.raises(PlaneError, match=r"rank 0 experts size .*no expert axis"):
        pad_shard(planes(16, (8, 64)), expert_plan(4, 2), 0)


@settings(max_examples=150, deadline=None)
@given(
    experts=st.sampled_from([None, 1, 3]),
    n=st.integers(1, 70),
    blocks=st.integers(1, 40),
    world=st.integers(1, 8),
    align=st.integers(1, 4),
    dim=st.sampled_from(["n", "k"]),
    seed=st.integers(0, 2**16),
)
def test_shards_decode_to_the_slices_and_reassemble_exactly(
    experts, n, blocks, world, align, dim, seed
) -> None:
    k = blocks * 16
    lead = () if experts is None else (experts,)
    w = planes(seed, (*lead, n, k))
    size = n if dim == "n" else k
    if -(-size // (align * (16 if dim == "k" else 1))) < world:
        return  # fewer units than ranks: refused (test_shard_plan)
    plan = shard_plan(size, world, dim=dim, align=align)
    shards = [shard_planes(w, plan, r) for r in range(world)]
    full = dequantize(w)
    for s, r in zip(shards, plan, strict=True):
        d = dequantize(s)
        if dim == "n":
            assert np.array_equal(d[..., : r.size, :], full[..., r.start : r.stop, :])
            assert not np.any(d[..., r.size :, :])
        else:
            assert np.array_equal(d[..., : r.size], full[..., r.start : r.stop])
            assert not np.any(d[..., r.size :])
    assert same_bits(reassemble(shards, plan), w)
