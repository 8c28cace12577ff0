"""Starting the ranks of a tensor-parallel run from the environment ``torchrun`` sets.

``torchrun --nproc-per-node N -m nvfp4_torch generate ...`` starts N copies of the command
with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` set (on
several machines: the same command on each, with ``--nnodes``, ``--node-rank`` and
``--rdzv-endpoint`` or ``--master-addr``). :func:`torchrun_world` reads the world size
(1 without torchrun), :func:`init_from_env` joins the process group: NCCL when the backend
computes on an NVIDIA / AMD GPU through torch (its native arrays are CUDA tensors) and torch
sees a GPU, gloo otherwise (CPU backends, and any backend whose arrays are not torch's).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Launch", "init_from_env", "process_group_backend", "torchrun_world"]

#: The variables torchrun sets that a rank needs.
ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class Launch:
    """This process's place in the run: global rank, world size, rank on its machine, and
    the torch.distributed backend joined (``"gloo"`` or ``"nccl"``)."""

    rank: int
    world: int
    local_rank: int
    process_group: str


def _int_env(name: str, default: int | None) -> int:
    raw = os.environ.get(name)
    if raw is None:
        if default is None:
            raise ValueError(f"environment variable {name}: expected an integer, found none set")
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(
            f"environment variable {name}: expected an integer, found {raw!r}"
        ) from None


def torchrun_world() -> int:
    """``WORLD_SIZE`` from the environment (1 when torchrun did not start this process).

    Raises:
        ValueError: ``WORLD_SIZE`` is set but not an integer >= 1.
    """
    world = _int_env("WORLD_SIZE", 1)
    if world < 1:
        raise ValueError(f"environment variable WORLD_SIZE: expected >= 1, found {world}")
    return world


def process_group_backend(backend: Any) -> str:
    """``"nccl"`` when ``backend`` (an :class:`nvfp4.Frontend`) keeps its arrays as CUDA
    tensors (the Triton backends on NVIDIA / AMD GPUs) and NCCL is available, else
    ``"gloo"``."""
    import torch
    import torch.distributed as dist

    native = backend.from_numpy(np.zeros(1, np.float32))
    on_gpu = bool(getattr(native, "is_cuda", False)) and torch.cuda.is_available()
    return "nccl" if on_gpu and dist.is_nccl_available() else "gloo"


def init_from_env(backend: Any) -> Launch:
    """Join the process group torchrun describes (``init_method="env://"``), on the
    process-group backend :func:`process_group_backend` picks; with NCCL, this process's
    GPU is ``LOCAL_RANK``.

    Raises:
        ValueError: a variable of :data:`ENV` is missing or malformed (the message names it).
    """
    import torch
    import torch.distributed as dist

    missing = [name for name in ENV if name not in os.environ]
    if missing:
        raise ValueError(
            f"tensor-parallel run: environment variables {', '.join(missing)} are not set "
            "(start the command with torchrun --nproc-per-node N)"
        )
    rank, world = _int_env("RANK", None), torchrun_world()
    local_rank = _int_env("LOCAL_RANK", None)
    if not 0 <= rank < world:
        raise ValueError(f"environment variable RANK: expected 0..{world - 1}, found {rank}")
    pg = process_group_backend(backend)
    if pg == "nccl":
        torch.cuda.set_device(local_rank)
    dist.init_process_group(pg, init_method="env://", rank=rank, world_size=world)
    return Launch(rank, world, local_rank, pg)
