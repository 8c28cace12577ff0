"""No silent loss: what a checkpoint lost or got wrong is refused, naming it, not converted.

* An MLX folder we wrote records its NVFP4 tensors and its other tensors in
  ``config.json`` (``nvfp4.tensors``, ``nvfp4.other_tensors``): a plain tensor removed, an
  NVFP4 tensor removed, or an NVFP4 tensor's sidecars removed (its ``.weight`` would read
  as a plain U32 tensor) is refused by every command.
* The config's dimensions are checked against the tensors' shapes (``config_dims``): a
  transposed ``down_proj``, a ``q_proj`` of the wrong head count, an embedding of another
  vocabulary size, a norm of another width, a plain (unquantized) linear transposed.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from nvfp4 import quantize
from nvfp4_checkpoints import CheckpointError, open_checkpoint, write_checkpoint
from nvfp4_checkpoints.cli import main
from nvfp4_checkpoints.safetensors_io import SafetensorsFile, SafetensorsWriter

CONFIG = {
    "model_type": "llama",
    "num_hidden_layers": 1,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 32,
}
L = "model.layers.0"


def _q(n: int, k: int, seed: int) -> Any:
    return quantize(np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32))


def _planes(**override: tuple[int, int]) -> dict[str, Any]:
    shapes = {
        f"{L}.self_attn.q_proj": (64, 64),
        f"{L}.self_attn.k_proj": (32, 64),
        f"{L}.mlp.up_proj": (128, 64),
        f"{L}.mlp.down_proj": (64, 128),
    }
    shapes.update({f"{L}.{k}": v for k, v in override.items()})
    return {name: _q(n, k, i) for i, (name, (n, k)) in enumerate(shapes.items())}


def _tensors(**override: Any) -> dict[str, Any]:
    out = {
        "model.embed_tokens.weight": np.ones((32, 64), np.float32),
        "model.norm.weight": np.ones(64, np.float32),
        f"{L}.input_layernorm.weight": np.ones(64, np.float32),
    }
    out.update(override)
    return out


def _write(path: Path, flavour: str = "modelopt", config: Any = None, **kw: Any) -> Path:
    planes = kw.pop("planes", None) or _planes()
    tensors = kw.pop("tensors", None) or _tensors()
    return write_checkpoint(
        path, planes, flavour=flavour, tensors=tensors, config=config or CONFIG, **kw
    )


def _drop(folder: Path, names: set[str]) -> None:
    """Rewrite ``model.safetensors`` without the tensors ``names``."""
    f = folder / "model.safetensors"
    sf = SafetensorsFile(f)
    keep = [n for n in sf.names() if n not in names]
    arrays = {n: np.array(sf.get(n)) for n in keep}
    entries = [(n, sf.info(n).dtype, sf.info(n).shape) for n in keep]
    tmp = folder / "rewritten"
    with SafetensorsWriter(tmp, entries, sf.metadata) as w:
        for n in keep:
            w.write(n, arrays[n])
    tmp.replace(f)


def _refusal(argv: list[str]) -> str:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    assert status == 2, err.getvalue()
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.fixture
def mlx_folder(tmp_path: Path) -> Path:
    return _write(tmp_path / "mlx", "mlx")


def test_mlx_records_its_tensors(mlx_folder: Path) -> None:
    block = json.loads((mlx_folder / "config.json").read_text())["nvfp4"]
    assert sorted(block["tensors"]) == sorted(_planes())
    assert sorted(block["other_tensors"]) == sorted(_tensors())
    with open_checkpoint(mlx_folder) as ck:
        assert sorted(ck.tensor_names()) == sorted(_tensors())


@pytest.mark.parametrize(
    ("dropped", "said"),
    [
        (
            {"model.norm.weight"},
            r"config.json: key 'nvfp4.other_tensors': expected the folder's non-NVFP4 tensors "
            r"to be the 3 recorded, found 'model.norm.weight' missing \(1 missing, 0 unrecorded\)",
        ),
        (
            {f"{L}.mlp.up_proj.{s}" for s in ("weight", "scales", "global_scale")},
            rf"key 'nvfp4.tensors': expected the folder's NVFP4 tensors to be the 4 recorded, "
            rf"found '{L}.mlp.up_proj' missing",
        ),
        (  # its .weight alone reads as a plain U32 [128, 8] linear: refused either way
            {f"{L}.mlp.up_proj.scales", f"{L}.mlp.up_proj.global_scale"},
            rf"tensor '{L}.mlp.up_proj': expected shape \[128 x 64\] .*found \[128, 8\]",
        ),
    ],
    ids=["a plain tensor", "an NVFP4 tensor", "an NVFP4 tensor's sidecars"],
)
@pytest.mark.parametrize("command", ["inspect", "convert"])
def test_a_tensor_removed_from_an_mlx_folder_is_refused(
    mlx_folder: Path, tmp_path: Path, dropped: set[str], said: str, command: str
) -> None:
    _drop(mlx_folder, dropped)
    argv = [command, str(mlx_folder)]
    if command == "convert":
        argv += [str(tmp_path / "out"), "--to", "modelopt"]
    line = _refusal(argv)
    assert re.search(said, line), line
    assert not (tmp_path / "out").exists()


def test_a_hostile_record_is_refused(mlx_folder: Path) -> None:
    cfg = json.loads((mlx_folder / "config.json").read_text())
    cfg["nvfp4"]["other_tensors"] = "model.norm.weight"
    (mlx_folder / "config.json").write_text(json.dumps(cfg))
    line = _refusal(["inspect", str(mlx_folder)])
    assert "'nvfp4.other_tensors': expected a list of strings" in line, line


def test_an_mlx_folder_without_the_record_still_reads(mlx_folder: Path) -> None:
    """mlx_lm's own folders have no record: nothing to check against."""
    cfg = json.loads((mlx_folder / "config.json").read_text())
    del cfg["nvfp4"]["tensors"], cfg["nvfp4"]["other_tensors"]
    (mlx_folder / "config.json").write_text(json.dumps(cfg))
    _drop(mlx_folder, {"model.norm.weight"})
    with open_checkpoint(mlx_folder) as ck:
        assert "model.norm.weight" not in ck.tensor_names()


@pytest.mark.parametrize(
    ("kw", "said"),
    [
        (
            {"planes": _planes(**{"mlp.down_proj": (128, 64)})},
            rf"'{L}.mlp.down_proj': expected shape \[64 x 128\] \(hidden_size x "
            r"intermediate_size of config.json\), found \[128, 64\]",
        ),
        (
            {"planes": _planes(**{"self_attn.q_proj": (32, 64)})},
            rf"'{L}.self_attn.q_proj': expected shape \[64 x 64\] \(num_attention_heads x "
            r"head_dim x hidden_size",
        ),
        (
            {"tensors": _tensors(**{"model.embed_tokens.weight": np.ones((48, 64), np.float32)})},
            r"'model.embed_tokens.weight': expected shape \[32 x 64\] \(vocab_size x "
            r"hidden_size of config.json\), found \[48, 64\]",
        ),
        (
            {"tensors": _tensors(**{"model.norm.weight": np.ones(32, np.float32)})},
            r"'model.norm.weight': expected shape \[64\] \(hidden_size of config.json\)",
        ),
        (
            {"tensors": _tensors(**{f"{L}.mlp.gate_proj.weight": np.ones((64, 128), np.float32)})},
            rf"'{L}.mlp.gate_proj': expected shape \[128 x 64\] \(intermediate_size",
        ),
    ],
    ids=["down_proj transposed", "q_proj heads", "embedding rows", "norm width", "plain linear"],
)
@pytest.mark.parametrize("flavour", ["modelopt", "mlx"])
def test_config_dims_disagreeing_with_the_tensors_are_refused(
    tmp_path: Path, kw: dict[str, Any], said: str, flavour: str
) -> None:
    src = _write(tmp_path / "src", flavour, **kw)  # writing does not check; reading does
    with pytest.raises(CheckpointError, match=said):
        open_checkpoint(src)
    line = _refusal(["convert", str(src), str(tmp_path / "out"), "--to", "compressed-tensors"])
    assert re.search(said, line), line


def test_an_explicit_head_dim_is_honoured(tmp_path: Path) -> None:
    """Qwen3-style: head_dim 32 with 4 heads makes q_proj 128 rows on a hidden size of 64."""
    cfg = {**CONFIG, "head_dim": 32}
    planes = _planes(**{"self_attn.q_proj": (128, 64), "self_attn.k_proj": (64, 64)})
    src = _write(tmp_path / "src", config=cfg, planes=planes)
    with open_checkpoint(src) as ck:
        assert ck.plane_shape(f"{L}.self_attn.q_proj").shape == (128, 64)


def test_a_config_without_dims_checks_nothing(tmp_path: Path) -> None:
    planes = _planes(**{"mlp.down_proj": (128, 64)})  # would be "transposed"
    src = _write(tmp_path / "src", config={"model_type": "llama"}, planes=planes)
    with open_checkpoint(src) as ck:
        assert len(ck.quantized_names()) == 4
