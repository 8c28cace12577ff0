"""The tokenizer of a Hugging Face / MLX output directory, whatever the source.

=============================== ===========================================================
source (or ``tokenizer=``)      what the output directory gets
=============================== ===========================================================
a Hugging Face / MLX directory  its files, copied (with the directory's other files:
                                generation config...)
a GGUF file                     ``tokenizer.json``, ``tokenizer_config.json`` (and
                                ``chat_template.jinja`` when the GGUF has a template), built
                                from the GGUF's ``tokenizer.ggml.*`` keys by transformers
                                exactly as ``AutoTokenizer.from_pretrained(dir,
                                gguf_file=...)`` builds them, then ``save_pretrained``
planes and tensors (no source)  nothing unless ``tokenizer=`` names a directory or a GGUF
=============================== ===========================================================

(A GGUF output takes its tokenizer from :mod:`.gguf.vocab`.) Building from a GGUF needs
``transformers`` (``pip install 'nvfp4-checkpoints[tokenizer]'``); without it, or when the
GGUF holds no tokenizer, the conversion still writes the model and logs a one-line note
saying why the output has no tokenizer (:class:`TokenizerUnavailable` carries the reason).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from .flavours import CheckpointError
from .folder import CheckpointFolder
from .gguf.file import GGUFFile
from .source import Source

__all__ = [
    "GGUF_TOKENIZER_KEY",
    "HF_TOKENIZER_FILES",
    "TokenizerUnavailable",
    "check_tokenizer_source",
    "copy_hf_tokenizer",
    "gguf_has_tokenizer",
    "hf_tokenizer_from_gguf",
    "is_gguf_file",
    "load_hf_tokenizer",
    "output_tokenizer",
    "tokenizer_folder",
]

#: The files a Hugging Face tokenizer may consist of (those present are copied).
HF_TOKENIZER_FILES: Final = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
)
#: The GGUF key every tokenizer has (llama.cpp's tokenizer model: gpt2, llama...).
GGUF_TOKENIZER_KEY: Final = "tokenizer.ggml.model"
#: The GGUF key of the token strings (one per id).
GGUF_TOKENS_KEY: Final = "tokenizer.ggml.tokens"
#: tokenizer_config.json keys that transformers records about the load, not the tokenizer.
_LOAD_KEYS: Final = ("is_local", "local_files_only", "name_or_path")


class TokenizerUnavailable(CheckpointError):
    """No tokenizer can be built; the message says why, in one line."""


def is_gguf_file(path: Path) -> bool:
    """Whether ``path`` is a file starting with GGUF's magic bytes."""
    if not path.is_file():
        return False
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def gguf_has_tokenizer(file: GGUFFile) -> bool:
    """Whether the GGUF holds tokenizer metadata (``tokenizer.ggml.model``)."""
    return GGUF_TOKENIZER_KEY in file.fields


def copy_hf_tokenizer(src_dir: Path, out_dir: Path) -> list[str]:
    """Copy the tokenizer files of the Hugging Face directory ``src_dir`` into ``out_dir``;
    returns the names copied (refuses a directory without ``tokenizer.json`` /
    ``tokenizer.model``)."""
    paths = _contained(src_dir) if src_dir.is_dir() else []
    names = [p.name for p in paths]
    if not {"tokenizer.json", "tokenizer.model"} & set(names):
        raise CheckpointError(
            f"{src_dir}: expected a Hugging Face tokenizer (tokenizer.json or tokenizer.model), "
            f"found {sorted(p.name for p in src_dir.iterdir()) if src_dir.is_dir() else 'no directory'}"
        )
    folder = CheckpointFolder(src_dir)
    for path in paths:  # read through the checked file, never its path again
        folder.copy_member(path.name, out_dir / path.name)
    return names


def _contained(src_dir: Path) -> list[Path]:
    """The tokenizer files of ``src_dir``, regular files inside it as for a checkpoint
    (:meth:`~.folder.CheckpointFolder.present`: a symlink is refused, naming it)."""
    return CheckpointFolder(src_dir).present(HF_TOKENIZER_FILES)


def _auto_tokenizer() -> Any:
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise TokenizerUnavailable(
            "a Hugging Face tokenizer needs transformers "
            f"(pip install 'nvfp4-checkpoints[tokenizer]'): {exc}"
        ) from None
    return AutoTokenizer


def hf_tokenizer_from_gguf(gguf: Path, out_dir: Path) -> list[str]:
    """Write the Hugging Face tokenizer of the GGUF file ``gguf`` into ``out_dir`` (module
    docstring); returns the names written. Raises :class:`TokenizerUnavailable` when the
    GGUF holds no tokenizer, transformers is missing or cannot convert it."""
    with GGUFFile(gguf) as file:
        if not gguf_has_tokenizer(file):
            raise TokenizerUnavailable(f"{gguf}: no tokenizer metadata ({GGUF_TOKENIZER_KEY})")
        model = file.value(GGUF_TOKENIZER_KEY, "")
        tokens = file.fields.get(GGUF_TOKENS_KEY)
        n_tokens = tokens.count if tokens is not None else None
    auto = _auto_tokenizer()
    with tempfile.TemporaryDirectory(prefix="nvfp4-tokenizer-") as tmp:
        # transformers reads gguf_file inside a directory: a private one holding only a link
        # to the GGUF, so no other file beside the GGUF can join the tokenizer
        link = Path(tmp) / "model.gguf"
        try:
            os.symlink(gguf.resolve(), link)
        except OSError:
            shutil.copyfile(gguf, link)
        quiet = logging.getLogger("transformers")
        level = quiet.level
        quiet.setLevel(logging.ERROR)
        try:
            tok = auto.from_pretrained(tmp, gguf_file=link.name)
        except Exception as exc:  # transformers' own refusal (an unknown tokenizer model...)
            raise TokenizerUnavailable(
                f"{gguf}: transformers cannot build a tokenizer from its {model!r} tokenizer "
                f"metadata: {type(exc).__name__}: {exc}"
            ) from None
        finally:
            quiet.setLevel(level)
        tok.name_or_path = ""
        written = tok.save_pretrained(str(out_dir))
    if n_tokens is not None and (out_dir / "tokenizer.json").is_file():
        _drop_foreign_tokens(out_dir / "tokenizer.json", n_tokens)
    config_file = out_dir / "tokenizer_config.json"
    if config_file.is_file():
        _drop_load_keys(config_file)
    return sorted({Path(str(p)).name for p in written if (out_dir / Path(str(p)).name).is_file()})


def _drop_foreign_tokens(path: Path, n_tokens: int) -> None:
    """Drop the added tokens transformers' converter invents beyond the GGUF's ``n_tokens``
    ids (its GPT-2 converter adds ``<|endoftext|>`` when the vocabulary lacks it): the
    tokenizer then holds exactly the GGUF's tokens, and every id fits the model."""
    tok = json.loads(path.read_text(encoding="utf-8"))
    added = tok.get("added_tokens") or []
    kept = [a for a in added if int(a.get("id", 0)) < n_tokens]
    if len(kept) != len(added):
        tok["added_tokens"] = kept
        path.write_text(json.dumps(tok, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _drop_load_keys(path: Path) -> None:
    """transformers' tokenizer_config.json minus what it records about this load."""
    config = json.loads(path.read_text(encoding="utf-8"))
    for key in _LOAD_KEYS:
        config.pop(key, None)
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def check_tokenizer_source(path: Path) -> None:
    """Refuse, before anything is written, a ``tokenizer=`` that gives a directory output no
    tokenizer: neither a Hugging Face tokenizer directory nor a GGUF file holding one (with
    transformers to convert it)."""
    if is_gguf_file(path):
        with GGUFFile(path) as file:
            if not gguf_has_tokenizer(file):
                raise TokenizerUnavailable(f"{path}: no tokenizer metadata ({GGUF_TOKENIZER_KEY})")
        _auto_tokenizer()
        return
    if not any((path / n).is_file() for n in ("tokenizer.json", "tokenizer.model")):
        raise CheckpointError(
            f"{path}: expected a Hugging Face tokenizer directory (tokenizer.json or "
            "tokenizer.model) or a GGUF file with tokenizer metadata"
        )
    _contained(path)


def output_tokenizer(src: Source, out_dir: Path) -> list[str]:
    """Give the directory output ``out_dir`` its tokenizer (module docstring); returns the
    notes to log (why it has none when a GGUF source's cannot be built)."""
    given = src.tokenizer_dir
    if given is not None:
        if is_gguf_file(given):
            hf_tokenizer_from_gguf(given, out_dir)
        else:
            copy_hf_tokenizer(given, out_dir)
        return []
    origin = src.origin
    if origin is None or origin.flavour != "gguf":
        return []  # a directory source's tokenizer files come with its other files
    try:
        hf_tokenizer_from_gguf(origin.path, out_dir)
    except TokenizerUnavailable as exc:
        return [f"nvfp4: note: the output has no tokenizer: {exc}"]
    return []


@contextmanager
def tokenizer_folder(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A folder holding the Hugging Face tokenizer files of the checkpoint at ``path``: the
    checkpoint directory itself, or for a GGUF file a temporary folder (removed on exit)
    with the tokenizer transformers builds from its metadata. Raises
    :class:`TokenizerUnavailable` saying why there is none."""
    p = Path(path)
    if p.is_dir():
        if not any((p / n).is_file() for n in ("tokenizer.json", "tokenizer.model")):
            raise TokenizerUnavailable(
                f"{p}: no tokenizer files (tokenizer.json or tokenizer.model expected)"
            )
        _contained(p)
        yield p
    elif is_gguf_file(p):
        with tempfile.TemporaryDirectory(prefix="nvfp4-tokenizer-") as tmp:
            hf_tokenizer_from_gguf(p, Path(tmp))
            yield Path(tmp)
    else:
        raise TokenizerUnavailable(f"{p}: neither a checkpoint directory nor a GGUF file")


def load_hf_tokenizer(path: str | os.PathLike[str]) -> Any:
    """The transformers tokenizer of a checkpoint directory (any flavour) or GGUF file (see
    :func:`tokenizer_folder`); raises :class:`TokenizerUnavailable` saying why there is
    none (no tokenizer files, no tokenizer metadata, transformers missing)."""
    auto = _auto_tokenizer()
    with tokenizer_folder(path) as folder:
        return auto.from_pretrained(str(folder))
