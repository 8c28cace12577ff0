"""``nvfp4 shard``: a pre-sharded checkpoint for tensor and expert parallelism (spec 1.2,
"Sharding"), and its verification.

``shard_checkpoint(SRC, DST, tp=N, ep=M, align=A)`` writes ``DST/rank-<r>/`` for each of the
``N * M`` ranks and ``DST/shard-manifest.json``. A rank is a checkpoint of SRC's flavour
that our loader opens alone: a Hugging Face folder (ModelOpt, compressed-tensors, MLX), or
for a GGUF SRC one ``.gguf`` file named as SRC (:func:`rank_checkpoint` finds it) of the same
NVFP4 type, with SRC's tokenizer and metadata. What each rank holds is
:mod:`.shard_layout`: every NVFP4 tensor cut by its TP plan (K in whole blocks, whole
GGUF super-blocks for GGUF; heads whole; gate/up paired with down), experts dealt to the EP
ranks with their globals, zero padding (codes 0, scale bytes 0x00) filling a partial last
unit. Other tensors (embeddings, norms, routers) are copied to every rank, and every rank
keeps SRC's ``config.json`` and other files (tokenizer...): the manifest, not the config,
gives each rank's shapes. A GGUF rank's metadata gives the attention heads and the
feed-forward width it holds (llama.cpp takes a file's shapes from its metadata, and its q/k
rows are RoPE-permuted per head, so the head counts must be the file's own). The whole DST
is written under a temporary sibling and renamed at the end; an existing DST is refused
unless it is an empty folder.

:func:`verify_sharded` checks a sharded DST against its SRC: the manifest against the plan,
the rank folders (as many as the manifest's world size, no more), every rank's NVFP4 tensors
(its names, and every shard equal byte for byte to the source's shard by the plan, padding
included: zeros) and its other tensors (equal to the source's).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Final

import numpy as np
from nvfp4.fused_plan import FusedPlan
from nvfp4.planes import NVFP4Planes, PlaneError
from nvfp4.shard_plan import ShardPlan, head_plan
from nvfp4.shard_planes import reassemble_fused

from .api import FLAVOUR_IO, open_checkpoint
from .checkpoint import Checkpoint
from .destination import destination
from .flavour_io import WriteOptions
from .folder import CheckpointError, read_json_file
from .gguf import GGUFCheckpoint
from .gguf.metadata import config_from_metadata
from .hf import DEFAULT_MAX_SHARD_BYTES, SHARD_MANIFEST
from .shard_layout import (
    DOWN_PROJ,
    FUSED_QKV,
    Q_PROJ,
    ShardLayout,
    build_layout,
    default_align,
    heads_of,
    layer_of,
    plan_entry,
    plan_for,
    plan_from_entry,
)
from .source import mapping_source

__all__ = [
    "MANIFEST",
    "is_sharded",
    "plan_for",
    "rank_checkpoint",
    "read_manifest",
    "shard_checkpoint",
    "verify_sharded",
]

MANIFEST: Final = SHARD_MANIFEST
logger = logging.getLogger(__name__)


def _positive(value: object, what: str, unit: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CheckpointError(f"{what}: expected an integer >= 1{unit}, found {value!r}")
    return value


def _rank_config(
    config: Mapping[str, Any], layout: ShardLayout, rank: int, where: Path
) -> dict[str, Any]:
    """A GGUF rank's config: SRC's, with the attention heads and the feed-forward width the
    rank holds. llama.cpp reads a GGUF's shapes from its metadata: its head counts describe
    the file's q/k rows (RoPE-permuted per head) and ``feed_forward_length`` its gate / up
    rows and down columns. A rank whose query heads are no whole groups of its KV heads is
    refused (GGUF cannot say it)."""
    out = dict(config)
    if layout.tp == 1:
        return out
    _, tp_rank = layout.split(rank)
    out.update(_rank_ffn(config, layout, tp_rank))
    heads = heads_of(config)
    if heads is None:
        return out
    cut = [
        t
        for t in layout.tensors.values()
        if (isinstance(t.plan, FusedPlan) and layer_of(t.name) in FUSED_QKV)
        or (
            isinstance(t.plan, ShardPlan)
            and layer_of(t.name) in Q_PROJ
            and t.plan.dim == "n"
            and t.plan.unit == heads[2]
        )
    ]
    if not cut:
        return out
    h = head_plan(*heads, layout.tp, name=cut[0].name)
    q = h.q[tp_rank]
    kv_start, kv_stop = h.kv[tp_rank]
    if q.size % (kv_stop - kv_start):
        raise CheckpointError(
            f"{where}: rank {rank}: {q.size} query heads over {kv_stop - kv_start} KV heads: "
            "expected a multiple (a GGUF's head_count over its head_count_kv), found a "
            f"remainder at tp {layout.tp} ({heads[0]} heads, {heads[1]} KV heads)"
        )
    out.update(
        num_attention_heads=q.size,
        num_key_value_heads=kv_stop - kv_start,
        head_dim=heads[2],
    )
    return out


def _rank_ffn(config: Mapping[str, Any], layout: ShardLayout, tp_rank: int) -> dict[str, int]:
    """The feed-forward widths TP rank ``tp_rank`` holds, for the keys ``config`` has: a
    dense down projection's padded K range gives ``intermediate_size``, an expert's
    ``moe_intermediate_size`` (``intermediate_size`` where the config has no such key and no
    dense MLP, as Mixtral's). Its gate and up rows follow the same plan (the paired rule)."""
    found: dict[str, int] = {}
    for t in layout.tensors.values():
        if (
            layer_of(t.name) not in DOWN_PROJ
            or not isinstance(t.plan, ShardPlan)
            or t.plan.dim != "k"
        ):
            continue
        key = (
            "moe_intermediate_size"
            if t.group is not None and "moe_intermediate_size" in config
            else "intermediate_size"
        )
        found.setdefault(key, t.plan[tp_rank].padded)
    return {key: v for key, v in found.items() if key in config}


def source_config(ck: Checkpoint) -> dict[str, Any]:
    """The config the plan and the ranks follow: SRC's, or for a GGUF that records none
    (llama.cpp's converter writes hyper-parameters only) the one its metadata gives
    (architecture, head counts...), so that heads stay whole and the ranks keep them."""
    if isinstance(ck, GGUFCheckpoint) and not ck.config:
        return config_from_metadata(ck.file, ck.arch)
    return ck.config


def _rank_path(folder: Path, ck: Checkpoint) -> Path:
    return folder / ck.path.name if ck.flavour == "gguf" else folder


def _write_rank(
    ck: Checkpoint, config: dict[str, Any], layout: ShardLayout, rank: int, folder: Path
) -> None:
    """Rank ``rank``'s checkpoint at ``folder`` (a new path), through SRC's flavour writer
    with SRC as its origin (its tokenizer and other files come along); ``config`` is the
    rank's."""
    planes: dict[str, NVFP4Planes] = {}
    inputs: dict[str, float] = {}
    for local, t in layout.held(rank):
        planes[local] = layout.shard(ck.planes(t.name), t, rank, local)
        v = ck.input_scale(t.name)
        if v is not None:
            inputs[local] = v
    tensors = {name: ck.tensor(name) for name in ck.tensor_names()}
    src = mapping_source(planes, tensors, config, inputs)
    src.origin = ck
    io = FLAVOUR_IO[ck.flavour]
    io.check(src)
    if ck.flavour == "gguf":
        folder.mkdir()
    for note in io.write(_rank_path(folder, ck), src, WriteOptions(None, DEFAULT_MAX_SHARD_BYTES)):
        logger.info("rank %d: %s", rank, note)


def shard_checkpoint(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    tp: int = 1,
    ep: int = 1,
    align: int | None = None,
) -> Path:
    """Write the pre-sharded checkpoint of ``src`` at ``dst`` (module docstring): ``tp``
    tensor-parallel times ``ep`` expert-parallel ranks, K in units of ``align`` blocks (by
    default 1, and for GGUF one super-block: 4). ``dst`` must not exist, or be an empty
    folder. Returns ``dst``.

    Raises:
        CheckpointError: bad ``tp`` / ``ep`` / ``align``, an existing ``dst`` that is not
            an empty folder, ``dst`` inside ``src`` or above it, ``--ep`` for a checkpoint
            without experts, or a tensor the plan cannot split (naming the file, the
            tensor, the dimension, the split and the alignment).
    """
    target = Path(dst)
    tp = _positive(tp, "--tp")
    ep = _positive(ep, "--ep")
    if align is not None:
        align = _positive(align, "--align", " (blocks)")
    empty = target.is_dir() and not target.is_symlink() and not any(target.iterdir())
    if (target.exists() or target.is_symlink()) and not empty:
        raise CheckpointError(
            f"{target}: expected a new path or an empty folder, found an existing "
            f"{'folder that is not empty' if target.is_dir() else 'file'}; nvfp4 shard "
            "never deletes it"
        )
    with open_checkpoint(src) as ck:
        source, where = ck.path.resolve(), target.resolve()
        if where == source or where.is_relative_to(source) or source.is_relative_to(where):
            raise CheckpointError(
                f"{target}: expected a destination apart from the source {ck.path}, found it "
                f"{'inside' if where.is_relative_to(source) else 'holding'} the source"
            )
        config = source_config(ck)
        layout = build_layout(
            ck,
            tp=tp,
            ep=ep,
            align=default_align(ck.flavour) if align is None else align,
            config=config,
        )
        configs = [
            _rank_config(config, layout, rank, ck.path) if ck.flavour == "gguf" else config
            for rank in range(layout.world)
        ]
        with destination(target, force=empty, source=ck.path) as tmp:
            tmp.mkdir()
            for rank, rank_config in enumerate(configs):
                _write_rank(ck, rank_config, layout, rank, tmp / f"rank-{rank}")
            manifest = layout.manifest(ck.flavour, ck.path.name)
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return target


def is_sharded(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a folder written by :func:`shard_checkpoint`."""
    return (Path(path) / MANIFEST).is_file()


def read_manifest(dst: Path) -> dict[str, Any]:
    """``DST/shard-manifest.json`` as a JSON object, read within the limits every JSON
    reader keeps (:func:`~.folder.read_json_file`: its size checked before reading, its
    depth and keys bounded)."""
    return read_json_file(dst / MANIFEST)


def rank_checkpoint(dst: str | os.PathLike[str], rank: int) -> Path:
    """The path to open for rank ``rank`` of the sharded ``dst``: ``DST/rank-<r>/``, or the
    ``.gguf`` file in it for a GGUF (named as the manifest's ``source``)."""
    root = Path(dst)
    manifest = read_manifest(root)
    folder = root / f"rank-{rank}"
    if manifest.get("flavour") != "gguf":
        return folder
    name = manifest.get("source")
    if not isinstance(name, str) or not name or Path(name).name != name:
        raise CheckpointError(
            f"{root / MANIFEST}: source: expected the GGUF file name, found {name!r}"
        )
    return folder / name


def _check_manifest(
    manifest: dict[str, Any], layout: ShardLayout, flavour: str, where: Path
) -> None:
    """Every fact of the manifest equal to the layout's (each disagreement named)."""
    want = layout.manifest(flavour, "")
    why = {
        "flavour": "the source's flavour",
        "world": f"tp {layout.tp} x ep {layout.ep}",
        "rank_order": "the only order",
    }
    for key, reason in why.items():
        if key in manifest and manifest[key] != want[key]:
            raise CheckpointError(
                f"{where}: {key}: expected {want[key]!r} ({reason}), found {manifest[key]!r}"
            )
    for section, world in (("tensors", layout.tp), ("experts", layout.ep)):
        stated = manifest.get(section, {} if section == "experts" else None)
        expected = want[section]
        if not isinstance(stated, dict):
            raise CheckpointError(f"{where}: {section}: expected an object, found {stated!r}")
        if sorted(stated) != sorted(expected):
            odd = sorted(set(expected) ^ set(stated))
            raise CheckpointError(
                f"{where}: {section}: expected the source's {len(expected)} entries, found "
                f"{len(stated)} (first disagreeing: {odd[0]!r})"
            )
        for name, entry in expected.items():
            found = plan_entry(plan_from_entry(stated[name], name, world, where))
            disagreeing = _disagreement(entry, found)
            if disagreeing is not None:
                raise CheckpointError(f"{where}: {name!r}: {disagreeing}")


def _disagreement(want: dict[str, Any], found: dict[str, Any]) -> str | None:
    """The first fact of a manifest entry that is not the plan's (``None`` when all are),
    a fused tensor's partitions each compared by its label."""
    if want["dim"] == found["dim"] == "fused":
        labels = [p["label"] for p in want["partitions"]]
        stated = [p["label"] for p in found["partitions"]]
        if stated != labels:
            return f"partitions: expected {labels} by the plan, found {stated}"
    for key in ("dim", "size", "unit"):
        if found.get(key) != want.get(key):
            return f"{key}: expected {want.get(key)!r} by the plan, found {found.get(key)!r}"
    if want["dim"] == "fused":
        for w, f in zip(want["partitions"], found["partitions"], strict=True):
            why = _disagreement(w, f)
            if why is not None:
                return f"partition {w['label']}: {why}"
        return None
    for rank, (a, b) in enumerate(zip(want["ranks"], found["ranks"], strict=True)):
        if a != b:
            return f"rank {rank}'s [start, stop, padded]: expected {a} by the plan, found {b}"
    return None


def _same_global(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any], flavour: str) -> bool:
    if a.shape != b.shape:
        return False
    if np.array_equal(a, b):
        return True
    if flavour != "compressed-tensors":
        return False
    # a compressed-tensors global is a float32 reciprocal: 1 ulp
    ulps = np.abs(a.view(np.int32).astype(np.int64) - b.view(np.int32))
    return bool(np.all(ulps <= 1))


def _check_rank(ck: Checkpoint, part: Checkpoint, layout: ShardLayout, rank: int) -> None:
    """Rank ``rank``'s checkpoint ``part`` against the source's shards by the layout."""
    held = dict(layout.held(rank))
    names = part.quantized_names()
    if sorted(names) != sorted(held):
        odd = sorted(set(held) ^ set(names))
        raise CheckpointError(
            f"{part.path}: expected the {len(held)} NVFP4 tensors of rank {rank} by the plan, "
            f"found {len(names)} (first disagreeing: {odd[0]!r})"
        )
    plain = ck.tensor_names()
    if sorted(part.tensor_names()) != sorted(plain):
        odd = sorted(set(plain) ^ set(part.tensor_names()))
        raise CheckpointError(
            f"{part.path}: expected the source's {len(plain)} other tensors, found "
            f"{len(part.tensor_names())} (first disagreeing: {odd[0]!r})"
        )
    for name in plain:
        a, b = part.tensor(name), ck.tensor(name)
        if a.dtype != b.dtype or a.shape != b.shape or not np.array_equal(a, b):
            raise CheckpointError(
                f"{part.path}: tensor {name!r} (rank {rank}): expected the source's "
                f"{b.dtype} {list(b.shape)}, found {a.dtype} {list(a.shape)} or other values"
            )
    for local, t in held.items():
        want = layout.shard(ck.planes(t.name), t, rank, local)
        got = part.planes(local)
        for what in ("codes", "scales"):
            a, b = getattr(got, what), getattr(want, what)
            if a.shape != b.shape or not np.array_equal(a, b):
                raise CheckpointError(
                    f"{part.path}: tensor {local!r} (rank {rank}, source {t.name!r}): {what}: "
                    f"expected the source's shard by the plan, shape {list(b.shape)}, found "
                    f"{list(a.shape)}{'' if a.shape != b.shape else ' with other bytes'}"
                )
        if not _same_global(got.global_scale, want.global_scale, ck.flavour):
            raise CheckpointError(
                f"{part.path}: tensor {local!r} (rank {rank}, source {t.name!r}): global: "
                f"expected {want.global_scale.tolist()}, found {got.global_scale.tolist()}"
            )


def _check_fused_reassembled(
    ck: Checkpoint, parts: list[Checkpoint], layout: ShardLayout, root: Path
) -> int:
    """Every fused tensor put back from its ranks' pieces, partition by partition
    (:func:`nvfp4.shard_planes.reassemble_fused`: padding zero, replicated KV rows equal),
    equal to the source's bytes; returns how many. Experts dealt to EP ranks are checked
    by :func:`_check_rank` alone (each EP group holds other experts)."""
    count = 0
    for name, t in layout.tensors.items():
        if not isinstance(t.plan, FusedPlan) or layout.ep > 1:
            continue
        try:
            whole = reassemble_fused([p.planes(name) for p in parts], t.plan, name)
        except PlaneError as e:
            raise CheckpointError(f"{root}: {e}") from None
        source = ck.planes(name)
        for what in ("codes", "scales"):
            if not np.array_equal(getattr(whole, what), getattr(source, what)):
                raise CheckpointError(
                    f"{root}: tensor {name!r}: {what} reassembled from the {layout.world} "
                    "ranks per partition: expected the source's bytes, found other bytes"
                )
        if whole.partitions != source.partitions or not _same_global(
            whole.global_scale, source.global_scale, ck.flavour
        ):
            raise CheckpointError(
                f"{root}: tensor {name!r}: reassembled partitions and globals: expected "
                f"{source.partitions} {source.global_scale.tolist()}, found "
                f"{whole.partitions} {whole.global_scale.tolist()}"
            )
        count += 1
    return count


def verify_sharded(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> str:
    """Check the sharded ``dst`` against ``src``; returns a one-line verdict.

    Raises:
        CheckpointError: the manifest disagrees with the plan or the files (a range, a
            shape, the world size), a rank folder is missing or one too many, or a shard
            differs from the source's (naming the file, the tensor and the rank).
    """
    root = Path(dst)
    where = root / MANIFEST
    manifest = read_manifest(root)
    tp = _positive(manifest.get("tp"), f"{where}: tp")
    ep = _positive(manifest.get("ep", 1), f"{where}: ep")
    align = _positive(manifest.get("align_blocks"), f"{where}: align_blocks", " (blocks)")
    with open_checkpoint(src) as ck:
        layout = build_layout(ck, tp=tp, ep=ep, align=align, config=source_config(ck))
        _check_manifest(manifest, layout, ck.flavour, where)
        folders = sorted(p.name for p in root.iterdir() if p.name.startswith("rank-"))
        want = [f"rank-{r}" for r in range(layout.world)]
        for name in want:
            if not (root / name).is_dir():
                raise CheckpointError(
                    f"{root / name}: expected a rank folder (the manifest gives "
                    f"{layout.world} ranks: tp {tp} x ep {ep}), found it missing"
                )
        if len(folders) != len(want):
            extra = sorted(set(folders) - set(want))
            raise CheckpointError(
                f"{root / extra[0]}: expected {layout.world} rank folders (tp {tp} x ep {ep}, "
                f"{where.name}), found {len(folders)}"
            )
        with ExitStack() as stack:
            parts = []
            for rank in range(layout.world):
                part = stack.enter_context(open_checkpoint(rank_checkpoint(root, rank)))
                if part.flavour != ck.flavour:
                    raise CheckpointError(
                        f"{part.path}: expected a {ck.flavour} checkpoint (the source's "
                        f"flavour), found {part.flavour}"
                    )
                _check_rank(ck, part, layout, rank)
                parts.append(part)
            fused = _check_fused_reassembled(ck, parts, layout, root)
    fused_note = f", {fused} fused tensors reassembled per partition" if fused else ""
    experts = f", ep={ep}: {len(layout.experts)} expert groups" if layout.experts else ""
    return (
        f"SAME (sharded, tp={tp}, align={align} blocks{experts}): {len(layout.tensors)} NVFP4 "
        "tensors, every rank's shard byte-identical to the source's by the plan, padding zero"
        f"{fused_note}"
    )
