"""Run a function on every rank of real ``torch.distributed`` process groups (gloo, on
CPUs), for code that holds numpy arrays and no torch: the conformance suite's tier T7.

:func:`run_worlds` spawns ``max(worlds)`` processes once (``torch.multiprocessing``) and,
for every world size in ``worlds``, makes ranks ``0 .. world-1`` a group
(``torch.distributed.new_group``) and calls ``fn(ops, *args)`` on them, where ``ops`` is a
:class:`GroupOps`: the rank, the world size and the group's collectives on numpy arrays
(:mod:`nvfp4_torch.collectives`: float32 all-reduce, uneven all-gather). Starting the
processes once keeps the cost to one interpreter (and one torch import) a rank.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["GroupOps", "distributed_available", "run_worlds"]


def distributed_available() -> bool:
    """Whether this torch build has torch.distributed with the gloo backend."""
    import torch.distributed as dist

    return bool(dist.is_available() and dist.is_gloo_available())


class GroupOps:
    """One rank's view of its group: ``rank``, ``world`` and numpy collectives."""

    def __init__(self, rank: int, world: int, group: Any) -> None:
        self.rank = rank
        self.world = world
        self.group = group

    def all_reduce_f32(self, partial: npt.NDArray[Any]) -> npt.NDArray[np.float32]:
        """The float32 sum over the group of every rank's ``partial`` (taken as float32)."""
        import torch

        from .collectives import all_reduce_f32

        t = torch.from_numpy(np.ascontiguousarray(partial, dtype=np.float32))
        return np.asarray(all_reduce_f32(t, self.group).numpy())

    def all_gather_last(
        self, local: npt.NDArray[Any], widths: Sequence[int]
    ) -> npt.NDArray[np.float32]:
        """Every rank's ``local [..., widths[rank]]`` (as float32) concatenated in rank
        order along the last axis."""
        import torch

        from .collectives import all_gather_last

        t = torch.from_numpy(np.ascontiguousarray(local, dtype=np.float32))
        return np.asarray(all_gather_last(t, widths, self.group).numpy())


def _rank_main(
    rank: int,
    port: int,
    nprocs: int,
    worlds: tuple[int, ...],
    fn: Callable[..., None],
    args: tuple[Any, ...],
) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=nprocs
    )
    try:
        for world in worlds:
            # every process takes part in creating every group (torch.distributed's rule)
            group = dist.new_group(ranks=list(range(world)), backend="gloo")
            if rank < world:
                fn(GroupOps(rank, world, group), *args)
            dist.barrier()
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_worlds(
    fn: Callable[..., None],
    worlds: Sequence[int],
    args: tuple[Any, ...] = (),
    *,
    env: dict[str, str] | None = None,
) -> None:
    """Call ``fn(ops, *args)`` on every rank of a gloo group of each size in ``worlds``.

    ``fn`` must be importable by name (a module-level function: the ranks are spawned
    interpreters). ``env`` is set for the ranks (and restored here after), for example a
    backend's thread count when many ranks share few cores.

    Raises:
        torch.multiprocessing.ProcessRaisedException: a rank raised (its traceback).
    """
    from torch.multiprocessing import spawn

    sizes = tuple(int(w) for w in worlds)
    if not sizes or min(sizes) < 1:
        raise ValueError(f"run_worlds: world sizes must be >= 1, found {sizes}")
    saved = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    try:
        spawn(
            _rank_main,
            args=(_free_port(), max(sizes), sizes, fn, args),
            nprocs=max(sizes),
            join=True,
        )
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
