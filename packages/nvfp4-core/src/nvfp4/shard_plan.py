"""The shard plan of spec 1.2, section "Sharding for tensor and expert parallelism": which
part of a tensor each rank of a tensor-parallel (or expert-parallel) group holds, and how
much zero padding it adds.

One rule decides every split: cut the dimension into *units*, then give them out with
``q, r = divmod(units, world)``; ranks ``0 .. r-1`` get ``q + 1`` units, the others ``q``, in
rank order (rank 0 holds the first units). What a unit is depends on the dimension:

==================== ============================================ ==========================
plan                 one unit                                     used by
==================== ============================================ ==========================
``dim="k"``          ``16 * align`` elements along K (whole        row-parallel layers, and
                     blocks; ``align`` in blocks, 1 by default)    the paired column layer
``dim="n"``          ``align`` output rows (1 by default)          column-parallel layers
:func:`head_plan`    one attention head (or one KV group)          q/k/v and o projections
:func:`expert_plan`  one expert                                    expert parallelism
==================== ============================================ ==========================

A rank's logical range is ``[start, stop)`` in elements (rows, or K values); its *padded*
size is its units times the unit. Only the last unit of the tensor can be partial (when the
size is not a multiple of the unit); the rank holding it pads it with zero codes and 0x00
scale bytes (:mod:`nvfp4.shard_planes`), so the padding contributes exactly 0.

Worked example (the Nemotron-3-Nano routed expert, intermediate 1,856 at TP8): 1,856 = 116
blocks, ``divmod(116, 8) = (14, 4)``: ranks 0-3 hold 15 blocks (240 values), ranks 4-7 hold
14 (224); rank 4 starts at 4 * 240 = 960. An even split (232 each) would cut block 14 in two.

The paired rule: a column-parallel layer that feeds a row-parallel layer (gate/up -> down,
the attention heads -> o) is split along N by the *row-parallel layer's K plan*
(:func:`paired_plan`), so every rank's activation slice is exactly the K range its next
layer holds. Plans never decode or copy: :mod:`nvfp4.shard_planes` cuts planes by them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from .planes import PlaneError
from .spec import BLOCK_SIZE

__all__ = [
    "HeadPlan",
    "ShardPlan",
    "ShardRange",
    "divmod_counts",
    "expert_plan",
    "head_plan",
    "paired_plan",
    "shard_plan",
]

Dim = Literal["n", "k", "heads", "experts"]


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def divmod_counts(units: int, world: int) -> tuple[int, ...]:
    """Units per rank: ``q + 1`` for ranks ``0 .. r-1`` and ``q`` for the rest, where
    ``q, r = divmod(units, world)`` (the one distribution rule of the plan)."""
    q, r = divmod(units, world)
    return tuple(q + 1 if rank < r else q for rank in range(world))


@dataclass(frozen=True)
class ShardRange:
    """One rank's share of a dimension.

    Attributes:
        rank: the rank (0-based).
        start, stop: the logical range ``[start, stop)`` of the source dimension.
        padded: the size this rank holds, padding included (``>= stop - start``); the
            elements ``[stop - start, padded)`` of its shard are zero padding.
    """

    rank: int
    start: int
    stop: int
    padded: int

    @property
    def size(self) -> int:
        """Logical elements (``stop - start``)."""
        return self.stop - self.start

    @property
    def padding(self) -> int:
        """Zero-padding elements at the end of this rank's shard."""
        return self.padded - self.size


@dataclass(frozen=True)
class ShardPlan:
    """Every rank's range of one dimension of one tensor (see the module docstring).

    Attributes:
        name: the tensor (or layer) the plan is for, named in every error.
        dim: ``"n"``, ``"k"``, ``"heads"`` or ``"experts"``.
        size: the logical size of the dimension.
        world: the number of ranks.
        unit: elements per unit (16 * align for ``"k"``, align for ``"n"``, 1 for heads and
            experts).
        ranges: one :class:`ShardRange` per rank, in rank order.
    """

    name: str
    dim: Dim
    size: int
    world: int
    unit: int
    ranges: tuple[ShardRange, ...]

    def __iter__(self) -> Iterator[ShardRange]:
        return iter(self.ranges)

    def __len__(self) -> int:
        return len(self.ranges)

    def __getitem__(self, rank: int) -> ShardRange:
        if not (_is_int(rank) and 0 <= rank < self.world):
            raise PlaneError(self.name, "rank", f"an integer in [0, {self.world})", rank)
        return self.ranges[rank]

    @property
    def padded_size(self) -> int:
        """The sum of the padded sizes (the size of the concatenated shards)."""
        return sum(r.padded for r in self.ranges)

    @property
    def sizes(self) -> tuple[int, ...]:
        """Logical size of every rank's range."""
        return tuple(r.size for r in self.ranges)

    def scaled(self, factor: int, name: str | None = None, dim: Dim | None = None) -> ShardPlan:
        """The same split in a finer unit: every bound times ``factor`` (heads -> rows of
        ``head_dim`` each), optionally as another dimension."""
        return ShardPlan(
            name=self.name if name is None else name,
            dim=self.dim if dim is None else dim,
            size=self.size * factor,
            world=self.world,
            unit=self.unit * factor,
            ranges=tuple(
                ShardRange(r.rank, r.start * factor, r.stop * factor, r.padded * factor)
                for r in self.ranges
            ),
        )


def _check_world(name: str, world: object) -> int:
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise PlaneError(name, "world size", "an integer >= 1", world)
    return world


def _plan(name: str, dim: Dim, size: int, world: int, unit: int, what: str) -> ShardPlan:
    units = -(-size // unit)  # ceil: a partial last unit is padded
    if units < world:
        raise PlaneError(
            name,
            f"{what} split over {world} ranks",
            f"at least {world} units of {unit} (one per rank)",
            f"{size} = {units} unit(s)",
        )
    ranges = []
    start = 0
    for rank, count in enumerate(divmod_counts(units, world)):
        padded = count * unit
        stop = min(start + padded, size)
        ranges.append(ShardRange(rank, start, stop, padded))
        start += padded
    return ShardPlan(name, dim, size, world, unit, tuple(ranges))


def shard_plan(
    size: int,
    world: int,
    *,
    dim: Literal["n", "k"],
    align: int = 1,
    name: str = "tensor",
) -> ShardPlan:
    """The plan of one dimension of one tensor.

    Args:
        size: N (output rows) or K (the contraction length, a multiple of 16).
        world: the number of ranks.
        dim: ``"k"`` splits at block boundaries only: units of ``16 * align`` values.
            ``"n"`` splits at any row: units of ``align`` rows.
        align: the kernel's alignment, in blocks for ``"k"`` (4 for a kernel that needs
            multiples of 64 values, or for 128x4 swizzled scale tiles) and in rows for
            ``"n"``. A partial last unit is zero-padded.
        name: the tensor, named in errors.

    Raises:
        PlaneError: K not a multiple of 16, a non-positive size or alignment, or fewer
            units than ranks; the message names the tensor, the dimension, the split and
            the alignment.
    """
    world = _check_world(name, world)
    if dim not in ("n", "k"):
        raise PlaneError(name, "shard dimension", "'n' or 'k'", dim)
    if not (_is_int(size) and size >= 1):
        raise PlaneError(name, f"{dim.upper()} size", "an integer >= 1", size)
    if not (_is_int(align) and align >= 1):
        raise PlaneError(name, f"{dim.upper()} alignment", "an integer >= 1", align)
    if dim == "k":
        if size % BLOCK_SIZE:
            raise PlaneError(
                name,
                f"K = {size} split over {world} ranks (alignment {align} blocks)",
                f"a multiple of {BLOCK_SIZE}: K splits only at block boundaries",
                size,
            )
        unit = BLOCK_SIZE * align
        what = f"K = {size} (alignment {align} block(s) of {BLOCK_SIZE})"
    else:
        unit = align
        what = f"N = {size} (alignment {align} row(s))"
    return _plan(name, dim, size, world, unit, what)


def paired_plan(row_parallel_k: ShardPlan, name: str | None = None) -> ShardPlan:
    """The N plan of a column-parallel layer feeding a row-parallel one: the same ranges
    as the row-parallel layer's K plan (gate/up's N split equals down's K split). A padded
    K tail becomes padded output rows, whose zero scales give zero activations."""
    if row_parallel_k.dim != "k":
        raise PlaneError(
            row_parallel_k.name, "paired plan source", "a K plan ('k')", row_parallel_k.dim
        )
    return ShardPlan(
        name=row_parallel_k.name if name is None else name,
        dim="n",
        size=row_parallel_k.size,
        world=row_parallel_k.world,
        unit=row_parallel_k.unit,
        ranges=row_parallel_k.ranges,
    )


@dataclass(frozen=True)
class HeadPlan:
    """How attention heads split over ranks (whole heads only).

    Attributes:
        q: query heads per rank (a ``"heads"`` plan over ``num_heads``).
        kv: the KV heads each rank holds, ``[start, stop)`` per rank; ranges overlap (the
            heads are replicated) when a KV group straddles ranks.
        head_dim: elements per head.
    """

    q: ShardPlan
    kv: tuple[tuple[int, int], ...]
    num_kv_heads: int
    head_dim: int

    def q_rows(self) -> ShardPlan:
        """The q_proj N plan: whole heads of ``head_dim`` rows."""
        return self.q.scaled(self.head_dim, dim="n")

    def o_k(self) -> ShardPlan:
        """The o_proj K plan (the paired rule: the query rows), which must fall on block
        boundaries.

        Raises:
            PlaneError: a bound that is not a multiple of 16 (a ``head_dim`` that is not).
        """
        plan = self.q.scaled(self.head_dim, dim="k")
        for r in plan:
            if r.start % BLOCK_SIZE or r.stop % BLOCK_SIZE:
                raise PlaneError(
                    self.q.name,
                    f"o_proj K split at heads (head_dim {self.head_dim}, {plan.world} ranks)",
                    f"bounds that are multiples of {BLOCK_SIZE}",
                    (r.start, r.stop),
                )
        return plan

    def kv_rows(self, rank: int) -> tuple[int, int]:
        """The k_proj / v_proj rows ``[start, stop)`` of ``rank``."""
        a, b = self.kv[rank]
        return a * self.head_dim, b * self.head_dim

    def kv_rows_plan(self, name: str = "kv") -> ShardPlan:
        """The k_proj / v_proj N plan: :meth:`kv_rows` of every rank (ranges overlap where
        KV heads are replicated, and such a plan cannot be reassembled)."""
        ranges = tuple(
            ShardRange(rank, a, b, b - a)
            for rank, (a, b) in enumerate(self.kv_rows(r) for r in range(len(self.kv)))
        )
        size = self.num_kv_heads * self.head_dim
        return ShardPlan(name, "n", size, len(self.kv), self.head_dim, ranges)


def head_plan(
    num_heads: int, num_kv_heads: int, head_dim: int, world: int, *, name: str = "attention"
) -> HeadPlan:
    """Whole-head split of an attention layer (grouped-query attention included).

    * ``num_kv_heads >= world``: the KV heads split by the divmod rule and every query
      head goes with its KV group (``group = num_heads / num_kv_heads`` query heads per KV
      head): SmolLM2-135M (9 heads, 3 KV heads) at TP2 gives ranks 6 + 3 query heads and
      2 + 1 KV heads; nothing is replicated.
    * ``num_kv_heads < world``: the query heads split by the divmod rule and each rank
      holds the KV heads its query heads read (replicated where a group spans ranks).

    o_proj's K plan is :meth:`HeadPlan.q_rows` (the paired rule); it needs ``head_dim`` to
    be a multiple of 16 when heads are cut at a non-block row.
    """
    world = _check_world(name, world)
    for what, v in (("num_heads", num_heads), ("num_kv_heads", num_kv_heads)):
        if not (_is_int(v) and v >= 1):
            raise PlaneError(name, what, "an integer >= 1", v)
    if not (_is_int(head_dim) and head_dim >= 1):
        raise PlaneError(name, "head_dim", "an integer >= 1", head_dim)
    if num_heads % num_kv_heads:
        raise PlaneError(
            name, "num_heads", f"a multiple of num_kv_heads = {num_kv_heads}", num_heads
        )
    group = num_heads // num_kv_heads
    if num_kv_heads >= world:
        kv_plan = _plan(name, "heads", num_kv_heads, world, 1, f"{num_kv_heads} KV heads")
        q = kv_plan.scaled(group, name=name)
        q = ShardPlan(name, "heads", num_heads, world, 1, q.ranges)
        kv = tuple((r.start, r.stop) for r in kv_plan)
    else:
        q = _plan(name, "heads", num_heads, world, 1, f"{num_heads} heads")
        kv = tuple((r.start // group, -(-r.stop // group)) for r in q)
    return HeadPlan(q=q, kv=kv, num_kv_heads=num_kv_heads, head_dim=head_dim)


def expert_plan(num_experts: int, world: int, *, name: str = "experts") -> ShardPlan:
    """Expert parallelism: experts ``[start, stop)`` per rank by the divmod rule; each
    expert's global scale (and every per-expert plane) travels with it."""
    world = _check_world(name, world)
    if not (_is_int(num_experts) and num_experts >= 1):
        raise PlaneError(name, "num_experts", "an integer >= 1", num_experts)
    return _plan(name, "experts", num_experts, world, 1, f"{num_experts} experts")
