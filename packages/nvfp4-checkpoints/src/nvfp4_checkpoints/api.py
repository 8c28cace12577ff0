"""The two entry points, driven by one table of flavours: :func:`open_checkpoint` and
:func:`write_checkpoint`.

Every write streams (the output is planned from shapes alone, then written tensor by
tensor; peak memory is about one tensor, one expert stack for GGUF) and is atomic
(:mod:`.destination`): the output appears under its name complete or not at all.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import numpy.typing as npt
from nvfp4.planes import NVFP4Planes, PlaneError

from . import compressed_tensors, gguf, mlx, modelopt
from .checkpoint import Checkpoint
from .compare import compare
from .destination import destination
from .flavour_io import FlavourIO, WriteOptions
from .flavours import FLAVOURS, CheckpointError, detect_flavour
from .hf import DEFAULT_MAX_SHARD_BYTES
from .source import Progress, Source, checkpoint_source, mapping_source

__all__ = ["FLAVOUR_IO", "open_checkpoint", "write_checkpoint"]

#: Every flavour's reader and writer, in the order of :data:`~nvfp4_checkpoints.FLAVOURS`.
FLAVOUR_IO: Final[Mapping[str, FlavourIO]] = {
    io.flavour: io for io in (modelopt.IO, compressed_tensors.IO, mlx.IO, gguf.IO)
}
assert tuple(FLAVOUR_IO) == FLAVOURS
logger = logging.getLogger(__name__)


def open_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Open the NVFP4 checkpoint at ``path`` (a Hugging Face directory or a GGUF file),
    detecting its flavour. Reads headers and configs only.

    Raises :class:`~nvfp4_checkpoints.CheckpointError` for a missing path, an unknown
    flavour, an unreadable or lying file header, or an index naming missing shards.
    """
    p = Path(path)
    return FLAVOUR_IO[detect_flavour(p)].read(p)


def _source(
    source: Checkpoint | Mapping[str, NVFP4Planes],
    tensors: Mapping[str, npt.ArrayLike] | None,
    config: Mapping[str, Any] | None,
    input_scales: Mapping[str, float] | None,
) -> Source:
    if isinstance(source, Checkpoint):
        given = [
            k
            for k, v in (("tensors", tensors), ("config", config), ("input_scales", input_scales))
            if v is not None
        ]
        if given:
            raise TypeError(
                f"write_checkpoint: {', '.join(given)} come from the checkpoint itself when "
                "the source is an opened Checkpoint"
            )
        return checkpoint_source(source)
    if config is None:
        raise TypeError("write_checkpoint: a source of planes needs config= (the model config)")
    return mapping_source(source, tensors or {}, config, input_scales)


def _refuse_other_quantization(src: Source, flavour: str) -> None:
    """Layers of another quantization than NVFP4 (a ModelOpt ``MIXED_PRECISION`` source's
    FP8 layers) are carried by a ModelOpt output only: another flavour's config cannot say
    what they are, and would present an FP8 weight as a plain one."""
    others = modelopt.other_quantized_layers(src.origin)
    if others and flavour != "modelopt":
        layer, entry = next(iter(others.items()))
        assert src.origin is not None
        raise CheckpointError(
            f"{src.origin.path}: layer {layer!r} is {entry.get('quant_algo')!r} "
            f"(hf_quant_config.json's quantized_layers; {len(others)} such layers): expected "
            f"NVFP4 layers only for a {flavour} output, which cannot describe it; convert "
            "to modelopt"
        )


def _check_written(source: Checkpoint, io: FlavourIO, tmp: Path, target: Path) -> None:
    """The round-trip invariant: the output at ``tmp`` reads back as ``source``, as
    ``nvfp4 verify`` compares them (one read of the written files). An output that cannot
    be read back is refused as one that differs, under the destination's name."""
    try:
        with io.read(tmp) as written:
            diff, _ = compare(source, written)
    except (CheckpointError, PlaneError) as e:
        diff = f"it cannot be read back: {str(e).replace(str(tmp), str(target))}"
    if diff:
        raise CheckpointError(
            f"{target}: the {io.flavour} output does not read back as its source "
            f"({diff}; source vs output); nothing was written"
        )


def write_checkpoint(
    dst: str | os.PathLike[str],
    source: Checkpoint | Mapping[str, NVFP4Planes],
    *,
    flavour: str,
    tensors: Mapping[str, npt.ArrayLike] | None = None,
    config: Mapping[str, Any] | None = None,
    input_scales: Mapping[str, float] | None = None,
    tokenizer: str | os.PathLike[str] | None = None,
    force: bool = False,
    progress: Progress | None = None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    verify: bool = True,
) -> Path:
    """Write ``source`` as a checkpoint of ``flavour`` (``"modelopt"``,
    ``"compressed-tensors"``, ``"mlx"`` or ``"gguf"``) at ``dst``: streaming, tensor by
    tensor, atomic. Returns ``dst`` as a :class:`~pathlib.Path`.

    ``source`` is either an opened :class:`~nvfp4_checkpoints.Checkpoint` (a conversion: its
    other tensors, config and input scales come with it, and a directory output gets the
    source directory's other files: tokenizer, generation config...) or a mapping ``prefix
    -> NVFP4Planes``, with ``tensors`` (``name -> array``, the non-quantized tensors),
    ``config`` (the model's ``config.json``, required) and ``input_scales`` (``prefix ->``
    the activations' DECODE global). Expert-stacked planes ``[E, N, K]`` under a key
    containing ``{}`` (``"...experts.{}.gate_proj"``) are written per expert, as Hugging
    Face checkpoints store them; GGUF stacks experts again.

    What each flavour writes is documented in its module (:mod:`.modelopt`,
    :mod:`.compressed_tensors`, :mod:`.mlx`, :mod:`.gguf`). Quantized tensors are
    transcoded losslessly (the compressed-tensors global within the one ulp of a float32
    reciprocal); other tensors are copied as they are (GGUF widens 1-D bf16/f16 to F32 and
    records the original dtype). ModelOpt sources keep their per-layer ``quant_algo``.
    Hugging Face outputs are sharded above ``max_shard_bytes``. ``tokenizer``: a Hugging
    Face tokenizer directory whose tokenizer the output gets, or (for a directory output) a
    GGUF file whose tokenizer is rebuilt as ``tokenizer.json`` (:mod:`.tokenizer`). By
    default the output gets its source's: a GGUF source's is rebuilt for a directory
    output, a directory's files are copied; a one-line note is logged when a GGUF output's
    source has none or a GGUF source's cannot be rebuilt.
    ``progress(tensors_done, tensors_total, bytes_done, bytes_total)`` is called after each
    tensor.

    ``verify`` (a conversion only): before the output is renamed into place it is read back
    and compared with the source tensor by tensor, with the comparison ``nvfp4 verify``
    makes (:func:`~nvfp4_checkpoints.compare.compare`); a difference is a
    :class:`~nvfp4_checkpoints.CheckpointError` naming the first differing tensor and what
    differs, and the output is removed (``dst`` untouched). It costs one read of the
    written files and one more of the source's tensors.

    Raises :class:`~nvfp4_checkpoints.CheckpointError` for an unknown flavour, when ``dst``
    exists and ``force`` is false (or is not something ``force`` replaces: a checkpoint,
    an empty folder, a GGUF file), when ``dst`` is the source, inside it or a parent of it,
    when ``dst`` appears during the run, or for a ``tokenizer`` that is not one, and
    :class:`~nvfp4.PlaneError` for planes the target cannot hold (K % 64 for GGUF, fused
    partitions for ModelOpt / compressed-tensors), before writing anything.
    """
    io = FLAVOUR_IO.get(flavour)
    if io is None:
        raise CheckpointError(f"unknown output flavour {flavour!r} (one of {', '.join(FLAVOURS)})")
    src = _source(source, tensors, config, input_scales)
    if tokenizer is not None:
        src.tokenizer_dir = Path(tokenizer)
    io.check(src)
    _refuse_other_quantization(src, flavour)
    if max_shard_bytes <= 0:
        raise CheckpointError(f"max_shard_bytes must be positive, found {max_shard_bytes}")
    target = Path(dst)
    origin = source.path if isinstance(source, Checkpoint) else None
    with destination(target, force=force, source=origin) as tmp:
        notes = io.write(tmp, src, WriteOptions(progress, max_shard_bytes))
        if verify and isinstance(source, Checkpoint):
            _check_written(source, io, tmp, target)
    for note in notes:
        logger.warning("%s", note)
    return target
