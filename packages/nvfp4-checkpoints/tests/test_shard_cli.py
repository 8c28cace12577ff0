"""``nvfp4 shard SRC DST --tp N [--align A]`` and ``nvfp4 verify SRC DST`` of a sharded DST
(spec 1.2 draft, "Sharding"): per-rank folders of SRC's flavour that open alone, a manifest
of every rank's range, Nemotron-3-Nano's 1,856 at TP8 and a 2,880 hidden size whose sharded
matmul sums to the unsharded reference, zero padding, and bad input refused with exit 2 and
one line, nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from nvfp4 import quantize, reference
from nvfp4_checkpoints import open_checkpoint, write_checkpoint
from nvfp4_checkpoints.cli import main
from nvfp4_checkpoints.shard import MANIFEST
from small_models import llama_config


def mlp_checkpoint(path: Path, hidden: int, inter: int, flavour: str = "modelopt") -> Path:
    """One Llama MLP block (gate/up [inter, hidden], down [hidden, inter]) and a norm."""
    rng = np.random.default_rng([hidden, inter])
    layer = "model.layers.0.mlp."
    dense = {
        layer + "gate_proj": rng.standard_normal((inter, hidden), dtype=np.float32),
        layer + "up_proj": rng.standard_normal((inter, hidden), dtype=np.float32),
        layer + "down_proj": rng.standard_normal((hidden, inter), dtype=np.float32),
    }
    planes = {name: quantize(w, name=name) for name, w in dense.items()}
    config = llama_config(hidden=hidden, intermediate=inter, vocab=256)
    norm = {"model.layers.0.post_attention_layernorm.weight": np.ones(hidden, np.float32)}
    return write_checkpoint(path, planes, flavour=flavour, tensors=norm, config=config)


def run(*argv: str) -> int:
    return main(list(argv))


@pytest.mark.parametrize("flavour", ["modelopt", "compressed-tensors", "mlx"])
@pytest.mark.parametrize("tp", [2, 3])
def test_every_flavour_shards_and_verifies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flavour: str, tp: int
) -> None:
    src = mlp_checkpoint(tmp_path / "src", 128, 256, flavour)
    dst = tmp_path / "dst"
    assert run("shard", str(src), str(dst), "--tp", str(tp)) == 0
    manifest = json.loads((dst / MANIFEST).read_text())
    assert manifest["tp"] == tp
    assert manifest["flavour"] == flavour
    assert manifest["spec_version"] == "1.2-draft"
    down = manifest["tensors"]["model.layers.0.mlp.down_proj"]
    gate = manifest["tensors"]["model.layers.0.mlp.gate_proj"]
    assert down["dim"] == "k"
    assert gate["dim"] == "n"
    assert gate["ranks"] == down["ranks"]  # the paired rule
    for rank, (start, stop, padded) in enumerate(down["ranks"]):
        with open_checkpoint(dst / f"rank-{rank}") as part:  # each rank opens alone
            assert part.flavour == flavour
            assert part.planes("model.layers.0.mlp.down_proj").k == padded
            assert part.planes("model.layers.0.mlp.up_proj").n == padded
            assert start % 16 == 0
            assert stop % 16 == 0
            assert part.tensor_names() == ["model.layers.0.post_attention_layernorm.weight"]
    capsys.readouterr()
    assert run("verify", str(src), str(dst)) == 0
    assert capsys.readouterr().out.startswith(f"SAME (sharded, tp={tp}")


def sharded_down(dst: Path, tp: int, name: str) -> list:
    out = []
    for rank in range(tp):
        with open_checkpoint(dst / f"rank-{rank}") as part:
            p = part.planes(name)
            out.append(type(p)(p.codes.copy(), p.scales.copy(), p.global_scale.copy(), name=name))
    return out


@pytest.mark.parametrize(
    ("hidden", "inter", "align"), [(64, 1856, 1), (64, 1856, 8), (2880, 512, 1)]
)
def test_the_sharded_matmul_sums_to_the_reference(
    tmp_path: Path, hidden: int, inter: int, align: int
) -> None:
    # 1,856: Nemotron-3-Nano's routed expert (232 a rank at TP8 is not a multiple of 16)
    src = mlp_checkpoint(tmp_path / "src", hidden, inter)
    dst = tmp_path / "dst"
    assert run("shard", str(src), str(dst), "--tp", "8", "--align", str(align)) == 0
    name = "model.layers.0.mlp.down_proj"
    ranks = json.loads((dst / MANIFEST).read_text())["tensors"][name]["ranks"]
    if inter == 1856 and align == 1:
        assert [(b - a) // 16 for a, b, _ in ranks] == [15] * 4 + [14] * 4
    if align == 8:  # 14.5 units of 128: rank 7 holds 64 values and 64 of zero padding
        assert ranks[7] == [1792, 1856, 128]
    shards = sharded_down(dst, 8, name)
    if align == 8:
        assert not shards[7].codes[:, 32:].any()
        assert not shards[7].scales[:, 4:].any()
    with open_checkpoint(src) as ck:
        whole = ck.planes(name)
    x = np.random.default_rng(1).standard_normal((3, inter)).astype(np.float32)
    total = np.zeros((3, hidden))
    for (a, b, padded), shard in zip(ranks, shards, strict=True):
        xr = np.zeros((3, padded), np.float32)
        xr[:, : b - a] = x[:, a:b]
        total += reference.qmm(xr, shard, out_dtype=None)
    np.testing.assert_allclose(
        total, reference.qmm(x, whole, out_dtype=None), rtol=1e-12, atol=1e-9
    )
    assert run("verify", str(src), str(dst)) == 0


def test_bad_input_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = mlp_checkpoint(tmp_path / "src", 128, 256)
    gguf = tmp_path / "w.gguf"
    assert run("convert", str(src), str(gguf), "--to", "gguf") == 0
    capsys.readouterr()

    def refused(*argv: str, match: str) -> None:
        assert run(*argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert match in err, err

    refused("shard", str(gguf), str(tmp_path / "g"), "--tp", "2", match="GGUF cannot be sharded")
    # 256 / 16 = 16 blocks cannot feed 32 ranks: the plan would cut a block
    refused("shard", str(src), str(tmp_path / "t"), "--tp", "32", match="down_proj")
    assert not (tmp_path / "g").exists()
    assert not (tmp_path / "t").exists()
    assert not list(tmp_path.glob(".t.*"))
    dst = tmp_path / "dst"
    assert run("shard", str(src), str(dst), "--tp", "2") == 0
    capsys.readouterr()
    refused("shard", str(src), str(dst), "--tp", "2", match="exists")
    # a manifest that disagrees with the plan, then a missing rank folder
    manifest = json.loads((dst / MANIFEST).read_text())
    good = json.dumps(manifest)
    manifest["tensors"]["model.layers.0.mlp.down_proj"]["ranks"][0][1] = 120
    (dst / MANIFEST).write_text(json.dumps(manifest))
    refused(
        "verify",
        str(src),
        str(dst),
        match="shard-manifest.json: tensor 'model.layers.0.mlp.down_proj'",
    )
    (dst / MANIFEST).write_text(good)
    shutil.rmtree(dst / "rank-1")
    refused("verify", str(src), str(dst), match="rank-1: missing")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst", "src", "w.gguf"]
