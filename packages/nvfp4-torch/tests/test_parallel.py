"""Tensor- and expert-parallel NVFP4 layers on real torch.distributed process groups (gloo,
spawned ranks, world sizes 2 and 3): row-parallel sums within the draft spec's
``[row_parallel]`` tolerance of the float64 unsharded reference (Nemotron-3-Nano's 1,856 K,
also with a padded last rank), column-parallel gathers within ``[qmm]``, a paired gate/up ->
down MLP, expert parallelism with out-of-range ids giving zero rows, and every rank holding
the same result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import nvfp4
import pytest
import torch
from nvfp4 import reference
from nvfp4.fusion import fuse
from nvfp4.planes import NVFP4Planes
from nvfp4.shard_plan import expert_plan, paired_plan, shard_plan
from nvfp4.tolerances import tolerance
from nvfp4_torch.collectives import all_gather_last, all_reduce_f32, rank_and_world
from nvfp4_torch.parallel import ColumnParallelLinear, ExpertParallelExperts, RowParallelLinear
from nvfp4_torch.ranks import run_worlds

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def weight(seed: int, shape: tuple[int, ...], name: str) -> NVFP4Planes:
    rng = np.random.default_rng(seed)
    return reference.quantize(rng.standard_normal(shape).astype(np.float32), name=name)


def x_of(seed: int, m: int, k: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).standard_normal((m, k)).astype(np.float32))


def cases(world: int, g: Any) -> dict[str, torch.Tensor]:
    """Every layer on this rank of group ``g``; returns its outputs (the same on every
    rank). The layers are bound to the cpu backend (eager: no torch.compile machinery to
    import per rank)."""
    out: dict[str, torch.Tensor] = {}
    be = nvfp4.get_backend("cpu")
    down = weight(1, (24, 1856), "down_proj")
    for dname, dt in DTYPES.items():
        x = x_of(2, 3, 1856).to(dt)
        for align in (1, 8):  # 8 blocks: the last rank holds a padded unit
            plan = shard_plan(1856, world, dim="k", align=align, name="down_proj")
            row = RowParallelLinear(down, plan, group=g, backend=be)
            out[f"row {dname} align{align}"] = row(x)
    up = weight(3, (100, 64), "up_proj")
    column = ColumnParallelLinear(up, shard_plan(100, world, dim="n"), group=g, backend=be)
    out["column"] = column(x_of(4, 5, 64))
    # a paired MLP: fused gate/up column-parallel by down's K plan, local, then row-parallel
    gate, upm = weight(5, (1856, 64), "gate"), weight(6, (1856, 64), "up")
    mlp_down = weight(7, (64, 1856), "down")
    k_plan = shard_plan(1856, world, dim="k", align=4, name="down")
    col = paired_plan(k_plan)
    gate_up = fuse([gate, upm], "gate_up")
    gu = ColumnParallelLinear(gate_up, [col, col], group=g, gather_output=False, backend=be)
    local = gu(x_of(8, 4, 64))
    rank, _ = rank_and_world(g)
    half = k_plan[rank].padded
    h = torch.nn.functional.silu(local[:, :half]) * local[:, half:]
    down_row = RowParallelLinear(mlp_down, k_plan, group=g, input_is_parallel=True, backend=be)
    out["mlp"] = down_row(h)
    experts = weight(9, (5, 16, 64), "experts")
    ids = torch.tensor([0, 4, -1, 2, 5, 1, 3, 3])
    ep = ExpertParallelExperts(experts, expert_plan(5, world), group=g, backend=be)
    out["experts"] = ep(x_of(10, 8, 64), ids)
    # the collectives alone: uneven gather, float32 sum
    widths = [3 + (r % 2) for r in range(world)]
    out["gather"] = all_gather_last(torch.full((2, widths[rank]), float(rank)), widths, g)
    out["reduce"] = all_reduce_f32(torch.full((2,), 0.5 + rank, dtype=torch.bfloat16), g)
    return out


def _rank_main(ops: Any, folder: str) -> None:
    torch.save(cases(ops.world, ops.group), Path(folder) / f"world{ops.world}_rank{ops.rank}.pt")


@pytest.fixture(scope="module")
def spawned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One spawn of 3 gloo processes: groups of 2 and of 3 ranks (nvfp4_torch.ranks)."""
    folder = tmp_path_factory.mktemp("ranks")
    run_worlds(_rank_main, (2, 3), (str(folder),))
    return folder


@pytest.fixture(params=[2, 3], ids=lambda w: f"world{w}")
def ranks(request: pytest.FixtureRequest, spawned: Path) -> Any:
    world = request.param
    return world, [torch.load(spawned / f"world{world}_rank{r}.pt") for r in range(world)]


def rel(y: torch.Tensor, ref: np.ndarray) -> float:
    return float(np.max(np.abs(y.to(torch.float64).numpy() - ref)) / np.max(np.abs(ref)))


def test_every_rank_holds_the_same_outputs(ranks: Any) -> None:
    _, outs = ranks
    for key, value in outs[0].items():
        for other in outs[1:]:
            assert torch.equal(other[key], value), key


def test_row_parallel_sums_are_within_the_draft_tolerance(ranks: Any) -> None:
    _, outs = ranks
    down = weight(1, (24, 1856), "down_proj")
    for dname, dt in DTYPES.items():
        x = x_of(2, 3, 1856).to(dt)
        ref = reference.qmm(x.to(torch.float32).numpy(), down, out_dtype=None)
        for align in (1, 8):
            y = outs[0][f"row {dname} align{align}"]
            assert y.dtype == dt
            assert rel(y, ref) <= tolerance("row_parallel", dname, spec="1.2"), (dname, align)


def test_column_parallel_gathers_every_row(ranks: Any) -> None:
    _, outs = ranks
    up = weight(3, (100, 64), "up_proj")
    ref = reference.qmm(x_of(4, 5, 64).numpy(), up, out_dtype=None)
    assert outs[0]["column"].shape == (5, 100)
    assert rel(outs[0]["column"], ref) <= tolerance("qmm", "float32")


def test_paired_mlp_matches_the_unsharded_mlp(ranks: Any) -> None:
    _, outs = ranks
    gate, upm = weight(5, (1856, 64), "gate"), weight(6, (1856, 64), "up")
    mlp_down = weight(7, (64, 1856), "down")
    xm = x_of(8, 4, 64).numpy()
    g = reference.qmm(xm, gate, out_dtype=None)
    u = reference.qmm(xm, upm, out_dtype=None)
    h = g / (1 + np.exp(-g)) * u
    ref = reference.qmm(h.astype(np.float32), mlp_down, out_dtype=None)
    # h passes through float32 on the ranks: within [qmm] (gate/up) then [row_parallel]
    bound = tolerance("qmm", "float32") * 10 + tolerance("row_parallel", "float32", spec="1.2")
    assert rel(outs[0]["mlp"], ref) <= bound


def test_expert_parallel_rows(ranks: Any) -> None:
    _, outs = ranks
    experts = weight(9, (5, 16, 64), "experts")
    ids = np.array([0, 4, -1, 2, 5, 1, 3, 3])
    ref = reference.gather_qmm(x_of(10, 8, 64).numpy(), experts, ids, out_dtype=None)
    y = outs[0]["experts"]
    assert torch.equal(y[[2, 4]], torch.zeros(2, 16))  # ids -1 and 5: exactly zero
    assert rel(y, ref) <= tolerance("gather_qmm", "float32")


def test_collectives(ranks: Any) -> None:
    world, outs = ranks
    widths = [3 + (r % 2) for r in range(world)]
    want = torch.cat([torch.full((2, w), float(r)) for r, w in enumerate(widths)], dim=-1)
    assert torch.equal(outs[0]["gather"], want)
    reduced = outs[0]["reduce"]
    assert reduced.dtype == torch.float32
    assert torch.equal(reduced, torch.full((2,), sum(0.5 + r for r in range(world))))


def test_without_a_process_group_the_layers_say_how_to_start_one() -> None:
    with pytest.raises(RuntimeError, match="init_process_group"):
        RowParallelLinear(weight(1, (4, 64), "w"), shard_plan(64, 2, dim="k"))
