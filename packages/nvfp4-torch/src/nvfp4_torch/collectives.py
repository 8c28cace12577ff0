"""The collectives of tensor- and expert-parallel NVFP4 layers: thin wrappers over
``torch.distributed`` (gloo on CPUs, NCCL on GPUs; any initialised process group).

* :func:`all_reduce_f32` - the row-parallel sum: every rank's partial output, in float32,
  summed over the group in float32 (spec 1.2, "Sharding": partials are never rounded
  to float16 / bfloat16 before the reduction);
* :func:`all_gather_last` - the column-parallel gather: every rank's columns, of uneven
  widths allowed (the shard plan gives ranks ``0 .. r-1`` one unit more), concatenated in
  rank order along the last dimension. No arithmetic: the values arrive bit for bit (they
  travel as float32, which holds float16 and bfloat16 exactly).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["all_gather_last", "all_reduce_f32", "rank_and_world"]


def rank_and_world(group: Any = None) -> tuple[int, int]:
    """``(rank, world size)`` in ``group`` (the default group when ``None``).

    Raises:
        RuntimeError: when torch.distributed is not initialised (say how to start it).
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "torch.distributed is not initialised: call torch.distributed.init_process_group "
            "(backend 'gloo' on CPUs, 'nccl' on GPUs) first, or launch with torchrun"
        )
    return dist.get_rank(group), dist.get_world_size(group)


def _wire_device(group: Any, device: torch.device) -> torch.device:
    """Where a collective's tensors must be: this rank's GPU for an NCCL group (NCCL moves
    CUDA tensors only), else where they are."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return device


def all_reduce_f32(partial: torch.Tensor, group: Any = None) -> torch.Tensor:
    """The sum over the group of every rank's ``partial``, computed in float32 (a float32
    copy of ``partial`` is reduced; ``partial`` itself is left as it is), on
    ``partial``'s device."""
    wire = _wire_device(group, partial.device)
    t = partial.detach().to(wire, torch.float32, copy=True).contiguous()
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    return t.to(partial.device)


def all_gather_last(local: torch.Tensor, widths: Sequence[int], group: Any = None) -> torch.Tensor:
    """Every rank's ``local [..., widths[rank]]`` concatenated in rank order along the last
    dimension, in ``local``'s dtype. ``widths`` is the same on every rank (the plan's)."""
    rank, world = rank_and_world(group)
    if len(widths) != world:
        raise ValueError(f"all_gather_last: {len(widths)} widths for a group of {world} ranks")
    if local.shape[-1] != widths[rank]:
        raise ValueError(
            f"all_gather_last: rank {rank} holds {local.shape[-1]} columns, its plan says "
            f"{widths[rank]}"
        )
    wide = max(widths)
    wire = _wire_device(group, local.device)
    padded = torch.zeros((*local.shape[:-1], wide), dtype=torch.float32, device=wire)
    padded[..., : local.shape[-1]] = local.detach().to(wire, torch.float32)
    pieces = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(pieces, padded, group=group)
    gathered = torch.cat([p[..., :w] for p, w in zip(pieces, widths, strict=True)], dim=-1)
    return gathered.to(local.device, local.dtype)
