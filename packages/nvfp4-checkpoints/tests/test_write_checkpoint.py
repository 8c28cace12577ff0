"""write_checkpoint, the one writing entry point: the table of flavours behind it, and the
arguments it refuses before anything is written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from nvfp4 import quantize
from nvfp4_checkpoints import (
    FLAVOUR_IO,
    FLAVOURS,
    CheckpointError,
    open_checkpoint,
    write_checkpoint,
)

CONFIG = {"model_type": "llama", "num_hidden_layers": 1}


def _planes() -> dict[str, object]:
    w = np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32)
    return {"model.layers.0.mlp.down_proj": quantize(w, name="model.layers.0.mlp.down_proj")}


def test_the_table_has_every_flavour_in_order() -> None:
    assert tuple(FLAVOUR_IO) == FLAVOURS
    assert [io.flavour for io in FLAVOUR_IO.values()] == list(FLAVOURS)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_every_flavour_reads_back_what_it_wrote(tmp_path: Path, flavour: str) -> None:
    if flavour == "gguf":
        pytest.importorskip("gguf")
    planes = _planes()
    norm = {"model.norm.weight": np.ones(64, np.float32)}
    dst = tmp_path / ("out.gguf" if flavour == "gguf" else "out")
    out = write_checkpoint(
        dst, planes, flavour=flavour, tensors=norm, config=CONFIG, input_scales={}
    )
    assert out == dst
    with open_checkpoint(out) as ck:
        assert ck.flavour == flavour
        (name,) = ck.quantized_names()
        got, want = ck.planes(name), next(iter(planes.values()))
        assert got.codes.tobytes() == want.codes.tobytes()  # type: ignore[attr-defined]
        assert got.scales.tobytes() == want.scales.tobytes()  # type: ignore[attr-defined]
        assert ck.tensor_names() == ["model.norm.weight"]


def test_refuses_an_unknown_flavour_before_writing(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"unknown output flavour 'awq' \(one of modelopt"):
        write_checkpoint(tmp_path / "x", _planes(), flavour="awq", config=CONFIG)
    assert list(tmp_path.iterdir()) == []


def test_planes_need_a_config(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="needs config="):
        write_checkpoint(tmp_path / "x", _planes(), flavour="modelopt")
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoint_source_brings_its_own_tensors_and_config(tmp_path: Path) -> None:
    src = write_checkpoint(tmp_path / "src", _planes(), flavour="modelopt", config=CONFIG)
    with open_checkpoint(src) as ck, pytest.raises(TypeError, match="config, input_scales"):
        write_checkpoint(tmp_path / "x", ck, flavour="mlx", config=CONFIG, input_scales={"a": 1.0})
    assert not (tmp_path / "x").exists()


def test_a_tokenizer_that_is_none_is_refused_before_writing(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a tokenizer")
    with pytest.raises(CheckpointError, match="expected a Hugging Face tokenizer directory"):
        write_checkpoint(
            tmp_path / "x", _planes(), flavour="modelopt", config=CONFIG, tokenizer=tmp_path
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_refuses_a_shard_size_that_is_not_positive(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="max_shard_bytes must be positive, found 0"):
        write_checkpoint(
            tmp_path / "x", _planes(), flavour="modelopt", config=CONFIG, max_shard_bytes=0
        )
    assert list(tmp_path.iterdir()) == []


def test_a_shard_holds_no_more_tensors_than_the_reader_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer starts a new shard before the reader's MAX_HEADER_TENSORS, whatever
    max_shard_bytes allows: we read every file we write (the limit lowered to 3 here)."""
    from nvfp4_checkpoints import hf

    monkeypatch.setattr(hf, "MAX_HEADER_TENSORS", 3)
    tensors = {
        f"model.layers.{i}.input_layernorm.weight": np.ones(64, np.float32) for i in range(4)
    }
    out = write_checkpoint(
        tmp_path / "out", _planes(), flavour="modelopt", tensors=tensors, config=CONFIG
    )
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    assert shards == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    with open_checkpoint(out) as ck:
        assert sorted(ck.tensor_names()) == sorted(tensors)
