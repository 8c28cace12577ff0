"""NVFP4 checkpoints: read ModelOpt, compressed-tensors, MLX and GGUF; write all four.

The checkpoint tooling of the NVFP4 standard, on top of ``nvfp4`` (nvfp4-core):

* :func:`open_checkpoint` -> :class:`Checkpoint`: lazy (memory-mapped, one tensor at a
  time) access to the canonical planes, the activations' input scales (DECODE convention),
  the other tensors, MoE expert groups and fused q/k/v, gate/up groups;
* :func:`write_checkpoint`: write a checkpoint of any flavour, from an opened checkpoint (a
  conversion) or from mappings of planes and tensors, streaming and atomic;
* :func:`load_rank` -> :class:`RankShard`: one tensor-parallel rank's shards, reading that
  rank's bytes only (:mod:`.rank_loading`);
* :func:`detect_flavour`, :class:`CheckpointError`;
* the ``nvfp4`` command (:mod:`nvfp4_checkpoints.cli`: ``inspect | convert | verify``).

One module per flavour holds its reader and its writer (:mod:`.modelopt`,
:mod:`.compressed_tensors`, :mod:`.mlx`, the :mod:`.gguf` package), on shared primitives:
:mod:`.safetensors_io` and :mod:`.hf` (Hugging Face directories of safetensors files),
:mod:`.source` (what a writer reads, in which order), :mod:`.folder` (what a checkpoint
folder may contain: containment, limits, the checks of every value read),
:mod:`.destination` (the output's life cycle: a temporary sibling renamed into place
without replacing what it was not asked to) and :mod:`.overlapped` (writes from a second
thread). :mod:`.api` drives them from one table of flavours. The byte layouts are
those of :mod:`nvfp4.layouts`; this package only moves tensors in and out of files.
"""

from __future__ import annotations

from ._version import __version__
from .api import FLAVOUR_IO, open_checkpoint, write_checkpoint
from .checkpoint import Checkpoint, PlaneShape
from .destination import destination, recover
from .flavours import FLAVOURS, CheckpointError, Flavour, detect_flavour
from .hf import DEFAULT_MAX_SHARD_BYTES
from .rank_loading import RankShard, load_rank
from .source import Progress

__all__ = [
    "DEFAULT_MAX_SHARD_BYTES",
    "FLAVOURS",
    "FLAVOUR_IO",
    "Checkpoint",
    "CheckpointError",
    "Flavour",
    "PlaneShape",
    "Progress",
    "RankShard",
    "__version__",
    "destination",
    "detect_flavour",
    "load_rank",
    "open_checkpoint",
    "recover",
    "write_checkpoint",
]
