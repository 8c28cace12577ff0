"""The shard plan of a fused tensor (spec 1.2, section "Sharding for tensor and expert
parallelism", fused partitions): q/k/v concatenated along N as one tensor (``qkv_proj``,
``Wqkv``, ``c_attn``), or gate/up (``gate_up_proj``, ``w13``), is never split as one range
of rows. Each partition is split by its own plan, and a rank's piece is the concatenation
of its pieces of every partition, in partition order:

* q by whole query heads, k and v by KV heads (replicated where fewer KV heads than ranks):
  :func:`fused_qkv_plan`, from :func:`nvfp4.shard_plan.head_plan`;
* gate and up each by the down projection's K plan (the paired rule):
  :func:`fused_gate_up_plan`.

Every partition is padded by the plan's rule on its own (its padded rows at the end of its
piece, codes 0 and scale bytes 0x00), so a rank's partition bounds are the running sums of
its padded sizes (:meth:`FusedPlan.rank_bounds`). Every rank holds a piece of every
partition, so it keeps the tensor's globals as they are (one a partition, or one shared).
:mod:`nvfp4.shard_planes` cuts planes by a fused plan (``shard_fused``) and puts them back
(``reassemble_fused``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

from .planes import PlaneError
from .shard_plan import ShardPlan, head_plan, paired_plan, shard_plan

__all__ = ["FusedPlan", "as_fused_plan", "fused_gate_up_plan", "fused_qkv_plan"]


@dataclass(frozen=True)
class FusedPlan(Sequence[ShardPlan]):
    """The plans of a fused tensor's partitions, in partition order (a sequence of
    :class:`~nvfp4.shard_plan.ShardPlan`, each an ``"n"`` plan of its partition's rows).

    Attributes:
        name: the fused tensor, named in every error.
        parts: one plan a partition.
        labels: one label a partition (``"q"``, ``"k"``, ``"v"``; ``"gate"``, ``"up"``).
    """

    name: str
    parts: tuple[ShardPlan, ...]
    labels: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.parts:
            raise PlaneError(self.name, "fused plan partitions", "at least one plan", "none")
        if len(self.labels) != len(self.parts):
            raise PlaneError(
                self.name, "fused plan labels", f"{len(self.parts)} (one a partition)", self.labels
            )
        world = self.parts[0].world
        for label, part in zip(self.labels, self.parts, strict=True):
            if not isinstance(part, ShardPlan) or part.dim != "n":
                found = part.dim if isinstance(part, ShardPlan) else type(part).__name__
                raise PlaneError(
                    self.name, f"partition {label} plan", "an 'n' plan of its rows", found
                )
            if part.world != world:
                raise PlaneError(
                    self.name,
                    f"partition {label} world size",
                    f"{world} (as partition 0)",
                    part.world,
                )

    @overload
    def __getitem__(self, i: int) -> ShardPlan: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[ShardPlan]: ...
    def __getitem__(self, i: int | slice) -> ShardPlan | Sequence[ShardPlan]:
        return self.parts[i]

    def __len__(self) -> int:
        return len(self.parts)

    def __iter__(self) -> Iterator[ShardPlan]:
        return iter(self.parts)

    @property
    def world(self) -> int:
        """The number of ranks."""
        return self.parts[0].world

    @property
    def size(self) -> int:
        """N of the whole fused tensor (the sum of the partitions' sizes)."""
        return sum(p.size for p in self.parts)

    @property
    def bounds(self) -> tuple[int, ...]:
        """The source's partition bounds ``(0, b_1, ..., N)``."""
        return (0, *itertools.accumulate(p.size for p in self.parts))

    def padded(self, rank: int) -> int:
        """The rows ``rank`` holds, every partition's padding included."""
        return sum(p[rank].padded for p in self.parts)

    def rank_bounds(self, rank: int) -> tuple[int, ...]:
        """The partition bounds of ``rank``'s piece (each partition padded on its own)."""
        return (0, *itertools.accumulate(p[rank].padded for p in self.parts))

    def logical_bounds(self, rank: int) -> tuple[int, ...]:
        """The partition bounds of ``rank``'s piece before padding (what a loader reads)."""
        return (0, *itertools.accumulate(p[rank].size for p in self.parts))


def as_fused_plan(plans: FusedPlan | Sequence[ShardPlan], name: str) -> FusedPlan:
    """``plans`` as a :class:`FusedPlan` (a plain sequence labels its partitions 0, 1, ...)."""
    if isinstance(plans, FusedPlan):
        return plans
    parts = tuple(plans)
    return FusedPlan(name, parts, tuple(str(i) for i in range(len(parts))))


def _in_partition(name: str, label: str, e: PlaneError) -> PlaneError:
    return PlaneError(name, f"partition {label}: {e.what}", e.expected, e.found)


def fused_qkv_plan(
    num_heads: int, num_kv_heads: int, head_dim: int, world: int, *, name: str = "qkv"
) -> FusedPlan:
    """The plan of a fused q/k/v tensor (rows ``[q; k; v]``): q by whole query heads, k and
    v by the KV heads each rank's queries read (:func:`~nvfp4.shard_plan.head_plan`: split
    when ``num_kv_heads >= world``, replicated where a KV head serves several ranks).

    Raises:
        PlaneError: a head split the plan refuses (fewer heads than ranks, ``num_heads`` not
            a multiple of ``num_kv_heads``), naming the tensor and the partition.
    """
    try:
        h = head_plan(num_heads, num_kv_heads, head_dim, world, name=name)
    except PlaneError as e:
        label = "q" if num_kv_heads < world or e.what.startswith(("num_heads", "head_dim")) else "k"
        raise _in_partition(name, label, e) from None
    kv = h.kv_rows_plan(name=name)
    return FusedPlan(name, (h.q_rows(), kv, kv), ("q", "k", "v"))


def fused_gate_up_plan(
    intermediate: int,
    world: int,
    *,
    align: int = 1,
    name: str = "gate_up",
    labels: tuple[str, ...] = ("gate", "up"),
) -> FusedPlan:
    """The plan of a fused gate/up tensor (rows ``[gate; up]``, each ``intermediate``
    rows): every partition along N by the down projection's K plan (the paired rule),
    ``align`` blocks a unit; an ``intermediate`` that is not a multiple of 16 (no block
    split to pair with) splits each partition at any row.

    Raises:
        PlaneError: fewer units than ranks, naming the tensor, the partition, the split and
            the alignment.
    """
    try:
        if isinstance(intermediate, int) and intermediate % 16 == 0:
            k = shard_plan(intermediate, world, dim="k", align=align, name=name)
            part = paired_plan(k, name=name)
        else:
            part = shard_plan(intermediate, world, dim="n", name=name)
    except PlaneError as e:
        raise _in_partition(name, labels[0], e) from None
    return FusedPlan(name, tuple(part for _ in labels), labels)
