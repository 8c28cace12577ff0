"""The shard plan (spec 1.2, "Sharding"): the divmod rule over 16-value blocks, real
model shapes (Nemotron-3-Nano's 1,856 at TP8, a 2,880 hidden size, a 640-wide expert with a
kernel alignment of 64, SmolLM2-135M's 9 / 3 heads), paired layers, refusals, and the plan's
invariants over many shapes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nvfp4 import PlaneError
from nvfp4.shard_plan import divmod_counts, expert_plan, head_plan, paired_plan, shard_plan


def bounds(plan):
    return [(r.start, r.stop, r.padded) for r in plan]


def test_divmod_counts_gives_the_first_ranks_the_remainder() -> None:
    assert divmod_counts(116, 8) == (15, 15, 15, 15, 14, 14, 14, 14)
    assert divmod_counts(9, 2) == (5, 4)
    assert divmod_counts(6, 3) == (2, 2, 2)


def test_nemotron_1856_at_tp8_gives_15_and_14_block_shards() -> None:
    # 1,856 / 8 = 232 per rank is not a multiple of 16: the plan gives whole blocks instead
    plan = shard_plan(1856, 8, dim="k", name="experts.down_proj")
    assert [r.size // 16 for r in plan] == [15, 15, 15, 15, 14, 14, 14, 14]
    assert [r.start for r in plan] == [0, 240, 480, 720, 960, 1184, 1408, 1632]
    assert plan[7].stop == 1856
    assert all(r.padding == 0 for r in plan)
    assert all(r.start % 16 == 0 and r.stop % 16 == 0 for r in plan)


def test_hidden_2880_splits_by_blocks_at_every_world_size() -> None:
    # 2,880 = 180 blocks, not a multiple of 128 (a swizzle tile of rows)
    assert shard_plan(2880, 8, dim="k").sizes == (368,) * 4 + (352,) * 4
    assert shard_plan(2880, 3, dim="k").sizes == (960, 960, 960)
    # rows split anywhere: 2,880 / 8 = 360 rows each
    assert shard_plan(2880, 8, dim="n").sizes == (360,) * 8
    assert shard_plan(2880, 7, dim="n").sizes == (412,) * 3 + (411,) * 4


def test_640_at_tp8_with_an_alignment_of_64_gives_multiples_of_64() -> None:
    plan = shard_plan(640, 8, dim="k", align=4)  # 4 blocks = 64 values a unit
    assert plan.sizes == (128, 128, 64, 64, 64, 64, 64, 64)
    assert all(r.padded % 64 == 0 and r.padding == 0 for r in plan)


def test_a_partial_last_unit_is_padded_on_the_last_rank_only() -> None:
    # 1,856 with an alignment of 128 values: 14.5 units -> 15, the last half padded
    plan = shard_plan(1856, 8, dim="k", align=8)
    assert [r.padded for r in plan] == [256] * 7 + [128]
    assert [r.padding for r in plan] == [0] * 7 + [64]
    assert plan[7].start == 1792
    assert plan[7].stop == 1856
    assert plan.padded_size == 1920
    rows = shard_plan(100, 3, dim="n", align=16)  # 7 units of 16 rows, the last holding 4
    assert bounds(rows) == [(0, 48, 48), (48, 80, 32), (80, 100, 32)]


def test_paired_layers_share_the_split() -> None:
    down_k = shard_plan(1856, 8, dim="k", name="down_proj")
    gate_n = paired_plan(down_k, name="gate_proj")
    assert gate_n.dim == "n"
    assert gate_n.ranges == down_k.ranges
    with pytest.raises(PlaneError, match="paired plan source"):
        paired_plan(shard_plan(64, 2, dim="n"))


def test_smollm2_heads_at_tp2_split_by_kv_groups() -> None:
    h = head_plan(9, 3, 64, 2, name="layers.0.self_attn")
    assert h.q.sizes == (6, 3)
    assert h.kv == ((0, 2), (2, 3))
    assert h.q_rows().sizes == (384, 192)
    assert h.kv_rows(1) == (128, 192)
    # every query head's KV head is on its rank (group of 3)
    for r, (a, b) in zip(h.q, h.kv, strict=True):
        assert all(a <= q // 3 < b for q in range(r.start, r.stop))


def test_smollm2_heads_at_tp3_and_tp4() -> None:
    h3 = head_plan(9, 3, 64, 3)
    assert h3.q.sizes == (3, 3, 3)
    assert h3.kv == ((0, 1), (1, 2), (2, 3))
    h4 = head_plan(9, 3, 64, 4)  # fewer KV heads than ranks: the query heads split 3/2/2/2
    assert h4.q.sizes == (3, 2, 2, 2)
    assert h4.kv == ((0, 1), (1, 2), (1, 3), (2, 3))  # KV head 1 and 2 replicated
    for r, (a, b) in zip(h4.q, h4.kv, strict=True):
        assert all(a <= q // 3 < b for q in range(r.start, r.stop))
    # o_proj's K plan is the query rows: whole blocks when head_dim is a multiple of 16
    assert h4.o_k().dim == "k"
    assert h4.o_k().sizes == (192, 128, 128, 128)
    with pytest.raises(PlaneError, match="o_proj K split at heads"):
        head_plan(9, 3, 8, 2).o_k()  # head_dim 8: heads cut inside a block


def test_experts_split_by_index() -> None:
    assert bounds(expert_plan(60, 8)) == [
        (0, 8, 8),
        (8, 16, 8),
        (16, 24, 8),
        (24, 32, 8),
        (32, 39, 7),
        (39, 46, 7),
        (46, 53, 7),
        (53, 60, 7),
    ]


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: shard_plan(1850, 8, dim="k", name="w"), r"tensor 'w': K = 1850 .*multiple of 16"),
        (lambda: shard_plan(64, 8, dim="k", name="w"), r"tensor 'w': K = 64 .*at least 8 units"),
        (lambda: shard_plan(640, 16, dim="k", align=4, name="w"), r"alignment 4 block"),
        (lambda: shard_plan(64, 0, dim="k"), "world size"),
        (lambda: shard_plan(64, 2, dim="x"), "shard dimension"),  # type: ignore[arg-type]
        (lambda: shard_plan(64, 2, dim="n", align=0), "alignment"),
        (lambda: head_plan(9, 2, 64, 2), "multiple of num_kv_heads"),
        (lambda: head_plan(9, 3, 64, 16), "at least 16 units"),
        (lambda: expert_plan(3, 4), "3 experts"),
        (lambda: shard_plan(64, 2, dim="k")[2], "rank"),
    ],
)
def test_refusals_name_the_tensor_and_the_split(call, match) -> None:
    with pytest.raises(PlaneError, match=match):
        call()


@settings(max_examples=400, deadline=None)
@given(
    blocks=st.integers(1, 600),
    world=st.integers(1, 16),
    align=st.integers(1, 8),
    dim=st.sampled_from(["n", "k"]),
)
def test_plan_invariants(blocks: int, world: int, align: int, dim: str) -> None:
    size = blocks * 16 if dim == "k" else blocks * 3 + 1
    unit = 16 * align if dim == "k" else align
    units = -(-size // unit)
    if units < world:
        with pytest.raises(PlaneError):
            shard_plan(size, world, dim=dim, align=align)  # type: ignore[arg-type]
        return
    plan = shard_plan(size, world, dim=dim, align=align)  # type: ignore[arg-type]
    assert len(plan) == world
    # contiguous, in rank order, covering [0, size)
    assert plan[0].start == 0
    assert plan[world - 1].stop == size
    assert all(plan[i].stop == plan[i + 1].start for i in range(world - 1))
    # padded sizes are whole units, one unit apart at most, larger ones first
    padded = [r.padded for r in plan]
    assert all(p % unit == 0 and p >= unit for p in padded)
    assert padded == sorted(padded, reverse=True)
    assert padded[0] - padded[-1] <= unit
    # only the last rank pads, by less than a unit; K bounds are block boundaries
    assert all(r.padding == 0 for r in plan.ranges[:-1])
    assert 0 <= plan[world - 1].padding < unit
    if dim == "k":
        assert all(r.start % 16 == 0 and r.stop % 16 == 0 for r in plan)
