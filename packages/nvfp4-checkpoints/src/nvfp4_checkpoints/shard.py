"""``nvfp4 shard``: a pre-sharded checkpoint for tensor parallelism (spec 1.2 draft,
"Sharding"), and its verification.

``shard_checkpoint(SRC, DST, tp=N, align=A)`` writes ``DST/rank-<r>/`` for every rank, each a
checkpoint of SRC's flavour (ModelOpt, compressed-tensors or MLX; GGUF is refused: its
super-blocks of 256 values and its one-file layout do not hold per-rank shards) that our
loader opens alone, and ``DST/shard-manifest.json``. Every NVFP4 tensor is cut by the shard
plan (:mod:`nvfp4.shard_plan`), chosen by its name:

* row-parallel (``o_proj``, ``down_proj``, ``w2``): K in whole blocks, ``align`` blocks a
  unit; ``o_proj`` by whole attention heads when ``config.json`` gives them;
* ``q_proj`` / ``k_proj`` / ``v_proj``: whole heads (KV heads replicated where fewer than
  ranks); ``gate_proj`` / ``up_proj`` / ``w1`` / ``w3``: the down projection's K plan (the
  paired rule); any other NVFP4 tensor: N at any row.

Zero padding (codes 0, scale bytes 0x00) fills a partial last unit. Other tensors
(embeddings, norms) are copied to every rank, and every rank keeps SRC's ``config.json``:
the manifest, not the config, gives each rank's shapes. The manifest gives, for every NVFP4
tensor, the dimension split, each rank's ``[start, stop)`` and padded size, and the spec
version. The whole DST is written under a temporary sibling and renamed at the end.

:func:`verify_sharded` checks a sharded DST against its SRC: the manifest against the plan,
every rank folder present, every shard equal byte for byte to the source's shard by the
plan (padding included: zeros).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Final

import numpy as np
from nvfp4.planes import NVFP4Planes
from nvfp4.shard_plan import ShardPlan, ShardRange, head_plan, paired_plan, shard_plan
from nvfp4.shard_planes import shard_planes

from .api import open_checkpoint, write_checkpoint
from .checkpoint import Checkpoint
from .folder import CheckpointError
from .hf import SHARD_MANIFEST

__all__ = ["MANIFEST", "plan_for", "shard_checkpoint", "verify_sharded"]

MANIFEST: Final = SHARD_MANIFEST
#: The spec version whose plan the manifest follows.
SHARD_SPEC = "1.2-draft"
ROW_PARALLEL = ("o_proj", "down_proj", "w2")
PAIRED_COLUMN = ("gate_proj", "up_proj", "w1", "w3")
HEADS = ("q_proj", "k_proj", "v_proj")


def _heads(config: dict[str, Any]) -> tuple[int, int, int] | None:
    heads = config.get("num_attention_heads")
    kv = config.get("num_key_value_heads", heads)
    hidden = config.get("hidden_size")
    dim = config.get("head_dim") or (hidden // heads if heads and hidden else None)
    if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (heads, kv, dim)):
        return int(heads), int(kv), int(dim)  # type: ignore[arg-type]
    return None


def plan_for(name: str, n: int, k: int, tp: int, align: int, config: dict[str, Any]) -> ShardPlan:
    """The plan of NVFP4 tensor ``name`` (``[N, K]``) at ``tp`` ranks (module docstring)."""
    leaf = name.rsplit(".", 1)[-1]
    heads = _heads(config)
    if leaf in ROW_PARALLEL:
        if leaf == "o_proj" and heads is not None and heads[0] * heads[2] == k:
            return head_plan(*heads, tp, name=name).o_k()
        return shard_plan(k, tp, dim="k", align=align, name=name)
    if leaf in HEADS and heads is not None:
        h = head_plan(*heads, tp, name=name)
        rows = h.q_rows() if leaf == "q_proj" else h.kv_rows_plan(name=name)
        if rows.size == n:
            return rows
    if leaf in PAIRED_COLUMN and n % 16 == 0:
        return paired_plan(shard_plan(n, tp, dim="k", align=align, name=name), name=name)
    return shard_plan(n, tp, dim="n", name=name)


def _entry(plan: ShardPlan) -> dict[str, Any]:
    return {
        "dim": plan.dim,
        "size": plan.size,
        "unit": plan.unit,
        "ranks": [[r.start, r.stop, r.padded] for r in plan],
    }


def _plan_from(entry: Any, name: str, tp: int, where: Path) -> ShardPlan:
    """The plan a manifest entry states, every value checked where it is read."""
    if not isinstance(entry, dict):
        raise CheckpointError(f"{where}: tensor {name!r}: expected an object, found {entry!r}")
    dim, size, unit, ranks = (entry.get(k) for k in ("dim", "size", "unit", "ranks"))
    ok_ranks = (
        isinstance(ranks, list)
        and len(ranks) == tp
        and all(
            isinstance(r, list)
            and len(r) == 3
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in r)
            for r in ranks
        )
    )
    if (
        dim not in ("n", "k")
        or not isinstance(size, int)
        or not isinstance(unit, int)
        or not ok_ranks
    ):
        raise CheckpointError(
            f"{where}: tensor {name!r}: expected dim 'n'/'k', integer size and unit and "
            f"{tp} [start, stop, padded] ranks, found {json.dumps(entry)[:200]}"
        )
    assert isinstance(ranks, list)
    return ShardPlan(
        name, dim, size, tp, unit, tuple(ShardRange(i, *r) for i, r in enumerate(ranks))
    )


def _rank_planes(ck: Checkpoint, plans: dict[str, ShardPlan], rank: int) -> dict[str, NVFP4Planes]:
    return {name: shard_planes(ck.planes(name), plan, rank) for name, plan in plans.items()}


def shard_checkpoint(
    src: str | os.PathLike[str], dst: str | os.PathLike[str], *, tp: int, align: int = 1
) -> Path:
    """Write the pre-sharded checkpoint of ``src`` at ``dst`` (module docstring); ``dst``
    must not exist. Returns ``dst``.

    Raises:
        CheckpointError: a GGUF source, an existing ``dst``, bad ``tp`` / ``align``.
        PlaneError: a tensor the plan cannot split (naming the tensor, the dimension, the
            split and the alignment).
    """
    target = Path(dst)
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise CheckpointError(f"--tp: expected an integer >= 1, found {tp!r}")
    if isinstance(align, bool) or not isinstance(align, int) or align < 1:
        raise CheckpointError(f"--align: expected an integer >= 1 (blocks), found {align!r}")
    if target.exists() or target.is_symlink():
        raise CheckpointError(f"{target}: exists; nvfp4 shard writes a new folder")
    with open_checkpoint(src) as ck:
        if ck.flavour == "gguf":
            raise CheckpointError(
                f"{ck.path}: GGUF cannot be sharded (one file, 256-value super-blocks): "
                "convert it to modelopt, compressed-tensors or mlx first"
            )
        plans = {}
        for name in ck.quantized_names():
            shape = ck.plane_shape(name)
            n, k = int(shape.shape[-2]), int(shape.shape[-1])
            plans[name] = plan_for(name, n, k, tp, align, ck.config)
        tmp = target.parent / f".{target.name}.nvfp4-shard-tmp"
        if tmp.exists():
            shutil.rmtree(tmp)  # our own leftover of an interrupted run (hidden, named ours)
        tmp.mkdir(parents=True)
        try:
            tensors = {name: ck.tensor(name) for name in ck.tensor_names()}
            scales = {n: s for n in ck.quantized_names() if (s := ck.input_scale(n)) is not None}
            for rank in range(tp):
                write_checkpoint(
                    tmp / f"rank-{rank}",
                    _rank_planes(ck, plans, rank),
                    flavour=ck.flavour,
                    tensors=tensors,
                    config=ck.config,
                    input_scales=scales,
                )
            manifest = {
                "spec_version": SHARD_SPEC,
                "flavour": ck.flavour,
                "tp": tp,
                "align_blocks": align,
                "source": ck.path.name,
                "tensors": {name: _entry(plan) for name, plan in plans.items()},
            }
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
            tmp.rename(target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


def is_sharded(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a folder written by :func:`shard_checkpoint`."""
    return (Path(path) / MANIFEST).is_file()


def verify_sharded(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> str:
    """Check the sharded ``dst`` against ``src``; returns a one-line verdict.

    Raises:
        CheckpointError: the manifest disagrees with the plan or the files, a rank folder
            is missing, or a shard differs from the source's (naming file, tensor, rank).
    """
    where = Path(dst) / MANIFEST
    try:
        manifest = json.loads(where.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{where}: not a readable JSON manifest: {e}") from None
    tp = manifest.get("tp") if isinstance(manifest, dict) else None
    align = manifest.get("align_blocks") if isinstance(manifest, dict) else None
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise CheckpointError(f"{where}: tp: expected an integer >= 1, found {tp!r}")
    if isinstance(align, bool) or not isinstance(align, int) or align < 1:
        raise CheckpointError(f"{where}: align_blocks: expected an integer >= 1, found {align!r}")
    entries = manifest.get("tensors")
    if not isinstance(entries, dict):
        raise CheckpointError(f"{where}: tensors: expected an object")
    with open_checkpoint(src) as ck:
        names = ck.quantized_names()
        if sorted(entries) != sorted(names):
            missing = sorted(set(names) - set(entries)) or sorted(set(entries) - set(names))
            raise CheckpointError(
                f"{where}: tensors: expected the source's {len(names)} NVFP4 tensors, "
                f"found {len(entries)} (first disagreeing: {missing[0]!r})"
            )
        plans = {}
        for name in names:
            stated = _plan_from(entries[name], name, tp, where)
            shape = ck.plane_shape(name)
            want = plan_for(name, int(shape.shape[-2]), int(shape.shape[-1]), tp, align, ck.config)
            if (stated.dim, stated.size, stated.ranges) != (want.dim, want.size, want.ranges):
                raise CheckpointError(
                    f"{where}: tensor {name!r}: expected the plan {_entry(want)}, found "
                    f"{_entry(stated)}"
                )
            plans[name] = want
        for rank in range(tp):
            folder = Path(dst) / f"rank-{rank}"
            if not folder.is_dir():
                raise CheckpointError(f"{folder}: missing (the manifest gives {tp} ranks)")
            with open_checkpoint(folder) as part:
                for name, plan in plans.items():
                    want_p = shard_planes(ck.planes(name), plan, rank)
                    got = part.planes(name)
                    for what in ("codes", "scales", "global_scale"):
                        a, b = getattr(got, what), getattr(want_p, what)
                        same = a.shape == b.shape and np.array_equal(a, b)
                        if (
                            not same
                            and what == "global_scale"
                            and ck.flavour == "compressed-tensors"
                        ):
                            # a compressed-tensors global is a float32 reciprocal: 1 ulp
                            ulps = np.abs(a.view(np.int32).astype(np.int64) - b.view(np.int32))
                            same = a.shape == b.shape and bool(np.all(ulps <= 1))
                        if not same:
                            raise CheckpointError(
                                f"{folder}: tensor {name!r} rank {rank}: {what} differ from "
                                f"the source's shard (expected shape {b.shape}, found {a.shape})"
                            )
    return (
        f"SAME (sharded, tp={tp}, align={align} blocks): {len(plans)} NVFP4 tensors, every "
        "rank's shard byte-identical to the source's by the plan, padding zero"
    )
