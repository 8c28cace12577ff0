"""Convert real ModelOpt exports to every flavour and back through the CLI, and check each
written file with an independent reader: the safetensors library, gguf-py's NVFP4
dequantizer, MLX's ``mx.dequantize`` and compressed-tensors' own decompressor.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from make_modelopt_exports import session_exports
from nvfp4 import dequantize
from nvfp4_checkpoints import Checkpoint, open_checkpoint
from nvfp4_checkpoints.cli import main

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")

FLAVOURS = ("modelopt", "compressed-tensors", "mlx", "gguf")
MODELS = ("llama", "moe")


@pytest.fixture(scope="session")
def modelopt_exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return session_exports(tmp_path_factory)


def _dst(base: Path, flavour: str) -> Path:
    return base / ("model.gguf" if flavour == "gguf" else flavour)


def _convert(src: Path, dst: Path, to: str, *extra: str) -> Path:
    assert main(["convert", str(src), str(dst), "--to", to, *extra]) == 0
    return dst


@pytest.fixture(scope="module")
def converted(
    modelopt_exports: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[tuple[str, str], Path]:
    out = {}
    for model in (*MODELS, "mixed"):
        base = tmp_path_factory.mktemp(f"conv_{model}")
        for flavour in FLAVOURS:
            out[model, flavour] = _convert(modelopt_exports[model], _dst(base, flavour), flavour)
    return out


def _ulps(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> int:
    x = np.asarray(a, np.float32).reshape(-1).view(np.int32).astype(np.int64)
    y = np.asarray(b, np.float32).reshape(-1).view(np.int32).astype(np.int64)
    return int(np.abs(x - y).max()) if x.size else 0


def _assert_same(a: Checkpoint, b: Checkpoint, ulp: int) -> int:
    """Same NVFP4 tensors (bytes; globals within ``ulp``) and the same other tensors.
    Returns the number of globals that differ (by at most ``ulp``)."""
    assert sorted(a.quantized_names()) == sorted(b.quantized_names())  # order: file order
    differing = 0
    for n in a.quantized_names():
        pa, pb = a.planes(n), b.planes(n)
        assert pa.codes.tobytes() == pb.codes.tobytes(), n
        assert pa.scales.tobytes() == pb.scales.tobytes(), n
        assert pa.codes.shape == pb.codes.shape, n
        assert pa.scales.shape == pb.scales.shape, n
        u = _ulps(pa.global_scale, pb.global_scale)
        assert u <= ulp, (n, u)
        differing += int(u > 0)
        ia, ib = a.input_scale(n), b.input_scale(n)
        assert (ia is None) == (ib is None), n
        if ia is not None and ib is not None:
            assert _ulps(np.float32(ia), np.float32(ib)) <= ulp, n
    assert sorted(a.tensor_names()) == sorted(b.tensor_names())
    for n in a.tensor_names():
        x, y = a.tensor(n), b.tensor(n)
        assert x.dtype == y.dtype, n
        assert x.shape == y.shape, n
        assert x.tobytes() == y.tobytes(), n
    return differing


def _raw_quantized(path: Path, prefixes: list[str]) -> dict[str, Any]:
    """The stored tensors of the quantized prefixes, read by the safetensors library."""
    tensors = {}
    for f in sorted(path.glob("*.safetensors")):
        for k, v in st_torch.load_file(str(f)).items():
            if k.rpartition(".")[0] in prefixes:
                tensors[k] = v
    return tensors


def _float32_view(t: Any) -> npt.NDArray[Any]:
    if t.dtype in (torch.float32,):
        return t.numpy().astype(np.float32)
    return t.contiguous().view(-1).view(torch.uint8).numpy()


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize(
    ("x", "y"), list(itertools.permutations(FLAVOURS, 2)), ids=lambda f: str(f)
)
def test_convert_there_and_back_is_lossless(
    converted: dict[tuple[str, str], Path], tmp_path: Path, model: str, x: str, y: str
) -> None:
    a_path = converted[model, x]
    mid = _convert(a_path, tmp_path / f"mid_{y}", y)
    back = _convert(mid, _dst(tmp_path, x), x)
    ct = "compressed-tensors" in (x, y)
    with open_checkpoint(a_path) as a, open_checkpoint(back) as b:
        assert a.flavour == b.flavour == x
        _assert_same(a, b, ulp=1 if ct else 0)
        prefixes = a.quantized_names()
    if x != "gguf":
        ra, rb = _raw_quantized(a_path, prefixes), _raw_quantized(back, prefixes)
        assert sorted(ra) == sorted(rb)
        for k in ra:
            assert ra[k].dtype == rb[k].dtype, k
            assert ra[k].shape == rb[k].shape, k
            if ct and ra[k].dtype == torch.float32:
                assert _ulps(ra[k].numpy(), rb[k].numpy()) <= 1, k
            else:
                assert _float32_view(ra[k]).tobytes() == _float32_view(rb[k]).tobytes(), k
    assert main(["verify", str(a_path), str(back), "--global-ulps", "1" if ct else "0"]) == 0


@pytest.mark.parametrize("model", [*MODELS, "mixed"])
def test_every_flavour_holds_the_export_exactly(
    modelopt_exports: dict[str, Path],
    converted: dict[tuple[str, str], Path],
    model: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src = modelopt_exports[model]
    with open_checkpoint(src) as ref:
        names = ref.quantized_names()
        for flavour in FLAVOURS:
            capsys.readouterr()
            assert main(["inspect", str(converted[model, flavour]), "--json"]) == 0
            report = json.loads(capsys.readouterr().out)
            assert report["flavour"] == flavour
            assert report["quantized"]["count"] == len(names)
            assert report["validation"]["valid"] == len(names)
            with open_checkpoint(converted[model, flavour]) as ck:
                assert ck.flavour == flavour
                _assert_same(ref, ck, ulp=1 if flavour == "compressed-tensors" else 0)
                if flavour == "gguf":  # the HF config travels in the GGUF metadata
                    assert ck.config == ref.config
    # the ModelOpt output stores the export's quantized tensors byte for byte
    ra, rb = _raw_quantized(src, names), _raw_quantized(converted[model, "modelopt"], names)
    assert sorted(ra) == sorted(rb)
    for k in ra:
        assert _float32_view(ra[k]).tobytes() == _float32_view(rb[k]).tobytes(), k
    hq_src = json.loads((src / "hf_quant_config.json").read_text())["quantization"]
    hq_out = json.loads((converted[model, "modelopt"] / "hf_quant_config.json").read_text())
    assert hq_out["quantization"]["quant_algo"] == hq_src["quant_algo"]
    if "quantized_layers" in hq_src:
        assert hq_out["quantization"]["quantized_layers"] == hq_src["quantized_layers"]
    else:
        assert hq_out["quantization"]["exclude_modules"] == hq_src["exclude_modules"]


def _spec_dequant(tensors: dict[str, Any], p: str) -> npt.NDArray[np.float32]:
    """ModelOpt's tensors decoded with ModelOpt's E2M1 table in the spec's order (see
    test_checkpoint_modelopt: bit-identical to our decoder but for the sign of zero)."""
    from modelopt.torch.quantization.qtensor import NVFP4QTensor

    w, s, s2 = (tensors[f"{p}.{k}"] for k in ("weight", "weight_scale", "weight_scale_2"))
    shape = (w.shape[0], w.shape[1] * 2)
    codes = torch.stack([w & 0x0F, w >> 4], dim=-1).reshape(shape).long()
    blocks = NVFP4QTensor.get_e2m1_values("cpu")[codes].reshape(shape[0], -1, 16)
    return ((blocks * s.float().unsqueeze(-1)) * s2).reshape(shape).numpy()


def _llama_permute(a: npt.NDArray[Any], n_head: int) -> npt.NDArray[Any]:
    """llama.cpp's convert_hf_to_gguf ``LlamaModel.permute`` (q/k rows for its RoPE)."""
    return (
        a.reshape(n_head, 2, a.shape[0] // n_head // 2, *a.shape[1:])
        .swapaxes(1, 2)
        .reshape(a.shape)
    )


@pytest.mark.parametrize("model", list(MODELS))
def test_gguf_decodes_with_gguf_py_to_modelopt_values(
    modelopt_exports: dict[str, Path], converted: dict[tuple[str, str], Path], model: str
) -> None:
    gguf = pytest.importorskip("gguf")
    src = modelopt_exports[model]
    theirs = st_torch.load_file(str(src / "model.safetensors"))
    cfg = json.loads((src / "config.json").read_text())
    reader = gguf.GGUFReader(converted[model, "gguf"])
    tensors = {t.name: t for t in reader.tensors}
    assert reader.fields["general.architecture"].contents() == (
        "llama" if model == "llama" else "qwen3moe"
    )
    nvfp4 = [t for t in reader.tensors if t.tensor_type == gguf.GGMLQuantizationType.NVFP4]
    assert nvfp4, "no NVFP4 tensors"
    checked = 0
    with open_checkpoint(src) as ck:
        groups = ck.expert_groups()
    for t in nvfp4:
        base = t.name.removesuffix(".weight")
        scale = tensors[f"{base}.scale"].data
        values = gguf.quants.dequantize(t.data, gguf.GGMLQuantizationType.NVFP4)
        values = values.reshape(*t.data.shape[:-1], -1)
        if t.data.ndim == 3:  # merged experts, one .scale each
            values = values * scale.reshape(-1, 1, 1)
        else:
            values = values * scale.reshape(())
        # find the HF tensor(s) via the name map gguf-py gives this architecture
        if t.data.ndim == 3:
            key = next(k for k in groups if gguf_name(gguf, cfg, k) == base)
            ref = np.stack([_spec_dequant(theirs, key.format(i)) for i in range(len(groups[key]))])
        else:
            hf = next(p for p in ck.quantized_names() if gguf_name(gguf, cfg, p) == base)
            ref = _spec_dequant(theirs, hf)
            leaf = base.rpartition(".")[2]
            if model == "llama" and leaf in ("attn_q", "attn_k"):
                heads = (
                    cfg["num_attention_heads"] if leaf == "attn_q" else cfg["num_key_value_heads"]
                )
                ref = _llama_permute(ref, heads)
        assert values.shape == ref.shape, base
        np.testing.assert_array_equal(values.astype(np.float32), ref, err_msg=base)
        checked += 1
    assert checked == len(nvfp4)


def gguf_name(gguf: Any, cfg: dict[str, Any], hf_prefix: str) -> str | None:
    arch = {"llama": "llama", "qwen3_moe": "qwen3moe"}[cfg["model_type"]]
    arch_enum = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[arch]
    tmap = gguf.get_tensor_name_map(arch_enum, cfg["num_hidden_layers"])
    name = tmap.get_name(hf_prefix.replace(".{}", "") + ".weight", try_suffixes=(".weight",))
    return None if name is None else str(name).removesuffix(".weight")


@pytest.mark.parametrize("model", list(MODELS))
def test_mlx_dequantize_matches_modelopt_values(
    modelopt_exports: dict[str, Path], converted: dict[tuple[str, str], Path], model: str
) -> None:
    mx = pytest.importorskip("mlx.core")
    theirs = st_torch.load_file(str(modelopt_exports[model] / "model.safetensors"))
    d = converted[model, "mlx"]
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["quantization"] == {"group_size": 16, "bits": 4, "mode": "nvfp4"}
    assert cfg["nvfp4"]["spec_version"] == "1.0"
    mlx_tensors = st_torch.load_file(str(d / "model.safetensors"))
    with open_checkpoint(d) as ck:
        prefixes = ck.quantized_names()
    for p in prefixes:
        w = mlx_tensors[f"{p}.weight"]
        assert w.dtype == torch.uint32
        wq = mx.array(w.view(torch.int32).numpy().view(np.uint32))
        sc = mx.array(mlx_tensors[f"{p}.scales"].numpy())
        out = mx.dequantize(wq, sc, group_size=16, bits=4, mode="nvfp4", dtype=mx.float32)
        values = np.array(out) * mlx_tensors[f"{p}.global_scale"].numpy()
        np.testing.assert_array_equal(values, _spec_dequant(theirs, p), err_msg=p)


@pytest.mark.parametrize("model", list(MODELS))
def test_compressed_tensors_checked_by_its_own_library(
    modelopt_exports: dict[str, Path], converted: dict[tuple[str, str], Path], model: str
) -> None:
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    from compressed_tensors.entrypoints.convert.converters.modelopt_nvfp4 import (
        ModelOptNvfp4Converter,
    )
    from compressed_tensors.quantization import QuantizationConfig
    from compressed_tensors.quantization.lifecycle.forward import dequantize as ct_dequantize

    d = converted[model, "compressed-tensors"]
    qc = QuantizationConfig.model_validate(
        json.loads((d / "config.json").read_text())["quantization_config"]
    )
    assert qc.format == "nvfp4-pack-quantized"
    scheme = qc.config_groups["group_0"]
    ours = st_torch.load_file(str(d / "model.safetensors"))
    export = st_torch.load_file(str(modelopt_exports[model] / "model.safetensors"))
    # compressed-tensors' own ModelOpt -> CT converter gives the same tensors
    ref = ModelOptNvfp4Converter(targets=["re:.*"]).process(dict(export))
    assert sorted(ref) == sorted(ours)
    for k, t in ref.items():
        o = ours[k]
        assert _float32_view(t.reshape(o.shape)).tobytes() == _float32_view(o).tobytes(), k
    worst_bf16 = worst_f32 = 0.0
    with open_checkpoint(d) as ck:
        for p in ck.quantized_names():
            sd = {
                k: ours[f"{p}.{k}"]
                for k in ("weight_packed", "weight_scale", "weight_global_scale")
            }
            mine = dequantize(ck.planes(p), np.float32)
            nz = mine != 0
            # the decompressor as vLLM / transformers call it (bfloat16)
            got = NVFP4PackedCompressor.decompress(sd, scheme)["weight"].float().numpy()
            assert np.array_equal(got == 0, ~nz), p
            worst_bf16 = max(worst_bf16, float((np.abs(got - mine)[nz] / np.abs(mine[nz])).max()))
            # its unpacking and dequantize in float32
            m, n = sd["weight_packed"].shape
            codes = unpack_fp4_from_uint8(sd["weight_packed"], m, n * 2, dtype=torch.float32)
            got32 = ct_dequantize(
                x_q=codes,
                scale=sd["weight_scale"].to(torch.float32),
                args=scheme.weights,
                global_scale=sd["weight_global_scale"],
                dtype=torch.float32,
            ).numpy()
            worst_f32 = max(worst_f32, float((np.abs(got32 - mine)[nz] / np.abs(mine[nz])).max()))
    # CT divides by the ENCODE global in the working dtype: within 2 ulps of that dtype
    assert worst_bf16 <= 2.0**-7
    assert worst_f32 <= 2.0**-21


def test_sharded_output_and_verify_names_the_first_difference(
    converted: dict[tuple[str, str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = converted["moe", "mlx"]
    sharded = _convert(src, tmp_path / "sharded", "modelopt", "--max-shard-bytes", "20000")
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 3
    capsys.readouterr()
    assert main(["verify", str(src), str(sharded)]) == 0
    assert "SAME (mlx vs modelopt)" in capsys.readouterr().out
    # flip one code byte of one tensor in a copy
    doctored = _convert(sharded, tmp_path / "doctored", "modelopt")
    victim = "model.layers.1.mlp.experts.2.up_proj"
    name = f"{victim}.weight"
    shard = doctored / "model.safetensors"
    data = st_torch.load_file(str(shard))
    data[name] = data[name].clone()
    data[name][3, 5] ^= 0x11
    st_torch.save_file(data, str(shard), metadata={"format": "pt"})
    capsys.readouterr()
    assert main(["verify", str(sharded), str(doctored)]) == 1
    out = capsys.readouterr().out
    assert victim in out
    assert "codes differ at (3, 5)" in out


def test_gguf_written_by_gguf_py_itself(tmp_path: Path) -> None:
    """A GGUF laid out as llama.cpp's converter does (GGUF names, no nvfp4.* keys, a .scale
    only where it is not 1.0), written by gguf-py from random valid NVFP4 blocks, read back
    and checked against gguf-py's own NVFP4 decoder (with llama's q/k row order undone)."""
    gguf = pytest.importorskip("gguf")
    nvfp4_type = gguf.GGMLQuantizationType.NVFP4
    rng = np.random.default_rng(9)
    n_head, n_kv = 4, 2
    shapes = {"blk.0.attn_q": (64, 128), "blk.0.attn_k": (32, 128), "blk.0.ffn_down": (16, 64)}
    blocks = {}
    for base, (n, k) in shapes.items():
        raw = rng.integers(0, 256, (n, k // 64, 36), dtype=np.uint8)
        raw[..., :4] = rng.integers(0x08, 0x7F, (n, k // 64, 4), dtype=np.uint8)  # valid scales
        blocks[base] = raw.reshape(n, -1)
    scales = {"blk.0.attn_q": np.array([0.5], np.float32)}
    path = tmp_path / "foreign.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    for base, b in blocks.items():
        w.add_tensor(f"{base}.weight", b, raw_dtype=nvfp4_type)
        if base in scales:
            w.add_tensor(f"{base}.scale", scales[base])
    w.add_tensor("output_norm.weight", np.ones(64, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open_checkpoint(path) as ck:
        assert ck.flavour == "gguf"
        assert sorted(ck.quantized_names()) == sorted(shapes)
        assert ck.tensor_names() == ["output_norm.weight"]
        assert ck.config == {}
        for base, b in blocks.items():
            values = gguf.quants.dequantize(b, nvfp4_type).reshape(shapes[base])
            values = values * scales.get(base, np.ones(1, np.float32))[0]
            ours = dequantize(ck.planes(base), np.float32)
            if base.endswith(("attn_q", "attn_k")):  # the file holds llama.cpp's row order
                ours = _llama_permute(ours, n_head if base.endswith("attn_q") else n_kv)
            np.testing.assert_array_equal(ours, values, err_msg=base)
            assert ck.input_scale(base) is None


def test_mlx_quantize_output_without_sidecars(tmp_path: Path) -> None:
    """An nvfp4 directory as mlx_lm writes it (``mx.quantize(mode="nvfp4")``, no global
    sidecar): read with a global of 1.0 and decoded exactly as ``mx.dequantize`` does."""
    mx = pytest.importorskip("mlx.core")
    from nvfp4_checkpoints.safetensors_io import save_file

    rng = np.random.default_rng(4)
    d = tmp_path / "mlx_lm"
    d.mkdir()
    tensors: dict[str, Any] = {}
    expected = {}
    for name in ("model.layers.0.mlp.down_proj", "model.layers.0.mlp.up_proj"):
        w = mx.array(rng.standard_normal((32, 64)).astype(np.float32))
        wq, scales = mx.quantize(w, group_size=16, bits=4, mode="nvfp4")
        tensors[f"{name}.weight"] = np.array(wq)
        tensors[f"{name}.scales"] = np.array(scales)
        expected[name] = np.array(
            mx.dequantize(wq, scales, group_size=16, bits=4, mode="nvfp4", dtype=mx.float32)
        )
    tensors["model.norm.weight"] = np.ones(64, np.float32)
    save_file(d / "model.safetensors", tensors)
    cfg = {"model_type": "llama", "quantization": {"group_size": 16, "bits": 4, "mode": "nvfp4"}}
    (d / "config.json").write_text(json.dumps(cfg))
    with open_checkpoint(d) as ck:
        assert ck.flavour == "mlx"
        assert sorted(ck.quantized_names()) == sorted(expected)
        assert ck.tensor_names() == ["model.norm.weight"]
        for name, values in expected.items():
            planes = ck.planes(name)
            assert float(planes.global_scale) == 1.0
            np.testing.assert_array_equal(dequantize(planes, np.float32), values, err_msg=name)


@pytest.mark.parametrize("model", list(MODELS))
def test_gguf_file_does_not_depend_on_the_chunk_size(
    converted: dict[tuple[str, str], Path],
    model: str,
    modelopt_exports: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The GGUF writer streams NVFP4 data in chunks of whole rows through a background
    writer; with chunks of one or a few rows (every tensor split at many row boundaries) the
    file is byte for byte the one written with the default chunk size."""
    import nvfp4.layouts.gguf as gguf_layout

    for chunk_bytes in (1, 1000):  # one row per chunk; a few rows, ragged at the end
        monkeypatch.setattr(gguf_layout, "CHUNK_BYTES", chunk_bytes)
        out = _convert(modelopt_exports[model], tmp_path / f"c{chunk_bytes}.gguf", "gguf")
        assert out.read_bytes() == converted[model, "gguf"].read_bytes()
