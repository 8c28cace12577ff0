"""How a flavour is read and written: the row of the table that drives
:func:`~nvfp4_checkpoints.open_checkpoint` and :func:`~nvfp4_checkpoints.write_checkpoint`.

Each flavour module (:mod:`.modelopt`, :mod:`.compressed_tensors`, :mod:`.mlx`,
:mod:`.gguf`) defines its :class:`FlavourIO`; :mod:`.api` gathers them in one table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .checkpoint import Checkpoint
from .flavours import Flavour
from .source import Progress, Source

__all__ = ["FlavourIO", "WriteOptions", "accept_any_source"]


@dataclass(frozen=True)
class WriteOptions:
    """What every writer is told besides its source."""

    progress: Progress | None
    #: Hugging Face outputs are split into shards of at most this many bytes.
    max_shard_bytes: int


def accept_any_source(src: Source) -> None:
    """The :attr:`FlavourIO.check` of a flavour that refuses nothing up front."""


@dataclass(frozen=True)
class FlavourIO:
    """One flavour: its reader, its writer and the refusals made before anything is written.

    * ``read(path)`` opens a checkpoint of the flavour (the flavour already detected);
    * ``check(src)`` raises for what the flavour cannot take, before the destination is
      touched;
    * ``write(tmp, src, options)`` writes the output at ``tmp`` (a fresh path: a directory
      or a file is created there; :func:`~nvfp4_checkpoints.destination.destination` renames
      it onto the destination) and returns the notes to log once it is in place.
    """

    flavour: Flavour
    read: Callable[[Path], Checkpoint]
    write: Callable[[Path, Source, WriteOptions], list[str]]
    check: Callable[[Source], None] = accept_any_source
