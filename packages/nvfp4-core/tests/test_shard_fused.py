"""Fused tensors sharded per partition (spec 1.2, "Sharding", fused partitions): a
fused q/k/v of SmolLM2's 9 heads and 3 KV heads at TP 2, 3 (uneven heads) and 4 (KV heads
replicated), and a fused gate/up of Nemotron-3-Nano's 1,856 intermediate at TP 8 with an
alignment of 8 blocks (a padded last rank): every rank equal byte for byte to cutting each
partition separately and concatenating, with per-partition globals and with one shared
global (ModelOpt); the inverse giving back the source; the sharded matmul (gathered
column-parallel outputs, row-parallel sums) equal to the reference within the spec's
tolerances; swizzled scales and expert stacks by the same rule; bad input refused in one
line naming the tensor and the partition."""

from __future__ import annotations

import numpy as np
import pytest
from nvfp4 import NVFP4Planes, PlaneError
from nvfp4.fused_plan import FusedPlan, fused_gate_up_plan, fused_qkv_plan
from nvfp4.fusion import fuse
from nvfp4.layouts.swizzle import swizzle_scales
from nvfp4.reference import qmm
from nvfp4.shard_plan import head_plan, shard_plan
from nvfp4.shard_planes import (
    pad_fused,
    reassemble_fused,
    reassemble_fused_swizzled_scales,
    shard_fused,
    shard_fused_swizzled_scales,
    shard_planes,
)
from nvfp4.tolerances import tolerance

HEADS, KV_HEADS, HEAD_DIM, HIDDEN = 9, 3, 64, 576  # SmolLM2-135M
INTER = 1856  # Nemotron-3-Nano's routed expert


def planes(seed: int, shape: tuple[int, ...], name: str) -> NVFP4Planes:
    rng = np.random.default_rng(seed)
    *lead, n, k = shape
    codes = rng.integers(0, 256, size=(*lead, n, k // 2), dtype=np.uint8)
    scales = rng.integers(1, 0x7F, size=(*lead, n, k // 16), dtype=np.uint8)
    g = np.exp2(rng.uniform(-10, 0, size=tuple(lead))).astype(np.float32)
    return NVFP4Planes(codes, scales, g, name=name)


def rel_error(y: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(y.astype(np.float64) - ref)) / np.max(np.abs(ref)))


def qkv_parts(seed: int) -> list[NVFP4Planes]:
    return [
        planes(seed, (HEADS * HEAD_DIM, HIDDEN), "q"),
        planes(seed + 1, (KV_HEADS * HEAD_DIM, HIDDEN), "k"),
        planes(seed + 2, (KV_HEADS * HEAD_DIM, HIDDEN), "v"),
    ]


def shared(parts: list[NVFP4Planes], name: str) -> NVFP4Planes:
    """A fused tensor as ModelOpt stores it: rows concatenated, one global, no bounds."""
    return NVFP4Planes(
        np.concatenate([p.codes for p in parts], axis=-2),
        np.concatenate([p.scales for p in parts], axis=-2),
        parts[0].global_scale,
        name=name,
    )


def each_partition_cut(parts: list[NVFP4Planes], plan: FusedPlan, rank: int) -> NVFP4Planes:
    """The rank's piece cut the long way: every partition by its plan, concatenated."""
    pieces = [shard_planes(p, part, rank) for p, part in zip(parts, plan, strict=True)]
    return NVFP4Planes(
        np.concatenate([p.codes for p in pieces], axis=-2),
        np.concatenate([p.scales for p in pieces], axis=-2),
        np.float32(1.0),
        name="expected",
    )


def assert_same_rows(got: NVFP4Planes, want: NVFP4Planes) -> None:
    assert got.codes.shape == want.codes.shape
    assert got.codes.tobytes() == want.codes.tobytes()
    assert got.scales.tobytes() == want.scales.tobytes()


def assert_same_bits(a: NVFP4Planes, b: NVFP4Planes) -> None:
    assert_same_rows(a, b)
    assert a.global_scale.shape == b.global_scale.shape
    assert a.global_scale.tobytes() == b.global_scale.tobytes()
    assert a.partitions == b.partitions


@pytest.mark.parametrize(
    ("world", "q_heads", "kv_heads"),
    [
        (2, (6, 3), ((0, 2), (2, 3))),  # uneven: 2 + 1 KV heads, their 6 + 3 query heads
        (3, (3, 3, 3), ((0, 1), (1, 2), (2, 3))),
        (4, (3, 2, 2, 2), ((0, 1), (1, 2), (1, 3), (2, 3))),  # fewer KV heads: replicated
    ],
)
@pytest.mark.parametrize("globals_", ["per-partition", "shared"])
def test_fused_qkv_is_cut_per_partition(world, q_heads, kv_heads, globals_) -> None:
    parts = qkv_parts(10 * world)
    qkv = fuse(parts, "qkv_proj") if globals_ == "per-partition" else shared(parts, "qkv_proj")
    plan = fused_qkv_plan(HEADS, KV_HEADS, HEAD_DIM, world, name="qkv_proj")
    assert plan.labels == ("q", "k", "v")
    assert plan.bounds == (0, 576, 768, 960)
    h = head_plan(HEADS, KV_HEADS, HEAD_DIM, world)
    assert tuple(r.size for r in h.q) == q_heads
    assert h.kv == kv_heads
    shards = [shard_fused(qkv, plan, r) for r in range(world)]
    for r, s in enumerate(shards):
        assert_same_rows(s, each_partition_cut(parts, plan, r))
        q, kv = q_heads[r] * HEAD_DIM, (kv_heads[r][1] - kv_heads[r][0]) * HEAD_DIM
        assert s.n == q + 2 * kv == plan.padded(r)
        # every partition's global kept (one a partition, or the one shared)
        assert s.global_scale.tobytes() == qkv.global_scale.tobytes()
        assert s.partitions == (None if globals_ == "shared" else (0, q, q + kv, q + 2 * kv))
    assert_same_bits(reassemble_fused(shards, plan), qkv)
    # column-parallel: each rank's rows are an ordinary matmul, gathered per partition
    x = np.random.default_rng(world).standard_normal((5, HIDDEN)).astype(np.float32)
    ref = qmm(x, qkv, out_dtype=None)
    outs = [qmm(x, s, out_dtype=np.float32) for s in shards]
    for i, part in enumerate(plan):
        lo = plan.bounds[i]
        for r, y in enumerate(outs):
            a, rb = part[r], plan.rank_bounds(r)[i]
            got, want = y[:, rb : rb + a.size], ref[:, lo + a.start : lo + a.stop]
            assert rel_error(got, want) <= tolerance("qmm", "float32")


def test_fused_gate_up_1856_at_tp8_align8_and_its_down_sum() -> None:
    rng = np.random.default_rng(1856)
    gate, up = planes(1, (INTER, 256), "gate"), planes(2, (INTER, 256), "up")
    down = planes(3, (256, INTER), "down")
    k_plan = shard_plan(INTER, 8, dim="k", align=8, name="down")  # 15 units of 128 values
    plan = fused_gate_up_plan(INTER, 8, align=8, name="gate_up_proj")
    assert [p.ranges for p in plan] == [k_plan.ranges, k_plan.ranges]
    assert [r.padded for r in k_plan] == [256] * 7 + [128]
    assert k_plan[7].padding == 64  # rank 7: 64 rows of gate, 64 of up, 64 K columns padded
    for globals_ in ("per-partition", "shared"):
        gate_up = (
            fuse([gate, up], "gate_up_proj")
            if globals_ == "per-partition"
            else shared([gate, up], "gate_up_proj")
        )
        shards = [shard_fused(gate_up, plan, r) for r in range(8)]
        for r, s in enumerate(shards):
            assert_same_rows(s, each_partition_cut([gate, up], plan, r))
            if globals_ == "per-partition":
                assert s.partitions == (0, k_plan[r].padded, 2 * k_plan[r].padded)
        last = shards[7]  # each partition's padding at the end of its own piece
        for pad in (slice(64, 128), slice(192, None)):
            assert not np.any(last.codes[pad])
            assert not np.any(last.scales[pad])
        assert np.array_equal(last.codes[128:192], up.codes[INTER - 64 :])
        assert_same_bits(reassemble_fused(shards, plan), gate_up)
    # the MLP sharded: gate/up column-parallel (no gather), down row-parallel, float32 sum
    x = rng.standard_normal((4, 256)).astype(np.float32)
    whole = fuse([gate, up], "gate_up_proj")
    ref_gu = qmm(x, whole, out_dtype=None)
    ref_h = np.maximum(ref_gu[:, :INTER], 0) * ref_gu[:, INTER:]
    ref = qmm(ref_h, down, out_dtype=None)
    total = np.zeros((4, 256), np.float32)
    for r in range(8):
        gu = qmm(x, shard_fused(whole, plan, r), out_dtype=None)
        p = k_plan[r].padded
        h = np.maximum(gu[:, :p], 0) * gu[:, p:]  # padded rows give h = 0
        assert not np.any(h[:, k_plan[r].size :])
        total += qmm(h, shard_planes(down, k_plan, r), out_dtype=None).astype(np.float32)
    assert rel_error(total, ref) <= tolerance("row_parallel", "float32", spec="1.2")


def test_swizzled_scales_and_expert_stacks_follow_the_same_rule() -> None:
    plan = fused_qkv_plan(HEADS, KV_HEADS, HEAD_DIM, 4, name="qkv")
    qkv = fuse(qkv_parts(40), "qkv")
    buf = swizzle_scales(qkv.scales)
    bufs = [shard_fused_swizzled_scales(buf, 960, HIDDEN // 16, plan, r) for r in range(4)]
    for r, b in enumerate(bufs):
        assert np.array_equal(b, swizzle_scales(shard_fused(qkv, plan, r).scales))
    assert np.array_equal(reassemble_fused_swizzled_scales(bufs, HIDDEN // 16, plan), buf)
    # experts [E, 2I, K] with (E, P) globals: every expert cut per partition
    e_gate, e_up = planes(5, (3, 96, 64), "gate"), planes(6, (3, 96, 64), "up")
    w13 = fuse([e_gate, e_up], "w13")
    gplan = fused_gate_up_plan(96, 3, name="w13")
    shards = [shard_fused(w13, gplan, r) for r in range(3)]
    for r, s in enumerate(shards):
        assert s.global_scale.shape == (3, 2)
        for e in range(3):
            one = NVFP4Planes(
                w13.codes[e], w13.scales[e], w13.global_scale[e], partitions=w13.partitions
            )
            assert np.array_equal(s.codes[e], shard_fused(one, gplan, r).codes)
    assert_same_bits(reassemble_fused(shards, gplan), w13)


def test_a_loaded_piece_is_padded_per_partition() -> None:
    """pad_fused: a loader's concatenated logical rows padded as shard_fused pads them."""
    gate_up = fuse([planes(7, (1856, 64), "gate"), planes(8, (1856, 64), "up")], "gate_up")
    plan = fused_gate_up_plan(1856, 8, align=8, name="gate_up")
    r = plan[0][7]
    piece = NVFP4Planes(
        np.concatenate([gate_up.codes[r.start : r.stop], gate_up.codes[1856 + r.start :]]),
        np.concatenate([gate_up.scales[r.start : r.stop], gate_up.scales[1856 + r.start :]]),
        gate_up.global_scale,
        partitions=plan.logical_bounds(7),
        name="gate_up",
    )
    assert_same_bits(pad_fused(piece, plan, 7), shard_fused(gate_up, plan, 7))
    with pytest.raises(PlaneError, match=r"rank 6 rows before padding .*expected 512 = 256 \+ 256"):
        pad_fused(piece, plan, 6)


def test_bad_input_is_refused_in_one_line() -> None:
    qkv = fuse(qkv_parts(50), "layers.0.qkv_proj")
    plan = fused_qkv_plan(HEADS, KV_HEADS, HEAD_DIM, 2, name="layers.0.qkv_proj")
    cases = [
        (  # fewer query heads than ranks: the partition, the split and the unit named
            lambda: fused_qkv_plan(HEADS, KV_HEADS, HEAD_DIM, 16, name="layers.0.qkv_proj"),
            r"tensor 'layers.0.qkv_proj': partition q: 9 heads split over 16 ranks: expected "
            r"at least 16 units of 1",
        ),
        (
            lambda: fused_gate_up_plan(INTER, 16, align=8, name="mlp.gate_up_proj"),
            r"tensor 'mlp.gate_up_proj': partition gate: K = 1856 \(alignment 8 block\(s\) of "
            r"16\) split over 16 ranks: expected at least 16 units of 128",
        ),
        (  # a fused tensor of another N
            lambda: shard_fused(fuse(qkv_parts(50)[:2], "x"), plan, 0),
            r"tensor 'x': N of the fused tensor \(partitions q, k, v\): expected 960 = 576 \+ "
            r"192 \+ 192 by the plan, found 768",
        ),
        (  # recorded bounds that are not the plan's
            lambda: shard_fused(qkv.replace(partitions=(0, 640, 800, 960)), plan, 0),
            r"partition bounds: expected \(0, 576, 768, 960\) by the fused plan, found "
            r"\(0, 640, 800, 960\)",
        ),
        (lambda: shard_fused(qkv, plan, 2), r"rank: expected an integer in \[0, 2\), found 2"),
        (
            lambda: FusedPlan("t", (plan[0], shard_plan(64, 2, dim="k")), ("a", "b")),
            r"tensor 't': partition b plan: expected an 'n' plan of its rows, found k",
        ),
    ]
    for call, message in cases:
        with pytest.raises(PlaneError, match=message) as info:
            call()
        assert "\n" not in str(info.value)
    shards = [shard_fused(qkv, plan, r) for r in range(2)]
    with pytest.raises(PlaneError, match=r"rank 1 fused rows \(padded\): expected 320, found 960"):
        reassemble_fused([shards[0], qkv], plan)
    with pytest.raises(PlaneError, match=r"fused shards: expected 2 \(one a rank\), found 1"):
        reassemble_fused(shards[:1], plan)
    # replicated KV rows that differ between ranks, and nonzero padding, are refused: one
    # byte of one rank's shard flipped (fused tensor, plan, rank, plane, index, xor, message)
    gate_up = fuse([planes(7, (INTER, 64), "gate"), planes(8, (INTER, 64), "up")], "gate_up")
    tampered = [
        (  # rank 2's k rows start with KV head 1, rank 1's too
            qkv,
            fused_qkv_plan(HEADS, KV_HEADS, HEAD_DIM, 4, name="layers.0.qkv_proj"),
            2,
            "codes",
            (2 * 64 + 10, 0),
            0x11,
            r"rank 2 partition k codes of rows held by another rank too: expected the same "
            r"bytes",
        ),
        (  # gate's padded rows on rank 7 (64..127), scale byte 0x00 -> 0x38
            gate_up,
            fused_gate_up_plan(INTER, 8, align=8, name="gate_up"),
            7,
            "scales",
            (100, 1),
            0x38,
            r"rank 7 partition gate padded scale bytes \(plan 'gate_up'\): expected 0x00, "
            r"found 0x38 at padded index \(36, 1\)",
        ),
    ]
    for fused, fplan, rank, plane, index, xor, message in tampered:
        rank_shards = [shard_fused(fused, fplan, r) for r in range(fplan.world)]
        data = getattr(rank_shards[rank], plane).copy()
        data[index] ^= xor
        rank_shards[rank] = rank_shards[rank].replace(**{plane: data})
        with pytest.raises(PlaneError, match=message):
            reassemble_fused(rank_shards, fplan)
