"""Reading real nvidia-modelopt exports, checked against ModelOpt's own code.

The exports are made by ModelOpt on the CPU (``make_modelopt_exports.py``): a tiny Llama
(float32, NVFP4 W4A4), a tiny Qwen3-MoE (bfloat16, 4 experts) and a MIXED_PRECISION Llama
(attention NVFP4, MLP W4A16_NVFP4).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from nvfp4 import NVFP4Planes, dequantize, quantize
from nvfp4.fusion import stack_experts
from nvfp4_checkpoints import (
    CheckpointError,
    detect_flavour,
    open_checkpoint,
    write_checkpoint,
)

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")


def _load(d: Path) -> dict[str, Any]:
    return st_torch.load_file(str(d / "model.safetensors"))


def _modelopt_names(tensors: dict[str, Any]) -> list[str]:
    return sorted(n[: -len(".weight_scale_2")] for n in tensors if n.endswith(".weight_scale_2"))


@pytest.mark.parametrize("model", ["llama", "moe", "mixed"])
def test_reads_every_tensor_of_a_modelopt_export(
    modelopt_exports: dict[str, Path], model: str
) -> None:
    d = modelopt_exports[model]
    theirs = _load(d)
    with open_checkpoint(d) as ck:
        assert ck.flavour == "modelopt"
        assert ck.config == json.loads((d / "config.json").read_text())
        assert ck.quant_config == json.loads((d / "hf_quant_config.json").read_text())
        names = ck.quantized_names()
        assert sorted(names) == _modelopt_names(theirs)
        owned = {f"{p}.{s}" for p in names for s in ("weight", "weight_scale", "weight_scale_2")}
        owned |= {f"{p}.input_scale" for p in names if f"{p}.input_scale" in theirs}
        assert sorted(ck.tensor_names()) == sorted(set(theirs) - owned)
        for p in names:
            planes = ck.planes(p)
            assert planes.name == p
            assert planes.codes.tobytes() == theirs[f"{p}.weight"].numpy().tobytes()
            scale_bytes = theirs[f"{p}.weight_scale"].view(torch.uint8).numpy()
            assert planes.scales.tobytes() == scale_bytes.tobytes()
            assert float(planes.global_scale) == float(theirs[f"{p}.weight_scale_2"])
            inp = theirs.get(f"{p}.input_scale")
            assert ck.input_scale(p) == (None if inp is None else float(inp))
            assert ck.plane_shape(p).shape == planes.shape
        for n in ck.tensor_names():
            a = ck.tensor(n)
            t = theirs[n]
            assert a.shape == tuple(t.shape)
            if t.dtype == torch.bfloat16:
                assert a.dtype == ml_dtypes.bfloat16
                assert a.tobytes() == t.view(torch.uint16).numpy().tobytes()
            else:
                np.testing.assert_array_equal(a, t.numpy())


@pytest.mark.parametrize("model", ["llama", "moe"])
def test_decoded_values_match_modelopt_dequantization(
    modelopt_exports: dict[str, Path], model: str
) -> None:
    """Oracle: ModelOpt's NVFP4QTensor (its unpacking and E2M1 table) on its own tensors.

    Its dequantize rounds ``e4m3 * weight_scale_2`` first and then multiplies the element,
    where the spec multiplies ``e2m1 * e4m3`` (exact) first: the two agree exactly for the
    power-of-two elements and within one float32 ulp for 1.5, 3 and 6. It also decodes
    code 8 as +0 where the spec says -0. With ModelOpt's table in the spec's order the
    values are bit-identical."""
    from modelopt.torch.quantization.qtensor import NVFP4QTensor

    theirs = _load(modelopt_exports[model])
    e2m1 = NVFP4QTensor.get_e2m1_values("cpu")
    compared = one_ulp = 0
    with open_checkpoint(modelopt_exports[model]) as ck:
        for p in ck.quantized_names():
            w, s, s2 = (theirs[f"{p}.{k}"] for k in ("weight", "weight_scale", "weight_scale_2"))
            shape = torch.Size((w.shape[0], w.shape[1] * 2))
            ref = (
                NVFP4QTensor(shape, torch.float32, w)
                .dequantize(dtype=torch.float32, scale=s, double_scale=s2, block_sizes={-1: 16})
                .numpy()
            )
            ours = dequantize(ck.planes(p), np.float32)
            nz = ref != 0
            assert np.array_equal(ours == 0, ~nz), p
            ulps = np.abs(ref.view(np.int32).astype(np.int64) - ours.view(np.int32)[...])[nz]
            assert int(ulps.max()) <= 1, p
            compared += ref.size
            one_ulp += int((ulps == 1).sum())
            # ModelOpt's own unpacking and table, the spec's order: bit-identical (but ±0)
            codes = torch.stack([w & 0x0F, w >> 4], dim=-1).reshape(shape).long()
            blocks = e2m1[codes].reshape(shape[0], -1, 16) * s.float().unsqueeze(-1)
            spec_order = (blocks * s2).reshape(shape).numpy()
            assert np.array_equal(spec_order, ours), p
    assert compared > 50_000
    assert 0 < one_ulp < compared // 5


def test_mixed_precision_layers(modelopt_exports: dict[str, Path]) -> None:
    d = modelopt_exports["mixed"]
    hq = json.loads((d / "hf_quant_config.json").read_text())["quantization"]
    assert hq["quant_algo"] == "MIXED_PRECISION"
    with open_checkpoint(d) as ck:
        assert sorted(ck.quantized_names()) == sorted(hq["quantized_layers"])
        algos = {p: ck.algo(p) for p in ck.quantized_names()}  # type: ignore[attr-defined]
        assert algos == {k: v["quant_algo"] for k, v in hq["quantized_layers"].items()}
        for p, algo in algos.items():
            assert (ck.input_scale(p) is None) == (algo == "W4A16_NVFP4"), p
        assert {"NVFP4", "W4A16_NVFP4"} == set(algos.values())


def test_expert_and_fused_groups(modelopt_exports: dict[str, Path]) -> None:
    with open_checkpoint(modelopt_exports["moe"]) as ck:
        groups = ck.expert_groups()
        assert sorted(groups) == sorted(
            f"model.layers.{layer}.mlp.experts.{{}}.{proj}"
            for layer in range(2)
            for proj in ("gate_proj", "up_proj", "down_proj")
        )
        for key, members in groups.items():
            assert members == [key.format(i) for i in range(4)]
            stacked = stack_experts([ck.planes(m) for m in members], name=key)
            assert stacked.shape[0] == 4
            assert [float(g) for g in stacked.global_scale] == [
                float(ck.planes(m).global_scale) for m in members
            ]
        fused = ck.fused_groups()
        assert fused["model.layers.0.self_attn.qkv_proj"] == [
            f"model.layers.0.self_attn.{x}_proj" for x in "qkv"
        ]
        assert fused["model.layers.1.mlp.experts.3.gate_up_proj"] == [
            "model.layers.1.mlp.experts.3.gate_proj",
            "model.layers.1.mlp.experts.3.up_proj",
        ]
        # ModelOpt gives fused projections one shared amax before export
        for members in fused.values():
            assert len({float(ck.planes(m).global_scale) for m in members}) == 1
    with open_checkpoint(modelopt_exports["llama"]) as ck:
        assert ck.expert_groups() == {}
        assert sorted(ck.fused_groups()) == [
            "model.layers.0.mlp.gate_up_proj",
            "model.layers.0.self_attn.qkv_proj",
            "model.layers.1.mlp.gate_up_proj",
            "model.layers.1.self_attn.qkv_proj",
        ]


def test_flavour_detection(modelopt_exports: dict[str, Path], tmp_path: Path) -> None:
    src = modelopt_exports["llama"]
    only_config = tmp_path / "only_config"
    shutil.copytree(src, only_config)
    (only_config / "hf_quant_config.json").unlink()
    assert detect_flavour(only_config) == "modelopt"
    with open_checkpoint(only_config) as ck:
        assert len(ck.quantized_names()) == 14
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(CheckpointError, match=r"config\.json without an NVFP4 quantization"):
        detect_flavour(plain)
    (plain / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match=r"config.json is an empty object \{\}"):
        detect_flavour(plain)
    (plain / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"unknown flavour \(no config.json;"):
        detect_flavour(plain)
    ct_int = tmp_path / "ct_int"
    ct_int.mkdir()
    qc = {"quant_method": "compressed-tensors", "format": "pack-quantized"}
    (ct_int / "config.json").write_text(json.dumps({"quantization_config": qc}))
    with pytest.raises(CheckpointError, match="pack-quantized"):
        detect_flavour(ct_int)
    not_gguf = tmp_path / "x.bin"
    not_gguf.write_bytes(b"ABCD1234")
    with pytest.raises(CheckpointError, match="not GGUF"):
        detect_flavour(not_gguf)
    with pytest.raises(CheckpointError, match="no such file"):
        open_checkpoint(tmp_path / "missing")


def _tiny_planes(k: int = 64) -> tuple[dict[str, NVFP4Planes], dict[str, Any]]:
    rng = np.random.default_rng(11)
    planes = {
        f"model.layers.{i}.mlp.{n}": quantize(
            rng.standard_normal((32, k)).astype(np.float32), name=f"model.layers.{i}.mlp.{n}"
        )
        for i in range(3)
        for n in ("gate_proj", "up_proj")
    }
    tensors = {"model.norm.weight": np.ones(k, dtype=ml_dtypes.bfloat16)}
    return planes, tensors


def test_write_modelopt_config_matches_modelopt_and_shards(tmp_path: Path) -> None:
    convert = pytest.importorskip("modelopt.torch.export.convert_hf_config")
    planes, tensors = _tiny_planes()
    inputs = {k: 0.01 for k in planes}
    out = write_checkpoint(
        tmp_path / "one",
        planes,
        flavour="modelopt",
        tensors=tensors,
        config={"model_type": "llama"},
        input_scales=inputs,
    )
    hq = json.loads((out / "hf_quant_config.json").read_text())
    cfg = json.loads((out / "config.json").read_text())
    assert hq["quantization"]["quant_algo"] == "NVFP4"
    assert cfg["quantization_config"] == convert.convert_hf_quant_config_format(hq)
    # weight-only on half of the layers: MIXED_PRECISION
    half = {k: v for i, (k, v) in enumerate(inputs.items()) if i % 2}
    out2 = write_checkpoint(
        tmp_path / "mixed",
        planes,
        flavour="modelopt",
        tensors=tensors,
        config={},
        input_scales=half,
        max_shard_bytes=1500,
    )
    hq2 = json.loads((out2 / "hf_quant_config.json").read_text())
    cfg2 = json.loads((out2 / "config.json").read_text())
    assert hq2["quantization"]["quant_algo"] == "MIXED_PRECISION"
    assert cfg2["quantization_config"] == convert.convert_hf_quant_config_format(hq2)
    index = json.loads((out2 / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 3
    loaded: dict[str, Any] = {}
    for s in shards:
        loaded.update(st_torch.load_file(str(out2 / s)))
    assert set(loaded) == set(index["weight_map"])
    with open_checkpoint(out2) as ck:
        assert sorted(ck.quantized_names()) == sorted(planes)
        for k, p in planes.items():
            back = ck.planes(k)
            assert back.codes.tobytes() == p.codes.tobytes()
            assert back.scales.tobytes() == p.scales.tobytes()
            assert back.global_scale == p.global_scale
            assert ck.input_scale(k) == (np.float32(0.01) if k in half else None)
    # an index naming a missing shard is refused
    (out2 / shards[-1]).unlink()
    with pytest.raises(CheckpointError, match="missing"):
        open_checkpoint(out2)


def test_stacked_expert_planes_are_written_per_expert(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    parts = [quantize(rng.standard_normal((16, 64)).astype(np.float32)) for _ in range(3)]
    stacked = stack_experts(parts, name="model.layers.0.mlp.experts.{}.down_proj")
    out = write_checkpoint(
        tmp_path / "e", {stacked.name: stacked}, flavour="modelopt", tensors={}, config={}
    )
    with open_checkpoint(out) as ck:
        assert ck.quantized_names() == [
            f"model.layers.0.mlp.experts.{i}.down_proj" for i in range(3)
        ]
        for i, p in enumerate(parts):
            assert ck.planes(ck.quantized_names()[i]).codes.tobytes() == p.codes.tobytes()
        assert list(ck.expert_groups()) == ["model.layers.0.mlp.experts.{}.down_proj"]
