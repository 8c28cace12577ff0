"""Tensor- and expert-parallel NVFP4 layers on ``torch.distributed`` (spec 1.2,
"Sharding"): each rank holds its shard of the weight, cut by a shard plan
(:mod:`nvfp4.shard_plan`, :mod:`nvfp4.shard_planes`), and computes with
:class:`~nvfp4_torch.modules.NVFP4Linear` / :class:`~nvfp4_torch.modules.NVFP4Experts`
(through ``torch.ops.nvfp4``, or bound to one backend object).

* :class:`ColumnParallelLinear` - output rows split by an ``"n"`` plan (a fused q/k/v or
  gate/up weight by one plan a partition); the output gathered across ranks (no arithmetic)
  or kept local for a paired row-parallel layer;
* :class:`RowParallelLinear` - K split by a ``"k"`` plan (whole blocks); every rank's
  partial output, its global applied, is kept in float32 and summed in float32
  (:func:`~nvfp4_torch.collectives.all_reduce_f32`), then cast once;
* :class:`ExpertParallelExperts` - experts split by an ``"experts"`` plan; a rank's rows
  for other ranks' experts come out exactly zero, so the float32 sum is exact.

Every layer takes the whole weight (each rank cuts its own shard) or, with
``planes_are_shard=True``, this rank's shard already cut, as
:func:`nvfp4_checkpoints.load_rank` reads it from a checkpoint (``shard.planes[name]`` with
``shard.plans[name]``): a rank then never holds the whole weight. The shard's size along the
plan's dimension is checked against the plan (padding included).

A padded shard (a plan with alignment) pads codes with 0 and scales with 0x00: padded output
rows are exactly zero, and padded K columns add exactly zero whatever x holds there (the
layers put zeros there anyway). A column-parallel layer that feeds a row-parallel one takes
that layer's K plan (:func:`nvfp4.shard_plan.paired_plan`) with ``gather_output=False``: its
local output, padding included, is exactly the row-parallel layer's local input.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from nvfp4.planes import NVFP4Planes
from nvfp4.shard_plan import ShardPlan
from nvfp4.shard_planes import shard_fused, shard_planes

from .collectives import all_gather_last, all_reduce_f32, rank_and_world
from .modules import NVFP4Experts, NVFP4Linear

__all__ = ["ColumnParallelLinear", "ExpertParallelExperts", "RowParallelLinear"]


def _check_shard(shard: NVFP4Planes, plans: Sequence[ShardPlan], rank: int, what: str) -> None:
    """Refuse a shard (``planes_are_shard=True``) whose size along the plans' dimension
    is not what the plans give ``rank``: the sum of the partitions' padded rows, the padded
    K, or the number of experts."""
    dim = plans[0].dim
    if dim == "experts":
        want, have = plans[0][rank].size, shard.num_experts
    else:
        want = sum(p[rank].padded for p in plans)
        have = shard.n if dim == "n" else shard.k
    if have != want:
        raise ValueError(
            f"{what} rank {rank}: planes_are_shard: expected the plan's {dim} size {want} "
            f"(padding included), found {have}"
        )


def _check_plan(plan: ShardPlan, dim: str, world: int, what: str) -> None:
    if plan.dim != dim:
        raise ValueError(f"{what} ({plan.name!r}): expected a {dim!r} plan, found {plan.dim!r}")
    if plan.world != world:
        raise ValueError(
            f"{what} ({plan.name!r}): the plan is for {plan.world} ranks, the group has {world}"
        )


def _rank_shard(
    planes: NVFP4Planes,
    plans: tuple[ShardPlan, ...],
    dim: str,
    group: Any,
    what: str,
    *,
    planes_are_shard: bool,
    fused: bool = False,
) -> tuple[int, NVFP4Planes]:
    """This rank and its shard of ``planes`` for a layer cut by ``plans`` (each a ``dim``
    plan for the group's world size): ``planes`` itself when it is already this rank's
    shard (its size checked against the plans), else cut from the whole weight (one plan,
    or with ``fused`` one plan a partition)."""
    rank, world = rank_and_world(group)
    for p in plans:
        _check_plan(p, dim, world, what)
    if planes_are_shard:
        _check_shard(planes, plans, rank, what)
        return rank, planes
    if fused:
        return rank, shard_fused(planes, plans, rank)
    return rank, shard_planes(planes, plans[0], rank)


class ColumnParallelLinear(torch.nn.Module):  # type: ignore[misc]
    """This rank's output rows of ``planes`` (``y = x @ W[rows].T``).

    Args:
        planes: the whole weight ``[N, K]`` (every rank cuts its own shard), or this rank's
            shard with ``planes_are_shard=True``.
        plan: an ``"n"`` plan of N, or one ``"n"`` plan a partition of a fused weight.
        group: the process group (default: the default group).
        gather_output: gather every rank's columns into ``[..., N]`` (default); ``False``
            returns the local ``[..., padded rows]`` for a paired row-parallel layer.
        backend: bind the local linear to this backend object (:meth:`NVFP4Linear.bind`).
        planes_are_shard: ``planes`` is this rank's shard (a fused one: the rank's pieces
            of every partition, fused), not the whole weight.
    """

    def __init__(
        self,
        planes: NVFP4Planes,
        plan: ShardPlan | Sequence[ShardPlan],
        *,
        group: Any = None,
        gather_output: bool = True,
        backend: Any = None,
        planes_are_shard: bool = False,
    ) -> None:
        super().__init__()
        self.group = group
        self.plans: tuple[ShardPlan, ...] = (plan,) if isinstance(plan, ShardPlan) else tuple(plan)
        self.rank, shard = _rank_shard(
            planes,
            self.plans,
            "n",
            group,
            f"ColumnParallelLinear({planes.name!r})",
            planes_are_shard=planes_are_shard,
            fused=not isinstance(plan, ShardPlan),
        )
        self.gather_output = gather_output
        self.linear = NVFP4Linear(shard, backend=backend)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        local: torch.Tensor = self.linear(x)
        if not self.gather_output:
            return local
        # each partition's logical columns (padding dropped), gathered across ranks
        out, lo = [], 0
        for p in self.plans:
            r = p[self.rank]
            piece = local[..., lo : lo + r.size]
            lo += r.padded
            out.append(all_gather_last(piece, p.sizes, self.group))
        return out[0] if len(out) == 1 else torch.cat(out, dim=-1)


class RowParallelLinear(torch.nn.Module):  # type: ignore[misc]
    """This rank's K columns of ``planes``; the ranks' partial outputs summed in float32.

    Args:
        planes: the whole weight ``[N, K]``, or this rank's shard with
            ``planes_are_shard=True``.
        plan: a ``"k"`` plan of K (whole blocks; an alignment pads the last rank).
        group: the process group.
        input_is_parallel: ``forward`` gets this rank's columns of x (``[..., size]`` or,
            from a paired column-parallel layer, ``[..., padded]``) instead of the whole x.
        bias: an optional ``[N]`` bias, added once after the sum.
        backend: bind the local linear to this backend object.
        planes_are_shard: ``planes`` is this rank's shard (its padded K columns).
    """

    def __init__(
        self,
        planes: NVFP4Planes,
        plan: ShardPlan,
        *,
        group: Any = None,
        input_is_parallel: bool = False,
        bias: torch.Tensor | None = None,
        backend: Any = None,
        planes_are_shard: bool = False,
    ) -> None:
        super().__init__()
        self.rank, shard = _rank_shard(
            planes,
            (plan,),
            "k",
            group,
            f"RowParallelLinear({planes.name!r})",
            planes_are_shard=planes_are_shard,
        )
        self.group = group
        self.plan = plan
        self.input_is_parallel = input_is_parallel
        self.linear = NVFP4Linear(shard, backend=backend)
        self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = self.plan[self.rank]
        local = x if self.input_is_parallel else x[..., r.start : r.stop]
        if local.shape[-1] not in (r.size, r.padded):
            raise ValueError(
                f"RowParallelLinear({self.linear.name!r}) rank {self.rank}: x has "
                f"{local.shape[-1]} columns, expected {r.size} (or {r.padded} padded)"
            )
        # float32 in (exact for float16 / bfloat16 x), zeros in the padded columns
        xf = torch.zeros((*local.shape[:-1], r.padded), dtype=torch.float32)
        xf[..., : r.size] = local[..., : r.size].to(torch.float32)
        y = all_reduce_f32(self.linear(xf), self.group)
        if self.bias is not None:
            y = y + self.bias.to(torch.float32)
        return y.to(x.dtype)


class ExpertParallelExperts(torch.nn.Module):  # type: ignore[misc]
    """This rank's experts of ``planes [E, N, K]``: ``forward(x [M, K], expert_ids [M])``
    gives every row its expert's product, summed over ranks in float32 (exactly: the other
    ranks' rows are zero). Global scales travel with their experts.

    Args:
        planes: the whole expert stack, or this rank's experts with
            ``planes_are_shard=True``.
        plan: an ``"experts"`` plan of E.
        group: the process group.
        backend: compute with this backend object's ``gather_qmm`` (eager) instead of
            ``torch.ops.nvfp4.gather_qmm``.
        planes_are_shard: ``planes`` is this rank's experts.
    """

    def __init__(
        self,
        planes: NVFP4Planes,
        plan: ShardPlan,
        *,
        group: Any = None,
        backend: Any = None,
        planes_are_shard: bool = False,
    ) -> None:
        super().__init__()
        self.rank, shard = _rank_shard(
            planes,
            (plan,),
            "experts",
            group,
            f"ExpertParallelExperts({planes.name!r})",
            planes_are_shard=planes_are_shard,
        )
        self.group = group
        self.first = plan[self.rank].start
        self.experts = NVFP4Experts(shard)
        self.backend = backend
        self.handle = None if backend is None else backend.prepare(shard)

    def forward(self, x: torch.Tensor, expert_ids: torch.Tensor) -> torch.Tensor:
        # ids of other ranks' experts fall outside [0, local E): their rows are exactly 0
        local_ids = expert_ids.to(torch.int64) - self.first
        xf = x.to(torch.float32)
        if self.backend is None:
            partial = self.experts(xf, local_ids)
        else:
            y = self.backend.gather_qmm(
                self.backend.from_numpy(xf.contiguous().numpy()),
                self.handle,
                self.backend.from_numpy(local_ids.numpy()),
                sorted_indices=False,
            )
            partial = torch.from_numpy(np.ascontiguousarray(self.backend.to_numpy(y), np.float32))
        return all_reduce_f32(partial, self.group).to(x.dtype)
