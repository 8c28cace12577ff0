"""Greedy decoding of several prompts at several tensor-parallel world sizes in one spawn
of processes: what tier T7's greedy parity (T6 at TP > 1) and this package's tests run.

:func:`greedy_on_ranks` spawns ``max(worlds)`` gloo ranks once
(:func:`nvfp4_torch.ranks.run_worlds`); each rank loads the checkpoint once (for every world
size it takes part in), and for each world size builds a
:class:`~nvfp4_torch.parallel_decoder.ParallelDecoder` on that group's ranks and decodes
every prompt. Every rank writes the tokens it chose; rank 0 also the logits each was chosen
from and the wall times. The parent reads them back as :class:`WorldRun` per world size.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["WorldRun", "greedy_on_ranks"]

#: This process's loaded checkpoints (a rank decodes at several world sizes: one load).
_MODELS: dict[str, tuple[Any, float]] = {}


@dataclass
class WorldRun:
    """One world size's decoding of every prompt.

    Attributes:
        world: the number of ranks.
        new_ids: rank 0's tokens, one list per prompt.
        logits: rank 0's float32 logits ``[steps, vocab]`` per prompt.
        ranks_agree: whether every rank chose rank 0's tokens.
        load_seconds: rank 0's checkpoint load (0 when loaded for an earlier world size).
        shard_seconds: rank 0's cutting and preparing its shards.
        decode_seconds: rank 0's decoding of each prompt (prompt pass included).
    """

    world: int
    new_ids: list[list[int]]
    logits: list[npt.NDArray[np.float32]]
    ranks_agree: bool
    load_seconds: float
    shard_seconds: float
    decode_seconds: list[float]


def _model(checkpoint: str) -> tuple[Any, float]:
    """The checkpoint's model, linears unbound, loaded once in this process; the seconds the
    load took (0 after the first time)."""
    if checkpoint in _MODELS:
        return _MODELS[checkpoint][0], 0.0
    from .loader import load_causal_lm

    t0 = time.perf_counter()
    model = load_causal_lm(checkpoint, use_cache=True)
    _MODELS[checkpoint] = (model, time.perf_counter() - t0)
    return _MODELS[checkpoint]


def rank_greedy(
    ops: Any,
    folder: str,
    checkpoint: str,
    backend_name: str,
    prompts: list[list[int]],
    max_new_tokens: int,
    fuse: bool,
) -> None:
    """One rank of one world size (``ops``: a :class:`nvfp4_torch.ranks.GroupOps`): decode
    every prompt, write ``w<world>_r<rank>.json`` (and rank 0 ``w<world>_logits.npz``)."""
    import nvfp4

    from . import decode
    from .parallel_decoder import ParallelDecoder

    model, load_s = _model(checkpoint)
    backend = nvfp4.get_backend(backend_name)
    t0 = time.perf_counter()
    capacity = max(len(p) for p in prompts) + max_new_tokens
    decoder = ParallelDecoder(model, capacity, backend, group=ops.group, fuse=fuse)
    shard_s = time.perf_counter() - t0
    ids, seconds = [], []
    logits: dict[str, Any] = {}
    for i, prompt in enumerate(prompts):
        t1 = time.perf_counter()
        result = decode.greedy(model, prompt, max_new_tokens, lean=decoder)
        seconds.append(time.perf_counter() - t1)
        ids.append(result.new_ids)
        logits[f"p{i}"] = result.logits
    record = {"new_ids": ids, "load_s": load_s, "shard_s": shard_s, "decode_s": seconds}
    out = Path(folder)
    (out / f"w{ops.world}_r{ops.rank}.json").write_text(json.dumps(record), encoding="utf-8")
    if ops.rank == 0:
        np.savez(out / f"w{ops.world}_logits.npz", **logits)


def greedy_on_ranks(
    checkpoint: str | Path,
    backend_name: str,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    worlds: Sequence[int],
    folder: str | Path,
    *,
    fuse: bool = False,
    env: dict[str, str] | None = None,
) -> dict[int, WorldRun]:
    """Greedy-decode every prompt on ``backend_name`` (resolved by each rank with
    :func:`nvfp4.get_backend`) at every world size of ``worlds``, in one spawn of
    ``max(worlds)`` gloo ranks; ``folder`` receives the ranks' files. ``env`` is set for the
    ranks (a backend's thread count when ranks share few cores).

    Raises:
        torch.multiprocessing.ProcessRaisedException: a rank raised (its traceback).
    """
    from .ranks import run_worlds

    out = Path(folder)
    lists = [[int(i) for i in p] for p in prompts]
    args = (str(out), str(checkpoint), backend_name, lists, int(max_new_tokens), fuse)
    run_worlds(rank_greedy, worlds, args, env=env)
    runs = {}
    for world in worlds:
        records = [
            json.loads((out / f"w{world}_r{r}.json").read_text(encoding="utf-8"))
            for r in range(world)
        ]
        npz = np.load(out / f"w{world}_logits.npz")
        first = records[0]
        runs[world] = WorldRun(
            world=world,
            new_ids=first["new_ids"],
            logits=[npz[f"p{i}"] for i in range(len(lists))],
            ranks_agree=all(r["new_ids"] == first["new_ids"] for r in records),
            load_seconds=float(first["load_s"]),
            shard_seconds=float(first["shard_s"]),
            decode_seconds=[float(s) for s in first["decode_s"]],
        )
    return runs
