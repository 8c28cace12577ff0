"""Tokenizers survive every conversion: Hugging Face directories <-> GGUF <-> MLX folders.

A tiny model with a byte-level BPE tokenizer (trained here, with Llama-3's split regex so
llama.cpp names its pre-tokenizer) goes ModelOpt -> GGUF -> MLX -> GGUF ->
compressed-tensors -> ModelOpt; after every step the output's tokenizer (transformers'
``AutoTokenizer`` on a directory, ``gguf_file=`` on a GGUF) encodes and decodes every text
exactly as the original does."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from nvfp4 import quantize
from nvfp4_checkpoints import CheckpointError, open_checkpoint, write_checkpoint
from nvfp4_checkpoints.tokenizer import TokenizerUnavailable, hf_tokenizer_from_gguf
from small_models import byte_level_bpe

pytest.importorskip("gguf")
tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

TEXTS = (
    "Hello world! 123 4567 and 89.",
    "  multiple   spaces\n\n\ttabs\r\nand lines ",
    "<|begin|>user: Café déjà vu, naïve façade<|end|>",
    "日本語 🎉 emoji, it's we'll",
)
SPECIALS = ["<|begin|>", "<|end|>", "<|pad|>"]
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's 2024 and we'll see 12345 numbers.",
    "Hello world! Hello there. Le café est très bon; naïve façade, déjà vu.",
] * 4


def _tokenizer_dir(path: Path) -> Path:
    split = tokenizers.pre_tokenizers.Split(tokenizers.Regex(LLAMA3_SPLIT), behavior="isolated")
    byte_level_bpe(path, [split], SPECIALS, corpus=CORPUS, vocab_size=400)
    config = {
        "bos_token": SPECIALS[0],
        "eos_token": SPECIALS[1],
        "pad_token": SPECIALS[2],
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return path


def _model(vocab: int) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    h = 64
    rng = np.random.default_rng(3)
    planes = {
        f"model.layers.0.{p}": quantize(rng.standard_normal((h, h)).astype(np.float32), name=p)
        for p in ("self_attn.q_proj", "self_attn.o_proj")
    }
    tensors = {"model.embed_tokens.weight": rng.standard_normal((vocab, h)).astype(np.float32)}
    config = {"model_type": "llama", "num_hidden_layers": 1, "vocab_size": vocab}
    return planes, tensors, config


def _auto(path: Path) -> Any:
    logging.getLogger("transformers").setLevel(logging.ERROR)
    if path.is_file():
        return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return transformers.AutoTokenizer.from_pretrained(str(path))


def _assert_same_tokenizer(got: Any, want: Any, where: str) -> None:
    for text in TEXTS:
        ids = want(text, add_special_tokens=False)["input_ids"]
        assert got(text, add_special_tokens=False)["input_ids"] == ids, (where, text)
        assert got.decode(ids) == want.decode(ids) == text, (where, text)
    assert (got.bos_token, got.eos_token) == (want.bos_token, want.eos_token), where


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tokenizer_dir(tmp_path_factory.mktemp("tok") / "tok")


def test_every_conversion_carries_the_tokenizer(tok_dir: Path, tmp_path: Path) -> None:
    want = _auto(tok_dir)
    planes, tensors, config = _model(len(want))
    src = write_checkpoint(
        tmp_path / "modelopt", planes, flavour="modelopt", tensors=tensors, config=config,
        tokenizer=tok_dir,
    )  # fmt: skip
    _assert_same_tokenizer(_auto(src), want, "modelopt")
    chain = [
        ("gguf", "a.gguf"),
        ("mlx", "mlx"),
        ("gguf", "b.gguf"),
        ("compressed-tensors", "ct"),
        ("modelopt", "modelopt_again"),
    ]
    for flavour, name in chain:
        with open_checkpoint(src) as ck:
            src = write_checkpoint(tmp_path / name, ck, flavour=flavour)
        _assert_same_tokenizer(_auto(src), want, f"{name} ({flavour})")
        if src.is_dir():
            # exactly the GGUF's tokens: transformers' GGUF reading adds <|endoftext|> to a
            # vocabulary without it; the tokenizer.json written drops it
            assert len(_auto(src)) == len(want), name


def test_planes_take_a_gguf_tokenizer(tok_dir: Path, tmp_path: Path) -> None:
    want = _auto(tok_dir)
    planes, tensors, config = _model(len(want))
    src = write_checkpoint(
        tmp_path / "src", planes, flavour="mlx", tensors=tensors, config=config, tokenizer=tok_dir
    )
    with open_checkpoint(src) as ck:
        gguf = write_checkpoint(tmp_path / "t.gguf", ck, flavour="gguf")
    out = write_checkpoint(
        tmp_path / "out", planes, flavour="modelopt", tensors=tensors, config=config,
        tokenizer=gguf,
    )  # fmt: skip
    _assert_same_tokenizer(_auto(out), want, "planes + tokenizer=<gguf>")
    config_json = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert "is_local" not in config_json
    assert "local_files_only" not in config_json


def test_a_gguf_without_tokenizer_converts_with_a_note(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    planes, tensors, config = _model(300)
    src = write_checkpoint(tmp_path / "src", planes, flavour="mlx", tensors=tensors, config=config)
    with open_checkpoint(src) as ck:
        gguf = write_checkpoint(tmp_path / "t.gguf", ck, flavour="gguf")
    caplog.clear()
    with caplog.at_level(logging.WARNING), open_checkpoint(gguf) as ck:
        out = write_checkpoint(tmp_path / "out", ck, flavour="mlx")
    assert not (out / "tokenizer.json").exists()
    notes = [r.getMessage() for r in caplog.records]
    assert any(
        "the output has no tokenizer" in n and "no tokenizer metadata (tokenizer.ggml.model)" in n
        for n in notes
    ), notes
    _refused_as_tokenizer(
        tmp_path / "refused", gguf, TokenizerUnavailable, r"t\.gguf: no tokenizer metadata"
    )


def test_without_transformers_the_reason_is_given(
    tok_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    planes, tensors, config = _model(len(_auto(tok_dir)))
    src = write_checkpoint(
        tmp_path / "src", planes, flavour="mlx", tensors=tensors, config=config, tokenizer=tok_dir
    )
    with open_checkpoint(src) as ck:
        gguf = write_checkpoint(tmp_path / "t.gguf", ck, flavour="gguf")
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers fails
    with pytest.raises(TokenizerUnavailable, match=r"needs transformers \(pip install"):
        hf_tokenizer_from_gguf(gguf, tmp_path)
    assert not (tmp_path / "tokenizer.json").exists()


def _refused_as_tokenizer(dst: Path, tokenizer: Path, error: type[Exception], match: str) -> None:
    """Writing the 300-token model as MLX at ``dst`` with ``tokenizer`` raises ``error``
    (message matching ``match``) and leaves no ``dst``."""
    planes, tensors, config = _model(300)
    with pytest.raises(error, match=match):
        write_checkpoint(
            dst, planes, flavour="mlx", tensors=tensors, config=config, tokenizer=tokenizer
        )
    assert not dst.exists()


def test_a_directory_without_tokenizer_is_refused_as_tokenizer(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    _refused_as_tokenizer(
        tmp_path / "x",
        tmp_path / "empty",
        CheckpointError,
        "expected a Hugging Face tokenizer directory",
    )


def test_a_symlinked_tokenizer_file_is_refused(tok_dir: Path, tmp_path: Path) -> None:
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "tokenizer.json").symlink_to(tok_dir / "tokenizer.json")
    _refused_as_tokenizer(
        tmp_path / "x", linked, CheckpointError, r"linked: file 'tokenizer\.json': is a symlink"
    )


def test_cli_convert_takes_a_tokenizer(tok_dir: Path, tmp_path: Path) -> None:
    want = _auto(tok_dir)
    planes, tensors, config = _model(len(want))
    src = write_checkpoint(
        tmp_path / "src", planes, flavour="modelopt", tensors=tensors, config=config
    )
    with open_checkpoint(src) as ck:
        gguf = write_checkpoint(tmp_path / "bare.gguf", ck, flavour="gguf")  # no tokenizer
    run = subprocess.run(
        [sys.executable, "-m", "nvfp4_checkpoints.cli", "convert", str(gguf),
         str(tmp_path / "mlx"), "--to", "mlx", "--tokenizer", str(tok_dir)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    _assert_same_tokenizer(_auto(tmp_path / "mlx"), want, "convert --tokenizer")
