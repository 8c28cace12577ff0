"""Tokenizer metadata for GGUF files, from a Hugging Face tokenizer or another GGUF.

llama.cpp will not load a model whose GGUF has no ``tokenizer.ggml.*`` keys. This module
writes them the way llama.cpp's ``convert_hf_to_gguf.py`` does, from the ``tokenizer.json``
of a Hugging Face checkpoint directory (``tokenizer_config.json``,
``special_tokens_map.json``, ``generation_config.json``, ``chat_template.jinja`` and
``config.json`` are read when present), without needing ``transformers``:

=========================== ============================================================
``tokenizer.json`` model    GGUF tokenizer
=========================== ============================================================
BPE, byte-level (GPT-2      ``tokenizer.ggml.model = "gpt2"``: the byte-level token
style: Llama-3, Qwen2,      strings, ``merges``, ``pre`` named after the pre-tokenizer
SmolLM2...)                 regex (:func:`gguf_pre_tokenizer`)
BPE with ``byte_fallback``  ``"llama"`` (SentencePiece): the ``▁`` token strings,
(Llama-2, Mistral,          ``<0xNN>`` byte tokens, ``scores`` = minus the rank of the
TinyLlama...)               first merge that makes the token (llama.cpp merges by highest
                            score, Hugging Face by lowest rank: the same order),
                            ``add_space_prefix``
Unigram                     ``"llama"`` with the Unigram log-probabilities as scores
                            (llama.cpp's SentencePiece merger approximates Unigram
                            segmentation: a warning says so)
anything else (WordPiece,   nothing, with a warning
WordLevel...)
=========================== ============================================================

Token types follow the converter: added tokens marked ``special`` (or that look special:
``<|...|>``, ``<pad>``...) are ``CONTROL``, other added tokens ``USER_DEFINED`` (their
``▁`` written as spaces), ``<0xNN>`` pieces of a SentencePiece vocabulary ``BYTE``, its
``unk_token`` ``UNKNOWN``, ids the tokenizer does not use (up to ``config.json``'s
``vocab_size``) ``[PAD<i>]`` ``UNUSED``, the rest ``NORMAL``. Special token ids,
``add_bos``/``add_eos`` and the chat template come from gguf-py's
:class:`gguf.SpecialVocab` (which also gives the BPE merges). A pre-tokenizer llama.cpp
has no name for is written as ``"default"`` with a warning: llama.cpp then splits text
differently from the Hugging Face tokenizer.

Warnings go to the ``nvfp4_checkpoints.gguf.vocab`` logger (printed on stderr by the
``nvfp4`` command).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ..flavours import CheckpointError, import_gguf
from ..folder import MAX_JSON_BYTES, CheckpointFolder, read_json_file
from .file import GGUFFile

__all__ = [
    "TOKENIZER_FILE",
    "HFVocab",
    "add_hf_tokenizer",
    "copy_gguf_tokenizer",
    "gguf_pre_tokenizer",
    "has_hf_tokenizer",
    "read_hf_vocab",
]

logger = logging.getLogger(__name__)

#: The Hugging Face ``tokenizers`` file a directory must hold for a GGUF tokenizer.
TOKENIZER_FILE: Final = "tokenizer.json"
#: What gguf-py's SpecialVocab reads from a tokenizer directory (and ``*.jinja`` in
#: ``additional_chat_templates``), then the JSON among them that read_hf_vocab does not read.
_SPECIAL_VOCAB_READS: Final = (
    TOKENIZER_FILE,
    "tokenizer_config.json",
    "config.json",
    "chat_template.jinja",
    "chat_template.json",
    "merges.txt",
)
_SPECIAL_VOCAB_JSON: Final = frozenset({"config.json", "chat_template.json"})
_EXTRA_TEMPLATES: Final = "additional_chat_templates"
#: GGUF keys of the tokenizer all start with this.
GGUF_TOKENIZER_PREFIX: Final = "tokenizer."

# Token types (gguf.TokenType values; spelled here so that reading needs no gguf import).
NORMAL: Final = 1
UNKNOWN: Final = 2
CONTROL: Final = 3
USER_DEFINED: Final = 4
UNUSED: Final = 5
BYTE: Final = 6

_SPIECE_SPACE: Final = "\u2581"
_BYTE_TOKEN: Final = re.compile(r"<0x[0-9A-Fa-f]{2}>")

# Pre-tokenizer split regexes as Hugging Face tokenizer.json files spell them.
_LLAMA3_SPLIT: Final = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT: Final = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT: Final = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN_SPLIT: Final = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT2_REGEX: Final = "bytelevel-regex"  # ByteLevel(use_regex=True): GPT-2's own split
# A pre-tokenizer, reduced to its splitting steps -> llama.cpp's name for it.
_PRE_NAMES: Final[Mapping[tuple[str, ...], str]] = {
    (f"split:{_LLAMA3_SPLIT}",): "llama-bpe",
    (f"split:{_QWEN2_SPLIT}",): "qwen2",
    (f"split:{_GPT4O_SPLIT}",): "gpt-4o",
    (f"split:{_TEKKEN_SPLIT}",): "tekken",
    (_GPT2_REGEX,): "gpt-2",
    ("digits:1", _GPT2_REGEX): "smollm",
}
# Same splitting as "smollm", with llama.cpp's clean-up of spaces on decode (StarCoder).
_SMOLLM_CLEAN_SPACES: Final = "starcoder"


# ======================================================================= reading
@dataclass(frozen=True)
class HFVocab:
    """A Hugging Face tokenizer as GGUF holds it (before the special tokens, merges and
    chat template, which :class:`gguf.SpecialVocab` reads)."""

    model: str  # tokenizer.ggml.model: "gpt2" or "llama"
    pre: str  # tokenizer.ggml.pre
    tokens: list[str]
    token_types: list[int]  # gguf.TokenType values
    scores: list[float] | None  # SentencePiece-style vocabularies only
    add_space_prefix: bool | None  # SentencePiece-style vocabularies only
    source: Path  # the tokenizer directory


def has_hf_tokenizer(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a directory with a ``tokenizer.json`` entry (a symlink included:
    reading it refuses it, as a folder output refuses to copy it)."""
    p = Path(path)
    return p.is_dir() and CheckpointFolder(p).has(TOKENIZER_FILE)


def _copy_reads(folder: CheckpointFolder, private: Path) -> None:
    """Every file gguf-py's :class:`gguf.SpecialVocab` may read from ``folder``, checked as
    a folder output checks the files it copies (regular files inside the folder,
    :meth:`~..folder.CheckpointFolder.present`) and copied into ``private`` through
    :meth:`~..folder.CheckpointFolder.open_member`, which gguf-py then reads: the JSON this
    module does not read itself within the limits of every JSON read, the text files
    (templates, merges) within the same size."""
    names = list(_SPECIAL_VOCAB_READS)
    extra = folder.root / _EXTRA_TEMPLATES
    if extra.is_dir():  # its *.jinja (a symlinked folder is refused by member)
        with os.scandir(extra) as it:
            names += [f"{_EXTRA_TEMPLATES}/{e.name}" for e in it if e.name.endswith(".jinja")]
    (private / _EXTRA_TEMPLATES).mkdir()
    for path in folder.present(names):
        name = path.relative_to(folder.root).as_posix()
        with folder.open_member(name, what="file") as f:
            if (size := os.fstat(f.fileno()).st_size) > MAX_JSON_BYTES:
                kind = "JSON" if path.suffix == ".json" else "a tokenizer file"
                raise CheckpointError(
                    f"{path}: {kind} of {size} bytes, more than the {MAX_JSON_BYTES} read"
                )
            with open(private / name, "xb") as out:
                shutil.copyfileobj(f, out)
        if path.name in _SPECIAL_VOCAB_JSON:
            read_json_file(private / name)


def _steps(pre_tokenizer: Any) -> tuple[tuple[str, ...], bool] | None:
    """The splitting steps of a tokenizer.json pre-tokenizer and whether it maps bytes
    (ByteLevel); ``None`` for a step this module has no reduction for."""
    if pre_tokenizer is None:
        return (), False
    items = (
        pre_tokenizer.get("pretokenizers", [])
        if pre_tokenizer.get("type") == "Sequence"
        else [pre_tokenizer]
    )
    steps: list[str] = []
    byte_level = False
    for it in items:
        kind = it.get("type") if isinstance(it, dict) else None
        if kind == "ByteLevel":
            if it.get("add_prefix_space"):
                return None  # llama.cpp has no prefix space for byte-level BPE
            byte_level = True
            if it.get("use_regex", True):
                steps.append(_GPT2_REGEX)
        elif kind == "Split":
            pattern = it.get("pattern") or {}
            regex = pattern.get("Regex") if isinstance(pattern, dict) else None
            if regex is None or it.get("behavior") != "Isolated" or it.get("invert"):
                return None
            steps.append(f"split:{regex}")
        elif kind == "Digits":
            steps.append(f"digits:{int(bool(it.get('individual_digits')))}")
        else:
            return None
    return tuple(steps), byte_level


def gguf_pre_tokenizer(
    tokenizer: Mapping[str, Any], tokenizer_config: Mapping[str, Any] | None = None
) -> str | None:
    """llama.cpp's name (``tokenizer.ggml.pre``) for the pre-tokenizer of a byte-level BPE
    ``tokenizer.json`` (parsed), or ``None`` when llama.cpp has no name for it.

    Recognised: the Llama-3 split regex (``"llama-bpe"``), Qwen2's (``"qwen2"``),
    GPT-4o's (``"gpt-4o"``), Mistral Tekken's (``"tekken"``), GPT-2's own ByteLevel regex
    (``"gpt-2"``) and single digits then GPT-2's regex (``"smollm"``; ``"starcoder"`` when
    ``tokenizer_config.json`` asks to clean up spaces when decoding)."""
    found = _steps(tokenizer.get("pre_tokenizer"))
    if found is None:
        return None
    name = _PRE_NAMES.get(found[0])
    if name == "smollm" and (tokenizer_config or {}).get("clean_up_tokenization_spaces"):
        return _SMOLLM_CLEAN_SPACES
    return name


def _looks_special(token: str) -> bool:
    """Added tokens some models forget to mark special (as llama.cpp's converter sees it)."""
    return (
        token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
        or (token.startswith("<|") and token.endswith("|>"))
        or (token.startswith("<\uff5c") and token.endswith("\uff5c>"))
        or (token.startswith("<unused") and token.endswith(">"))
    )


def _merge_pairs(merges: Sequence[Any], where: Path) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for m in merges:
        if isinstance(m, str):
            a, sep, b = m.partition(" ")
            if not sep:
                raise CheckpointError(f"{where}: malformed merge {m!r} (expected 'left right')")
            out.append((a, b))
        elif isinstance(m, list) and len(m) == 2 and all(isinstance(s, str) for s in m):
            out.append((m[0], m[1]))
        else:
            raise CheckpointError(f"{where}: malformed merge {m!r} (expected 'a b' or [a, b])")
    return out


def _space_prefix(tokenizer: Mapping[str, Any]) -> bool:
    """Whether a SentencePiece-style tokenizer.json puts ``▁`` before the text."""
    pre = tokenizer.get("pre_tokenizer") or {}
    pres = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    for p in pres:
        if isinstance(p, dict) and p.get("type") == "Metaspace":
            scheme = p.get("prepend_scheme")
            if scheme is None:
                return bool(p.get("add_prefix_space", True))
            return scheme in ("always", "first")
    norm = tokenizer.get("normalizer") or {}
    norms = norm.get("normalizers", []) if norm.get("type") == "Sequence" else [norm]
    return any(
        isinstance(n, dict) and n.get("type") == "Prepend" and n.get("prepend") == _SPIECE_SPACE
        for n in norms
    )


def _vocab_size(config: Mapping[str, Any] | None) -> int | None:
    if not config:
        return None
    for c in (config, config.get("text_config")):
        if isinstance(c, Mapping) and isinstance(c.get("vocab_size"), int):
            return int(c["vocab_size"])
    return None


def read_hf_vocab(path: str | os.PathLike[str], vocab_size: int | None = None) -> HFVocab | None:
    """Read the tokenizer of the Hugging Face directory ``path`` as GGUF lays it out.

    ``vocab_size`` (``config.json``'s, by default read from ``path/config.json``) is the
    number of tokens written: ids the tokenizer does not use become ``UNUSED`` padding.
    Returns ``None`` (with a warning) for tokenizer kinds GGUF cannot hold; raises
    :class:`~nvfp4_checkpoints.CheckpointError` for an unreadable ``tokenizer.json`` or a
    tokenizer with more ids than ``vocab_size``."""
    base = Path(path)
    folder = CheckpointFolder(base)  # regular files inside it; JSON within the limits
    file = base / TOKENIZER_FILE
    tok = folder.json(TOKENIZER_FILE)
    if not isinstance(tok.get("model"), dict):
        raise CheckpointError(f"{file}: no 'model' object (not a Hugging Face tokenizer.json)")
    has_config = folder.has("tokenizer_config.json")
    tok_config = folder.json("tokenizer_config.json") if has_config else {}
    if vocab_size is None and folder.has("config.json"):
        vocab_size = _vocab_size(folder.json("config.json"))
    model = tok["model"]
    kind = model.get("type")
    vocab: dict[str, int]
    scores_of: dict[int, float] = {}
    if kind == "BPE":
        if not isinstance(model.get("vocab"), dict):
            raise CheckpointError(f"{file}: BPE model without a 'vocab' object")
        vocab = {str(k): int(v) for k, v in model["vocab"].items()}
        merges = _merge_pairs(model.get("merges") or [], file)
        if model.get("byte_fallback"):
            gguf_model = "llama"
            n = len(merges)
            for rank, (a, b) in enumerate(merges):
                i = vocab.get(a + b)
                if i is not None and i not in scores_of:
                    scores_of[i] = -float(rank)
            for i in vocab.values():  # tokens no merge makes: after every merged token
                scores_of.setdefault(i, -float(n + i))
        else:
            found = _steps(tok.get("pre_tokenizer"))
            decoder = tok.get("decoder") or {}
            if not ((found is not None and found[1]) or decoder.get("type") == "ByteLevel"):
                logger.warning(
                    "nvfp4: note: %s is a BPE tokenizer neither byte-level nor with byte "
                    "fallback; GGUF cannot hold it, no tokenizer written",
                    file,
                )
                return None
            gguf_model = "gpt2"
    elif kind == "Unigram":
        pieces = model.get("vocab")
        if not isinstance(pieces, list):
            raise CheckpointError(f"{file}: Unigram model without a 'vocab' list")
        vocab = {}
        for i, entry in enumerate(pieces):
            if not (isinstance(entry, list) and len(entry) == 2):
                raise CheckpointError(f"{file}: malformed Unigram entry {entry!r} at id {i}")
            vocab.setdefault(str(entry[0]), i)
            scores_of[i] = float(entry[1])
        gguf_model = "llama"
        logger.warning(
            "nvfp4: note: %s is a Unigram tokenizer; llama.cpp's SentencePiece tokenizer "
            "approximates its segmentation",
            file,
        )
    else:
        logger.warning(
            "nvfp4: note: %s has a %s model, which GGUF cannot hold; no tokenizer written",
            file,
            kind,
        )
        return None

    added: dict[int, Mapping[str, Any]] = {}
    for a in tok.get("added_tokens") or []:
        if (
            isinstance(a, dict)
            and isinstance(a.get("id"), int)
            and isinstance(a.get("content"), str)
        ):
            added[int(a["id"])] = a
    by_id: dict[int, str] = {i: t for t, i in vocab.items()}
    by_id.update({i: str(a["content"]) for i, a in added.items()})
    max_id = max(by_id, default=-1)
    n_tokens = vocab_size if vocab_size is not None else max_id + 1
    if max_id >= n_tokens:
        raise CheckpointError(
            f"{file}: token ids up to {max_id} do not fit config.json's vocab_size "
            f"{n_tokens} (expected ids below {n_tokens})"
        )
    unk = model.get("unk_token") if gguf_model == "llama" else None
    if kind == "Unigram" and isinstance(model.get("unk_id"), int):
        unk = by_id.get(int(model["unk_id"]))

    tokens: list[str] = []
    types: list[int] = []
    scores: list[float] = []
    for i in range(n_tokens):
        token = by_id.get(i)
        score = 0.0
        if token is None:
            token, ttype = f"[PAD{i}]", UNUSED
        elif i in added:
            if added[i].get("special") or _looks_special(token):
                ttype = CONTROL
            else:
                token, ttype = token.replace(_SPIECE_SPACE, " "), USER_DEFINED
        elif gguf_model == "llama" and _BYTE_TOKEN.fullmatch(token):
            ttype = BYTE
        elif token == unk:
            ttype = UNKNOWN
        else:
            ttype, score = NORMAL, scores_of.get(i, 0.0)
        tokens.append(token)
        types.append(ttype)
        scores.append(score)

    if gguf_model == "gpt2":
        pre = gguf_pre_tokenizer(tok, tok_config)
        if pre is None:
            logger.warning(
                "nvfp4: note: the pre-tokenizer of %s is not one llama.cpp names; wrote "
                "tokenizer.ggml.pre = 'default' (llama.cpp may split text differently)",
                file,
            )
            pre = "default"
        return HFVocab("gpt2", pre, tokens, types, None, None, base)
    return HFVocab("llama", "default", tokens, types, scores, _space_prefix(tok), base)


# ======================================================================= writing
def add_hf_tokenizer(
    writer: Any,
    path: str | os.PathLike[str],
    config: Mapping[str, Any] | None = None,
) -> HFVocab | None:
    """Add the tokenizer of the Hugging Face directory ``path`` to ``writer`` (a
    :class:`gguf.GGUFWriter` before its header is written): model, pre-tokenizer, tokens,
    token types, scores or merges, special token ids, ``add_bos``/``add_eos`` and the chat
    template. ``config`` (the model's ``config.json``) gives the vocabulary size. Returns
    what was written, or ``None`` (with a warning) when GGUF cannot hold this tokenizer."""
    gguf = import_gguf()
    folder = CheckpointFolder(Path(path))
    with tempfile.TemporaryDirectory(prefix="nvfp4-tokenizer-") as private:
        # gguf-py reads by path: it reads a private copy of the checked files, so a file
        # swapped for a symlink after the check is never followed
        _copy_reads(folder, Path(private))
        vocab = read_hf_vocab(path, _vocab_size(config))
        if vocab is None:
            return None
        _add_special(gguf, writer, vocab, Path(private), path)
    return vocab


def _add_special(gguf: Any, writer: Any, vocab: HFVocab, private: Path, path: object) -> None:
    writer.add_tokenizer_model(vocab.model)
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.token_types)
    if vocab.scores is not None:
        writer.add_token_scores(vocab.scores)
    if vocab.add_space_prefix is not None:
        writer.add_add_space_prefix(vocab.add_space_prefix)
    try:
        special = gguf.SpecialVocab(
            private, load_merges=vocab.model == "gpt2", n_vocab=len(vocab.tokens)
        )
    except (ValueError, OSError, json.JSONDecodeError) as e:
        msg = str(e).replace(str(private), str(path))
        raise CheckpointError(f"{path}: unreadable tokenizer files ({msg})") from None
    special.add_to_gguf(writer, quiet=True)


def copy_gguf_tokenizer(source: GGUFFile, writer: Any) -> list[str]:
    """Copy every ``tokenizer.*`` key of a GGUF file to a :class:`gguf.GGUFWriter` as it is
    (same value and element types, strings as their bytes); returns the keys copied."""
    gguf = import_gguf()
    copied: list[str] = []
    for name, field in source.fields.items():
        if not name.startswith(GGUF_TOKENIZER_PREFIX):
            continue
        sub = None if field.sub_type is None else gguf.GGUFValueType(field.sub_type)
        writer.add_key_value(name, field.raw(), gguf.GGUFValueType(field.type), sub)
        copied.append(name)
    return copied
