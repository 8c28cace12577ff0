"""The GGUF flavour: one file, read (:mod:`.reader`) and written (:mod:`.writer`).

**The file** (``NVFP4``, ggml type 40, written through the ``gguf`` package, parsed by
:mod:`.file`): ``<base>.weight`` NVFP4, ``<base>.scale`` F32 ``[1]`` (``[E]`` for merged
experts; the DECODE global: absent means 1.0 in a foreign file, as llama.cpp's converter
writes it, and is refused in a file recording ``nvfp4.spec_version``, whose writer writes
every global), ``<base>.input_scale`` when present. Names
go through gguf-py's tensor-name map of the architecture (``config.model_type``:
llama/mistral/mixtral -> ``llama``, qwen3_moe -> ``qwen3moe``...), experts are merged into
``[E, N, K]`` tensors as llama.cpp expects, q/k rows of the ``llama`` architecture are
RoPE-permuted as llama.cpp's converter does, and 1-D bf16/f16 tensors are widened to F32
(lossless). Names the map does not know keep their Hugging Face name. The metadata holds
the architecture's hyper-parameters from ``config.json`` and ``nvfp4.*`` keys (spec
version, the HF config, the GGUF<->HF name map and original dtypes; :mod:`.metadata`) from
which :class:`GGUFCheckpoint` restores the Hugging Face view exactly. K % 64 != 0 is
refused before anything is written.

**The tokenizer** (``tokenizer.ggml.*``, which llama.cpp needs to load the file) comes from
a Hugging Face ``tokenizer.json`` (:mod:`.vocab`): the directory given as ``tokenizer=``,
else the source directory's; or it is copied from a GGUF source. Converting a checkpoint
that has none gives a GGUF without one, and a one-line note is logged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from ..flavour_io import FlavourIO, WriteOptions
from ..flavours import CheckpointError
from ..source import Source
from .reader import GGUFCheckpoint
from .vocab import TOKENIZER_FILE, add_hf_tokenizer, copy_gguf_tokenizer, has_hf_tokenizer
from .writer import TokenizerWriter, write_gguf_file

__all__ = ["IO", "GGUFCheckpoint"]


def _check(src: Source) -> None:
    """A ``tokenizer=`` directory must hold a Hugging Face tokenizer."""
    tok_dir = src.tokenizer_dir
    if tok_dir is not None and not has_hf_tokenizer(tok_dir):
        raise CheckpointError(f"{tok_dir}: no {TOKENIZER_FILE} (a Hugging Face tokenizer)")


def _tokenizer(src: Source) -> TokenizerWriter | None:
    """How to give the GGUF its tokenizer, or ``None`` (the source has none)."""
    tok_dir, origin, config = src.tokenizer_dir, src.origin, src.config
    if tok_dir is not None:
        return lambda w: add_hf_tokenizer(w, tok_dir, config) is not None
    if isinstance(origin, GGUFCheckpoint):
        return lambda w: bool(copy_gguf_tokenizer(origin.file, w))
    if origin is not None and has_hf_tokenizer(origin.path):
        return lambda w: add_hf_tokenizer(w, origin.path, origin.config) is not None
    return None


def _write(dst_tmp: Path, src: Source, options: WriteOptions) -> list[str]:
    tokenizer = _tokenizer(src)
    written = write_gguf_file(dst_tmp, src, tokenizer, options.progress)
    origin = src.origin
    if origin is None:
        return []
    if tokenizer is None:
        return [
            f"nvfp4: note: {origin.path} has no Hugging Face tokenizer ({TOKENIZER_FILE}): "
            "the GGUF has no tokenizer metadata, which llama.cpp needs to load it"
        ]
    if isinstance(origin, GGUFCheckpoint) and not written:
        return [
            f"nvfp4: note: {origin.path} has no tokenizer metadata: neither has the GGUF written"
        ]
    return []


IO: Final[FlavourIO] = FlavourIO(flavour="gguf", read=GGUFCheckpoint, write=_write, check=_check)
