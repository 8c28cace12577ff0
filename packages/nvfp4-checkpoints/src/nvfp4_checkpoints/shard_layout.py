"""What every rank of a pre-sharded checkpoint holds (spec 1.2, "Sharding"): the
tensor-parallel plan of every NVFP4 tensor, the expert-parallel split of every group of
experts, the names a rank stores them under, and the manifest that records it all.

**Ranks.** ``--tp N --ep M`` makes ``N * M`` ranks, expert-parallel major: rank
``r = ep_rank * N + tp_rank``. Experts are split over the ``M`` EP ranks by
:func:`nvfp4.shard_plan.expert_plan` (each expert's global travels with it) and every
matrix a rank holds, an expert's included, is split over the ``N`` TP ranks of its group by
the tensor's plan (:func:`plan_for`); tensors that are no experts (attention, dense MLPs,
shared experts) are split over the TP ranks and held by every EP group.

**Experts** are found as the checkpoints name them: per-expert tensors
``<...>.experts.<i>.<proj>`` (complete runs ``0 .. E-1`` of equal shapes:
:meth:`~nvfp4_checkpoints.Checkpoint.expert_groups`; Mixtral's ``w1/w2/w3`` included), and
stacked ``[E, N, K]`` tensors (MLX's ``switch_mlp.<proj>``, a GGUF's merged experts presented
whole). A rank stores its experts renumbered from 0: local expert ``j`` of EP rank ``e`` is
global expert ``start_e + j`` (the manifest's ``experts`` ranges give ``start_e``), so each
rank is an ordinary MoE checkpoint of its own experts in every flavour.

**GGUF** stores K in super-blocks of 64 values (:data:`nvfp4.spec.GGUF_SUPER_BLOCK`): its K
unit is at least :data:`GGUF_ALIGN` blocks, and every K range (an ``o_proj`` cut at heads
included) must start and end on a super-block.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
from nvfp4.fused_plan import FusedPlan, fused_gate_up_plan, fused_qkv_plan
from nvfp4.planes import NVFP4Planes, PlaneError
from nvfp4.shard_plan import ShardPlan, ShardRange, expert_plan, head_plan, paired_plan, shard_plan
from nvfp4.shard_planes import shard_fused, shard_planes
from nvfp4.spec import BLOCK_SIZE, GGUF_SUPER_BLOCK

from .checkpoint import Checkpoint
from .flavours import CheckpointError
from .hf import HFCheckpoint

__all__ = [
    "DOWN_PROJ",
    "FUSED_GATE_UP",
    "FUSED_QKV",
    "GGUF_ALIGN",
    "GGUF_UP",
    "SHARD_SPEC",
    "AnyPlan",
    "ExpertGroup",
    "ShardLayout",
    "TensorLayout",
    "build_layout",
    "default_align",
    "fused_up",
    "heads_of",
    "layer_of",
    "plan_entry",
    "plan_for",
    "plan_from_entry",
    "recorded_partitions",
]

#: The spec version whose plan the manifest follows.
SHARD_SPEC: Final = "1.2"
#: The smallest K unit of a GGUF NVFP4 tensor, in 16-value blocks (one 64-value super-block).
GGUF_ALIGN: Final = GGUF_SUPER_BLOCK // BLOCK_SIZE
#: How the manifest says rank numbers are formed from the EP and TP ranks.
RANK_ORDER: Final = "rank = ep_rank * tp + tp_rank"
# The layers by their last name component, as Hugging Face checkpoints and llama.cpp's GGUF
# names (blk.<i>.attn_output, ffn_down_exps...) call them.
O_PROJ: Final = ("o_proj", "attn_output")
#: The MLP's down projections (K split, paired with gate / up's N).
DOWN_PROJ: Final = ("down_proj", "w2", "ffn_down", "ffn_down_exps")
ROW_PARALLEL: Final = (*O_PROJ, *DOWN_PROJ)
PAIRED_COLUMN: Final = (
    "gate_proj",
    "up_proj",
    "w1",
    "w3",
    "ffn_gate",
    "ffn_up",
    "ffn_gate_exps",
    "ffn_up_exps",
)
Q_PROJ: Final = ("q_proj", "attn_q")
HEADS: Final = (*Q_PROJ, "k_proj", "v_proj", "attn_k", "attn_v")
# Fused tensors (rows [q; k; v] and [gate; up]), split per partition, never as one range.
FUSED_QKV: Final = ("qkv_proj", "Wqkv", "c_attn", "attn_qkv")
FUSED_GATE_UP: Final = ("gate_up_proj", "w13")
#: llama.cpp's name of an up projection that may hold gate and up fused: for Phi-3 (and
#: GLM-4) its converter stores ``gate_up_proj`` as ``blk.<i>.ffn_up`` with twice
#: ``feed_forward_length`` rows and writes no ``ffn_gate`` (:func:`fused_up`).
GGUF_UP: Final = "ffn_up"
#: A tensor's TP plan: one dimension's, or a fused tensor's partition plans.
AnyPlan = ShardPlan | FusedPlan


def default_align(flavour: str) -> int:
    """The K unit (blocks) when none is asked for: one GGUF super-block, else one block."""
    return GGUF_ALIGN if flavour == "gguf" else 1


def heads_of(config: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """``(num_heads, num_kv_heads, head_dim)`` of ``config.json``, or ``None``."""
    heads = config.get("num_attention_heads")
    kv = config.get("num_key_value_heads", heads)
    hidden = config.get("hidden_size")
    dim = config.get("head_dim") or (hidden // heads if heads and hidden else None)
    if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (heads, kv, dim)):
        return int(heads), int(kv), int(dim)  # type: ignore[arg-type]
    return None


def fused_up(leaf: str, n: int, config: Mapping[str, Any]) -> bool:
    """Whether an NVFP4 tensor of layer ``leaf`` and ``n`` rows is a GGUF ``ffn_up`` holding
    gate and up fused (rows ``[gate; up]``): ``n`` is twice ``config.json``'s
    ``intermediate_size`` (a GGUF's ``feed_forward_length``)."""
    inter = config.get("intermediate_size")
    return (
        leaf == GGUF_UP
        and isinstance(inter, int)
        and not isinstance(inter, bool)
        and inter > 0
        and n == 2 * inter
    )


def layer_of(name: str) -> str:
    """The layer a tensor name ends with (``down_proj``), skipping an expert index
    (``blk.0.ffn_down_exps.3`` -> ``ffn_down_exps``)."""
    return next((c for c in reversed(name.split(".")) if not c.isdigit()), name)


def plan_for(
    name: str,
    n: int,
    k: int,
    tp: int,
    align: int,
    config: Mapping[str, Any],
    partitions: tuple[int, ...] | None = None,
) -> AnyPlan:
    """The TP plan of NVFP4 tensor ``name`` (``[N, K]``) at ``tp`` ranks, by its layer
    (:func:`layer_of`; llama.cpp's GGUF names in brackets):

    * row-parallel (``o_proj``, ``down_proj``, ``w2``; ``attn_output``, ``ffn_down``,
      ``ffn_down_exps``): K in whole blocks, ``align`` blocks a unit; the o projection by
      whole attention heads when ``config.json`` gives them;
    * ``q_proj`` / ``k_proj`` / ``v_proj`` (``attn_q`` / ``attn_k`` / ``attn_v``): whole heads
      (KV heads replicated where fewer than ranks); ``gate_proj`` / ``up_proj`` / ``w1`` /
      ``w3`` (``ffn_gate``, ``ffn_up`` and their ``_exps``): the down projection's K plan
      (the paired rule); any other NVFP4 tensor: N at any row;
    * fused tensors, a :class:`~nvfp4.fused_plan.FusedPlan` (every partition by its own
      plan): ``qkv_proj`` / ``Wqkv`` / ``c_attn`` (``attn_qkv``) by the heads of
      ``config.json``, ``gate_up_proj`` / ``w13`` (and a GGUF's ``ffn_up`` of twice the
      intermediate size: :func:`fused_up`) as two halves by the down projection's K plan,
      and any other tensor that records ``partitions`` (MLX) each partition at any row.
      Recorded bounds must be the plan's.
    """
    leaf = layer_of(name)
    heads = heads_of(config)
    if leaf in FUSED_QKV or leaf in FUSED_GATE_UP or partitions is not None:
        return _fused_plan_for(name, leaf, n, tp, align, heads, partitions)
    if fused_up(leaf, n, config):
        return _fused_plan_for(name, FUSED_GATE_UP[0], n, tp, align, heads, None)
    if leaf in ROW_PARALLEL:
        if leaf in O_PROJ and heads is not None and heads[0] * heads[2] == k:
            return head_plan(*heads, tp, name=name).o_k()
        return shard_plan(k, tp, dim="k", align=align, name=name)
    if leaf in HEADS and heads is not None:
        h = head_plan(*heads, tp, name=name)
        rows = h.q_rows() if leaf in Q_PROJ else h.kv_rows_plan(name=name)
        if rows.size == n:
            return rows
    if leaf in PAIRED_COLUMN and n % BLOCK_SIZE == 0:
        return paired_plan(shard_plan(n, tp, dim="k", align=align, name=name), name=name)
    return shard_plan(n, tp, dim="n", name=name)


def _fused_plan_for(
    name: str,
    leaf: str,
    n: int,
    tp: int,
    align: int,
    heads: tuple[int, int, int] | None,
    partitions: tuple[int, ...] | None,
) -> FusedPlan:
    if leaf in FUSED_QKV:
        if heads is None:
            raise PlaneError(
                name,
                f"fused q/k/v split per partition over {tp} ranks",
                "num_attention_heads, num_key_value_heads and hidden_size or head_dim in "
                "config.json (heads are never cut)",
                "none",
            )
        fp = fused_qkv_plan(*heads, tp, name=name)
        how = f"{heads[0]} heads and 2 x {heads[1]} KV heads of {heads[2]} (config.json)"
    elif leaf in FUSED_GATE_UP:
        if n % 2:
            raise PlaneError(
                name, "fused gate/up rows", "an even N (gate and up, one intermediate each)", n
            )
        fp = fused_gate_up_plan(n // 2, tp, align=align, name=name)
        how = "two equal halves, gate and up"
    else:
        assert partitions is not None
        plans = []
        for i, (a, b) in enumerate(itertools.pairwise(partitions)):
            try:
                plans.append(shard_plan(b - a, tp, dim="n", name=name))
            except PlaneError as e:
                raise PlaneError(name, f"partition {i}: {e.what}", e.expected, e.found) from None
        fp = FusedPlan(name, tuple(plans), tuple(str(i) for i in range(len(plans))))
        how = "its recorded partitions"
    if fp.size != n:
        raise PlaneError(
            name,
            f"N of the fused tensor (partitions {', '.join(fp.labels)})",
            f"{fp.size} by {how}",
            n,
        )
    if partitions is not None and partitions != fp.bounds:
        raise PlaneError(
            name,
            "recorded partition bounds",
            f"{fp.bounds} by the fused plan ({how})",
            partitions,
        )
    return fp


def recorded_partitions(ck: Checkpoint, name: str) -> tuple[int, ...] | None:
    """The partition bounds ``name`` records (MLX's ``<prefix>.partitions``), read alone
    from a safetensors checkpoint; ``None`` for an unfused tensor."""
    if ck.plane_shape(name).partitions is None:
        return None
    if isinstance(ck, HFCheckpoint) and "partitions" in (parts := ck.part_names(name)):
        return tuple(int(b) for b in np.asarray(ck.store.read(parts["partitions"])).tolist())
    return ck.planes(name).partitions


def plan_entry(plan: AnyPlan) -> dict[str, Any]:
    """A plan as the manifest records it; a fused tensor's as ``dim`` ``"fused"`` with one
    plan a partition, labelled, in partition order."""
    if isinstance(plan, FusedPlan):
        return {
            "dim": "fused",
            "size": plan.size,
            "partitions": [
                {"label": label, **plan_entry(p)}
                for label, p in zip(plan.labels, plan, strict=True)
            ],
        }
    return {
        "dim": plan.dim,
        "size": plan.size,
        "unit": plan.unit,
        "ranks": [[r.start, r.stop, r.padded] for r in plan],
    }


def plan_from_entry(entry: Any, name: str, world: int, where: Path) -> AnyPlan:
    """The plan a manifest entry states, every value checked where it is read."""
    if isinstance(entry, dict) and entry.get("dim") == "fused":
        parts = entry.get("partitions")
        if not (
            isinstance(parts, list)
            and parts
            and all(isinstance(p, dict) and isinstance(p.get("label"), str) for p in parts)
        ):
            raise CheckpointError(
                f"{where}: {name!r}: partitions: expected a list of labelled plans (a fused "
                f"tensor), found {json.dumps(parts)[:200]}"
            )
        plans = []
        for p in parts:
            plan = plan_from_entry(p, f"{name} partition {p['label']}", world, where)
            if not isinstance(plan, ShardPlan) or plan.dim != "n":
                raise CheckpointError(
                    f"{where}: {name!r}: partition {p['label']}: expected an 'n' plan of its "
                    f"rows, found dim {p.get('dim')!r}"
                )
            plans.append(dataclasses.replace(plan, name=name))
        return FusedPlan(name, tuple(plans), tuple(p["label"] for p in parts))
    if not isinstance(entry, dict):
        raise CheckpointError(f"{where}: {name!r}: expected an object, found {entry!r}")
    dim, size, unit, ranks = (entry.get(k) for k in ("dim", "size", "unit", "ranks"))
    ok_ranks = (
        isinstance(ranks, list)
        and len(ranks) == world
        and all(
            isinstance(r, list)
            and len(r) == 3
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in r)
            for r in ranks
        )
    )
    if (
        dim not in ("n", "k", "experts")
        or not isinstance(size, int)
        or not isinstance(unit, int)
        or not ok_ranks
    ):
        raise CheckpointError(
            f"{where}: {name!r}: expected dim 'n'/'k'/'experts'/'fused', integer size and unit "
            f"and {world} [start, stop, padded] ranks, found {json.dumps(entry)[:200]}"
        )
    assert isinstance(ranks, list)
    return ShardPlan(
        name, dim, size, world, unit, tuple(ShardRange(i, *r) for i, r in enumerate(ranks))
    )


@dataclass(frozen=True)
class ExpertGroup:
    """One group of experts: ``key`` is ``<...>.experts.{}.<proj>`` for per-expert tensors
    or the stacked tensor's name; ``plan`` splits its experts over the EP ranks."""

    key: str
    plan: ShardPlan
    stacked: bool


@dataclass(frozen=True)
class TensorLayout:
    """One NVFP4 tensor of the source: its TP plan, and its experts (``group``; ``index``
    is the expert a per-expert tensor holds)."""

    name: str
    plan: AnyPlan
    group: ExpertGroup | None = None
    index: int | None = None

    def local_name(self, ep_rank: int) -> str | None:
        """The name EP rank ``ep_rank`` stores this tensor under, or ``None`` when it holds
        none of it (another rank's expert)."""
        if self.group is None or self.group.stacked:
            return self.name
        assert self.index is not None
        r = self.group.plan[ep_rank]
        if not r.start <= self.index < r.stop:
            return None
        return self.group.key.format(self.index - r.start)


@dataclass(frozen=True)
class ShardLayout:
    """Every rank's share of a checkpoint (module docstring)."""

    tp: int
    ep: int
    align: int
    tensors: dict[str, TensorLayout]
    experts: dict[str, ExpertGroup]

    @property
    def world(self) -> int:
        """The number of ranks (``tp * ep``)."""
        return self.tp * self.ep

    def split(self, rank: int) -> tuple[int, int]:
        """``(ep_rank, tp_rank)`` of ``rank``."""
        return divmod(rank, self.tp)

    def held(self, rank: int) -> Iterator[tuple[str, TensorLayout]]:
        """``(local name, tensor)`` of every NVFP4 tensor ``rank`` holds, in source order."""
        ep_rank, _ = self.split(rank)
        for t in self.tensors.values():
            local = t.local_name(ep_rank)
            if local is not None:
                yield local, t

    def shard(self, planes: NVFP4Planes, t: TensorLayout, rank: int, local: str) -> NVFP4Planes:
        """``rank``'s shard of ``t``'s planes (experts first, then the TP plan), named
        ``local``."""
        ep_rank, tp_rank = self.split(rank)
        if t.group is not None and t.group.stacked:
            planes = shard_planes(planes, t.group.plan, ep_rank)
        if isinstance(t.plan, FusedPlan):
            return shard_fused(planes, t.plan, tp_rank).replace(name=local)
        return shard_planes(planes, t.plan, tp_rank).replace(name=local)

    def manifest(self, flavour: str, source: str) -> dict[str, Any]:
        """The manifest of this layout (``shard-manifest.json``)."""
        return {
            "spec_version": SHARD_SPEC,
            "flavour": flavour,
            "source": source,
            "tp": self.tp,
            "ep": self.ep,
            "world": self.world,
            "rank_order": RANK_ORDER,
            "align_blocks": self.align,
            "tensors": {name: plan_entry(t.plan) for name, t in self.tensors.items()},
            "experts": {
                key: {**plan_entry(g.plan), "stacked": g.stacked} for key, g in self.experts.items()
            },
        }


def _check_gguf_ranges(path: Path, plan: AnyPlan) -> None:
    """Every K range of a GGUF rank starts and ends on a 64-value super-block."""
    if isinstance(plan, FusedPlan) or plan.dim != "k":
        return
    for r in plan:
        if r.start % GGUF_SUPER_BLOCK or r.padded % GGUF_SUPER_BLOCK:
            raise CheckpointError(
                f"{path}: tensor {plan.name!r}: rank {r.rank}'s K range [{r.start}, {r.stop}) "
                f"padded to {r.padded}: expected multiples of {GGUF_SUPER_BLOCK} (a GGUF NVFP4 "
                "super-block is never cut), found a cut inside one"
            )


def build_layout(
    ck: Checkpoint, *, tp: int, ep: int, align: int, config: Mapping[str, Any] | None = None
) -> ShardLayout:
    """The layout of ``ck`` at ``tp * ep`` ranks (module docstring); ``config`` gives the
    attention heads (by default ``ck.config``).

    Raises:
        CheckpointError: ``--ep`` above 1 for a checkpoint without experts, an alignment a
            GGUF cannot hold, or a plan that cuts a block or a super-block; the message
            names the checkpoint, the tensor, and what was expected and found.
    """
    if ck.flavour == "gguf" and align % GGUF_ALIGN:
        raise CheckpointError(
            f"{ck.path}: --align {align}: expected a multiple of {GGUF_ALIGN} blocks for GGUF "
            f"(its NVFP4 super-block is {GGUF_SUPER_BLOCK} values and cannot be cut), found "
            f"{align}"
        )
    try:
        groups: dict[str, ExpertGroup] = {}
        member_of: dict[str, tuple[ExpertGroup, int]] = {}
        for key, members in ck.expert_groups().items():
            group = ExpertGroup(key, expert_plan(len(members), ep, name=key), stacked=False)
            groups[key] = group
            member_of.update({m: (group, i) for i, m in enumerate(members)})
        tensors: dict[str, TensorLayout] = {}
        for name in ck.quantized_names():
            shape = ck.plane_shape(name).shape
            plan = plan_for(
                name,
                int(shape[-2]),
                int(shape[-1]),
                tp,
                align,
                ck.config if config is None else config,
                recorded_partitions(ck, name),
            )
            if ck.flavour == "gguf":
                _check_gguf_ranges(ck.path, plan)
            if len(shape) == 3:
                group = ExpertGroup(name, expert_plan(int(shape[0]), ep, name=name), stacked=True)
                groups[name] = group
                tensors[name] = TensorLayout(name, plan, group)
            elif name in member_of:
                group, index = member_of[name]
                tensors[name] = TensorLayout(name, plan, group, index)
            else:
                tensors[name] = TensorLayout(name, plan)
    except PlaneError as e:
        raise CheckpointError(f"{ck.path}: {e}") from None
    if ep > 1 and not groups:
        raise CheckpointError(
            f"{ck.path}: --ep {ep}: expected MoE experts (<...>.experts.<i>.<proj> tensors or "
            "stacked [E, N, K] ones), found none"
        )
    return ShardLayout(tp, ep, align, tensors, groups)
