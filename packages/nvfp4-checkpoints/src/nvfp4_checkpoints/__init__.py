"""NVFP4 checkpoints: read ModelOpt, compressed-tensors, MLX and GGUF; write all four.

The checkpoint tooling of the NVFP4 standard, on top of ``nvfp4`` (nvfp4-core):

* :func:`open_checkpoint` -> :class:`Checkpoint`: lazy (memory-mapped, one tensor at a
  time) access to the canonical planes, the activations' input scales (DECODE convention),
  the other tensors, MoE expert groups and fused q/k/v, gate/up groups;
* :func:`write_checkpoint`: convert a checkpoint to another flavour, streaming and atomic;
* :func:`write_modelopt`, :func:`write_compressed_tensors`, :func:`write_mlx`,
  :func:`write_gguf`: write from mappings of planes and tensors;
* :func:`detect_flavour`, :class:`CheckpointError`;
* the ``nvfp4`` command (:mod:`nvfp4_checkpoints.cli`: ``inspect | convert | verify``).

The byte layouts are those of :mod:`nvfp4.layouts`; this package only moves tensors in and
out of files. The MLX-native directory and the GGUF conventions are documented in
:mod:`nvfp4_checkpoints.writers`.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .atomic import atomic_output, clean_stale
from .flavours import FLAVOURS, CheckpointError, Flavour, detect_flavour
from .reader import Checkpoint, PlaneShape, open_checkpoint
from .writers import (
    DEFAULT_MAX_SHARD_BYTES,
    Progress,
    write_checkpoint,
    write_compressed_tensors,
    write_gguf,
    write_mlx,
    write_modelopt,
)

__all__ = [
    "DEFAULT_MAX_SHARD_BYTES",
    "FLAVOURS",
    "Checkpoint",
    "CheckpointError",
    "Flavour",
    "PlaneShape",
    "Progress",
    "atomic_output",
    "clean_stale",
    "detect_flavour",
    "open_checkpoint",
    "write_checkpoint",
    "write_compressed_tensors",
    "write_gguf",
    "write_mlx",
    "write_modelopt",
]
