"""Load one rank's share of an NVFP4 checkpoint for tensor parallelism (spec 1.2,
"Sharding"), reading that rank's bytes only.

:func:`load_rank` ``(path, rank, world)`` returns a :class:`RankShard`: the rank's planes of
every NVFP4 tensor (each equal byte for byte to
``nvfp4.shard_planes.shard_planes(whole, plan, rank)``), the plans, the activations' input
scales, and the other tensors (embeddings, norms), which every rank holds whole. Two
sources:

* an unsharded Hugging Face folder (ModelOpt, compressed-tensors, MLX): each tensor's plan
  is :func:`nvfp4_checkpoints.shard.plan_for` (the one naming rule ``nvfp4 shard`` follows),
  and its rank's range is read from the safetensors file by the offsets of its header,
  into fresh arrays. An ``"n"`` plan (output rows) is one contiguous read of the codes and
  one of the scales; a ``"k"`` plan (whole blocks of K) copies each row's column slice
  (codes at ``start / 2`` bytes, or ``start / 8`` MLX words; scales at ``start / 16``) out
  of windows of the file mapped at most 8 MiB at a time, so no other rank's bytes are
  copied and nothing but the result and one window is held. Globals, input scales and partition bounds are
  read whole. The range is then transcoded by the flavour's reader
  (:meth:`~.hf.HFCheckpoint.planes_from_parts`, with the same content validation as a
  whole tensor's, on the bytes read) and padded by :func:`nvfp4.shard_planes.pad_shard`
  (codes 0, scale bytes 0x00).
* a folder written by ``nvfp4 shard --tp N`` of a safetensors flavour (a
  ``shard-manifest.json`` beside ``rank-<r>/``): ``DST/rank-<rank>/`` alone is read, after
  checking the manifest (``tp`` is the world size asked for and ``ep`` 1, every plan it
  states is the plan of :func:`~.shard.plan_for`, every tensor's shape in the rank folder
  is the rank's padded size).

GGUF is refused (one line), unsharded (one file holds every tensor, and its K is stored in
super-blocks of 64 values) and pre-sharded (a GGUF rank's config is its own, so its plan
cannot be checked against the manifest here); so is an expert-parallel manifest (``ep`` >
1): open that rank's folder with :func:`~.api.open_checkpoint`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from nvfp4.fused_plan import FusedPlan
from nvfp4.planes import NVFP4Planes, PlaneError
from nvfp4.shard_plan import ShardPlan, ShardRange
from nvfp4.shard_planes import pad_fused, pad_shard
from nvfp4.spec import BLOCK_SIZE

from .api import open_checkpoint
from .checkpoint import Checkpoint
from .flavours import CheckpointError
from .hf import HFCheckpoint
from .shard import MANIFEST, plan_for, read_manifest
from .shard_layout import AnyPlan, plan_entry, plan_from_entry, recorded_partitions

__all__ = ["RankShard", "load_rank"]


@dataclass(frozen=True)
class RankShard:
    """What rank ``rank`` of ``world`` holds of a checkpoint.

    Attributes:
        path: the folder read (the checkpoint, or ``DST/rank-<rank>`` of a sharded one).
        flavour: its flavour.
        rank, world, align: the rank, the world size and the K alignment in blocks.
        config: the model's ``config.json`` (the whole model's dimensions).
        plans: every NVFP4 tensor's plan (by module prefix).
        planes: every NVFP4 tensor's shard (``plans[name][rank].padded`` rows or K values,
            zero-padded), in fresh arrays.
        input_scales: the activations' DECODE globals of the tensors that have one.
        tensors: every other tensor, whole (replicated on every rank), in fresh arrays.
        bytes_read: the bytes read from the files (codes, scales, globals, other tensors).
    """

    path: Path
    flavour: str
    rank: int
    world: int
    align: int
    config: dict[str, Any]
    plans: Mapping[str, AnyPlan]
    planes: Mapping[str, NVFP4Planes]
    input_scales: Mapping[str, float]
    tensors: Mapping[str, npt.NDArray[Any]]
    bytes_read: int


def _positive(value: object, what: str, where: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CheckpointError(f"{where}: {what}: expected an integer >= 1, found {value!r}")
    return value


def _read_fused(ck: HFCheckpoint, name: str, plan: FusedPlan, rank: int) -> NVFP4Planes:
    """Rank ``rank``'s rows of every partition of fused tensor ``name`` (no padding yet),
    concatenated in partition order: one contiguous read of codes and one of scales a
    partition; globals whole; recorded bounds the rank's logical ones."""
    parts: dict[str, Any] = {}
    for suffix, tensor in ck.part_names(name).items():
        if suffix not in (ck.CODES, ck.SCALES):
            parts[suffix] = ck.store.read(tensor)
            continue
        pieces = [
            ck.store.read(tensor, axis=-2, start=lo + p[rank].start, stop=lo + p[rank].stop)
            for lo, p in zip(plan.bounds, plan, strict=False)
        ]
        parts[suffix] = np.concatenate(pieces, axis=-2)
    if "partitions" in parts:
        parts["partitions"] = np.asarray(plan.logical_bounds(rank), dtype=np.int64)
    return ck.planes_from_parts(name, parts)


def _read_range(ck: HFCheckpoint, name: str, plan: AnyPlan, rank: int) -> NVFP4Planes:
    """Rank ``rank``'s logical range of NVFP4 tensor ``name`` (no padding yet): the codes'
    and scales' rows or columns read alone, the other parts whole."""
    if isinstance(plan, FusedPlan):
        return _read_fused(ck, name, plan, rank)
    r = plan[rank]
    parts: dict[str, Any] = {}
    for suffix, tensor in ck.part_names(name).items():
        if suffix not in (ck.CODES, ck.SCALES):
            parts[suffix] = ck.store.read(tensor)
        elif plan.dim == "n":
            parts[suffix] = ck.store.read(tensor, axis=-2, start=r.start, stop=r.stop)
        else:
            per = ck.CODES_PER_ELEMENT if suffix == ck.CODES else BLOCK_SIZE
            parts[suffix] = ck.store.read(tensor, axis=-1, start=r.start // per, stop=r.stop // per)
    return ck.planes_from_parts(name, parts)


def _nbytes(planes: NVFP4Planes) -> int:
    return int(planes.codes.nbytes + planes.scales.nbytes + planes.global_scale.nbytes)


def _load(
    ck: HFCheckpoint,
    plans: dict[str, AnyPlan],
    rank: int,
    world: int,
    align: int,
    config: dict[str, Any],
) -> RankShard:
    planes: dict[str, NVFP4Planes] = {}
    read = 0
    for name, plan in plans.items():
        try:
            piece = _read_range(ck, name, plan, rank)
            read += _nbytes(piece)
            if isinstance(plan, FusedPlan):
                planes[name] = pad_fused(piece, plan, rank)
            else:
                planes[name] = pad_shard(piece, plan, rank)
        except PlaneError as e:  # the bytes read refused (a NaN scale...): name the file
            raise CheckpointError(f"{ck.path}: {e}") from None
    tensors = {n: ck.store.read(n) for n in ck.tensor_names()}
    scales = {n: s for n in plans if (s := ck.input_scale(n)) is not None}
    return RankShard(
        path=ck.path,
        flavour=ck.flavour,
        rank=rank,
        world=world,
        align=align,
        config=config,
        plans=plans,
        planes=planes,
        input_scales=scales,
        tensors=tensors,
        bytes_read=read + sum(int(t.nbytes) for t in tensors.values()),
    )


def _safetensors(ck: Checkpoint, why: str) -> HFCheckpoint:
    if not isinstance(ck, HFCheckpoint):
        raise CheckpointError(
            f"{ck.path}: {ck.flavour} cannot be loaded a rank at a time ({why}): expected a "
            "safetensors flavour (modelopt, compressed-tensors, mlx); convert it first"
        )
    return ck


def _from_unsharded(path: Path, rank: int, world: int, align: int) -> RankShard:
    with open_checkpoint(path) as opened:
        ck = _safetensors(opened, "one file holds every tensor, K in 64-value super-blocks")
        plans: dict[str, AnyPlan] = {}
        for name in ck.quantized_names():
            shape = ck.plane_shape(name).shape
            bounds = recorded_partitions(ck, name)
            try:
                plans[name] = plan_for(name, shape[-2], shape[-1], world, align, ck.config, bounds)
            except PlaneError as e:  # a split the plan refuses (too few heads, K % 16)
                raise CheckpointError(f"{ck.path}: {e}") from None
        return _load(ck, plans, rank, world, align, ck.config)


def _manifest(root: Path) -> dict[str, Any]:
    manifest = read_manifest(root)
    if not isinstance(manifest.get("tensors"), dict):
        raise CheckpointError(f"{root / MANIFEST}: expected an object with a 'tensors' object")
    return manifest


def _from_sharded(root: Path, rank: int, world: int, align: int | None) -> RankShard:
    where = root / MANIFEST
    manifest = _manifest(root)
    tp = _positive(manifest.get("tp"), "tp", where)
    ep = _positive(manifest.get("ep", 1), "ep", where)
    if tp * ep != world:
        raise CheckpointError(
            f"{where}: tp x ep: expected {world} (the world size asked for), found "
            f"{tp} x {ep} = {tp * ep}"
        )
    if ep != 1:
        raise CheckpointError(
            f"{where}: ep: expected 1 (load_rank loads tensor-parallel ranks; open an "
            f"expert-parallel rank's folder with open_checkpoint), found {ep}"
        )
    if manifest.get("flavour") == "gguf":
        raise CheckpointError(
            f"{where}: flavour: expected a safetensors flavour (modelopt, compressed-tensors, "
            "mlx; a GGUF rank's config is its own, so its plan cannot be checked here: open "
            f"{root / f'rank-{rank}'} with open_checkpoint), found 'gguf'"
        )
    stated_align = _positive(manifest.get("align_blocks"), "align_blocks", where)
    if align is not None and align != stated_align:
        raise CheckpointError(
            f"{where}: align_blocks: expected {align} (the alignment asked for), found "
            f"{stated_align}"
        )
    folder = root / f"rank-{rank}"
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: missing (the manifest gives {tp} ranks)")
    entries: dict[str, Any] = manifest["tensors"]
    with open_checkpoint(folder) as opened:
        ck = _safetensors(opened, "the manifest says another flavour")
        if manifest.get("flavour") != ck.flavour:
            raise CheckpointError(
                f"{where}: flavour: expected {ck.flavour!r} (rank-{rank}'s), found "
                f"{manifest.get('flavour')!r}"
            )
        names = ck.quantized_names()
        if sorted(entries) != sorted(names):
            odd = sorted(set(names) ^ set(entries))[0]
            raise CheckpointError(
                f"{where}: tensors: expected rank-{rank}'s {len(names)} NVFP4 tensors, found "
                f"{len(entries)} (first disagreeing: {odd!r})"
            )
        plans: dict[str, AnyPlan] = {}
        for name in names:
            plan = plan_from_entry(entries[name], name, tp, where)
            n, k = ck.plane_shape(name).shape[-2:]
            if isinstance(plan, FusedPlan):
                dim, padded = "n", plan.padded(rank)
            else:
                dim, padded = ("n" if plan.dim == "n" else "k"), plan[rank].padded
            have = n if dim == "n" else k
            if have != padded:
                raise CheckpointError(
                    f"{folder}: tensor {name!r}: expected {dim.upper()} = {padded} "
                    f"(the manifest's rank {rank}), found {have}"
                )
            whole = (plan.size, k) if dim == "n" else (n, plan.size)
            bounds = None
            if isinstance(plan, FusedPlan) and ck.plane_shape(name).partitions is not None:
                bounds = plan.bounds  # the rank records its own bounds, checked when read
            try:
                want = plan_for(name, *whole, tp, stated_align, ck.config, bounds)
            except PlaneError as e:
                raise CheckpointError(f"{where}: {e}") from None
            if want != plan:
                raise CheckpointError(
                    f"{where}: tensor {name!r}: expected the plan {plan_entry(want)}, found "
                    f"{plan_entry(plan)}"
                )
            plans[name] = plan
        whole_plans = {name: _whole(plans[name], rank) for name in names}
        shard = _load(ck, whole_plans, 0, 1, stated_align, ck.config)
    return replace(shard, rank=rank, world=world, align=stated_align, plans=plans)


def _whole(plan: AnyPlan, rank: int) -> AnyPlan:
    """A one-rank plan covering a rank folder's stored (already padded) dimension: its
    tensors are read whole (a fused tensor's every partition)."""
    if isinstance(plan, FusedPlan):
        parts = tuple(_whole(p, rank) for p in plan)
        return FusedPlan(
            plan.name, tuple(p for p in parts if isinstance(p, ShardPlan)), plan.labels
        )
    padded = plan[rank].padded
    return ShardPlan(plan.name, plan.dim, padded, 1, plan.unit, (ShardRange(0, 0, padded, padded),))


def load_rank(
    path: str | os.PathLike[str], rank: int, world: int, *, align: int | None = None
) -> RankShard:
    """Rank ``rank``'s share of the checkpoint at ``path`` for a world of ``world`` ranks,
    reading that rank's bytes only (module docstring). ``path`` is an unsharded Hugging
    Face folder or the output folder of ``nvfp4 shard``. ``align``: the K alignment in
    blocks (``nvfp4 shard --align``); by default 1, or the manifest's for a sharded folder
    (which must equal it when given).

    Raises:
        CheckpointError: a bad rank, world size or alignment, a GGUF file, a manifest that
            disagrees with the world size, the plan or the rank folder's files, a missing
            rank folder; a tensor the plan cannot split at ``world`` ranks, or whose bytes
            read are refused (an E4M3 NaN scale); and whatever opening the checkpoint
            refuses (one line naming the file, the tensor, the expected and the found).
    """
    world = _positive(world, "world size", "load_rank")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
        raise CheckpointError(
            f"load_rank: rank: expected an integer in [0, {world}), found {rank!r}"
        )
    if align is not None:
        align = _positive(align, "align (blocks)", "load_rank")
    root = Path(path)
    if (root / MANIFEST).is_file():
        return _from_sharded(root, rank, world, align)
    return _from_unsharded(root, rank, world, 1 if align is None else align)
