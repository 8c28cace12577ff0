"""nvfp4_metal.load end to end on checkpoints exported by NVIDIA ModelOpt: the mlx-lm model
generates with mlx-lm's own functions, greedy tokens equal a float32 forward of the same
model holding the exactly decoded weights, and the NVFP4 modules hold the checkpoint's
bytes."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import nvfp4_metal
import pytest
from metal_helpers import to_np
from mlx.utils import tree_unflatten
from nvfp4 import reference
from nvfp4.planes import NVFP4Planes
from nvfp4.testing import relative_error
from nvfp4_checkpoints import open_checkpoint, write_checkpoint
from nvfp4_metal.loader import LoadError, NoTokenizerWarning, mlx_lm_config
from nvfp4_metal.nn import NVFP4Linear, NVFP4SwitchLinear

mlx_lm = pytest.importorskip("mlx_lm")
from mlx_lm.generate import generate_step  # noqa: E402
from mlx_lm.models.switch_layers import SwitchLinear  # noqa: E402

PROMPT = [1, 5, 9, 3, 7, 11]
STEPS = 16


def module_planes(m: Any) -> NVFP4Planes:
    """The canonical planes behind an NVFP4 module, read back from its own arrays."""
    g = np.array(m["global_scale"])
    if isinstance(m, NVFP4SwitchLinear):
        g = g.reshape(-1) if g.shape[-1] == 1 else g
    codes = np.array(m["weight"]).view(np.uint8)
    return NVFP4Planes(codes, np.array(m["scales"]), g.astype(np.float32), m.info.partitions)


def dense_twin(model: nn.Module) -> nn.Module:
    """The same model with every NVFP4 module replaced by a dense float32 one holding the
    weights decoded by nvfp4.reference (the independent oracle)."""
    swaps = []
    for path, m in model.named_modules():
        if isinstance(m, NVFP4Linear):
            d = nn.Linear(m.input_dims, m.output_dims, bias="bias" in m)
            d.weight = mx.array(reference.dequantize(module_planes(m)))
            if "bias" in m:
                d.bias = m["bias"]
            swaps.append((path, d))
        elif isinstance(m, NVFP4SwitchLinear):
            d = SwitchLinear(m.input_dims, m.output_dims, m.num_experts, bias=False)
            d.weight = mx.array(reference.dequantize(module_planes(m)))
            swaps.append((path, d))
    assert swaps, "no NVFP4 module found"
    model.update_modules(tree_unflatten(swaps))
    return model


def greedy(model: nn.Module, steps: int = STEPS) -> tuple[list[int], np.ndarray]:
    toks, logps = [], []
    for tok, logprobs in generate_step(mx.array(PROMPT), model, max_tokens=steps):
        toks.append(int(tok))
        logps.append(np.array(logprobs.astype(mx.float32)))
    return toks, np.stack(logps)


@pytest.mark.parametrize("name", ["llama", "moe"])
def test_greedy_equals_float32_forward_of_decoded_weights(
    exports: dict[str, Path], name: str
) -> None:
    with pytest.warns(NoTokenizerWarning, match="no tokenizer files"):
        model, tok = nvfp4_metal.load(exports[name], dtype="float32")
    assert tok is None  # the tiny exports carry no tokenizer
    kinds = {type(m).__name__ for _, m in model.named_modules()}
    assert "NVFP4Linear" in kinds
    if name == "moe":
        assert "NVFP4SwitchLinear" in kinds
    toks, logp = greedy(model)
    ref_model, _ = nvfp4_metal.load(exports[name], dtype="float32", tokenizer=False)
    ref_toks, ref_logp = greedy(dense_twin(ref_model))
    assert toks == ref_toks
    assert relative_error(to_np(logp), ref_logp) < 1e-4


@pytest.mark.parametrize("name", ["llama", "moe"])
def test_modules_hold_the_checkpoint_bytes(exports: dict[str, Path], name: str) -> None:
    model, _ = nvfp4_metal.load(exports[name], tokenizer=False)
    with open_checkpoint(exports[name]) as ckpt:
        expected = {p: ckpt.planes(p) for p in ckpt.quantized_names()}
    seen = 0
    for path, m in model.named_modules():
        if isinstance(m, NVFP4Linear):
            p, got = expected[path], module_planes(m)
            assert np.array_equal(got.codes, p.codes)
            assert np.array_equal(got.scales, p.scales)
            assert np.array_equal(got.global_scale, p.global_scale)
            seen += 1
        elif isinstance(m, NVFP4SwitchLinear):
            got = module_planes(m)
            layer_mlp = path.removesuffix(".switch_mlp." + path.rsplit(".", 1)[1])
            proj = path.rsplit(".", 1)[1]
            for e in range(m.num_experts):
                p = expected[f"{layer_mlp}.experts.{e}.{proj}"]
                assert np.array_equal(got.codes[e], p.codes)
                assert np.array_equal(got.scales[e], p.scales)
                assert got.global_scale[e] == p.global_scale
                seen += 1
    assert seen == len(expected)


def _word_tokenizer(dst: Path, vocab: int) -> None:
    """A 256-word tokenizer ("t0".."t255") saved as Hugging Face files."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    t = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=t, eos_token="t255").save_pretrained(dst)


def test_mlx_lm_generate_works_unchanged(exports: dict[str, Path], tmp_path: Path) -> None:
    ckpt = tmp_path / "llama_with_tokenizer"
    shutil.copytree(exports["llama"], ckpt)
    _word_tokenizer(ckpt, 256)
    model, tok = nvfp4_metal.load(ckpt, dtype="float32")
    assert tok is not None
    prompt = " ".join(f"t{i}" for i in PROMPT)
    text = mlx_lm.generate(model, tok, prompt=prompt, max_tokens=STEPS)
    ref_toks, _ = greedy(dense_twin(nvfp4_metal.load(ckpt, dtype="float32")[0]))
    if 255 in ref_toks:  # generation stops at the end-of-sequence token
        ref_toks = ref_toks[: ref_toks.index(255)]
    assert ref_toks, "the reference ended at once; pick another prompt"
    assert text.split() == [f"t{t}" for t in ref_toks]


def test_compressed_tensors_checkpoint_loads_to_the_same_model(
    exports: dict[str, Path], tmp_path: Path
) -> None:
    with open_checkpoint(exports["llama"]) as src:
        write_checkpoint(tmp_path / "ct", src, flavour="compressed-tensors")
    assert open_checkpoint(tmp_path / "ct").flavour == "compressed-tensors"
    a, _ = nvfp4_metal.load(exports["llama"], dtype="float32", tokenizer=False)
    b, _ = nvfp4_metal.load(tmp_path / "ct", dtype="float32", tokenizer=False)
    toks_a, logp_a = greedy(a)
    toks_b, logp_b = greedy(b)
    assert toks_a == toks_b
    # compressed-tensors stores the ENCODE global (1/decode): at most 1 ulp apart
    assert relative_error(to_np(logp_b), logp_a) < 1e-5


def test_dense_path_and_affine_rollback_load(
    exports: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    dense, _ = nvfp4_metal.load(exports["moe"], transcode="dense", dtype="float32", tokenizer=False)
    infos = {m.info.source for _, m in dense.named_modules() if hasattr(m, "info")}
    assert infos == {"dense"}
    monkeypatch.setenv("NVFP4_METAL_IMPL", "affine")
    aff, _ = nvfp4_metal.load(exports["llama"], dtype="float32", tokenizer=False)
    impls = {m.info.impl for _, m in aff.named_modules() if hasattr(m, "info")}
    assert impls == {"affine"}
    toks, _ = greedy(aff, 4)
    assert len(toks) == 4


def test_config_normalisation_and_errors(tmp_path: Path) -> None:
    cfg = mlx_lm_config(
        {
            "model_type": "qwen3_moe",
            "num_local_experts": 4,
            "rope_parameters": {"rope_theta": 5e5, "rope_type": "default"},
            "quantization_config": {"quant_method": "modelopt"},
        }
    )
    assert cfg["num_experts"] == 4
    assert cfg["rope_theta"] == 5e5
    assert "quantization_config" not in cfg
    assert "rope_scaling" not in cfg
    scaled = mlx_lm_config(
        {"rope_parameters": {"rope_theta": 1e4, "rope_type": "llama3", "factor": 8.0}}
    )
    assert scaled["rope_scaling"] == {"rope_type": "llama3", "factor": 8.0}
    kept = mlx_lm_config({"rope_theta": 1.0, "rope_parameters": {"rope_theta": 2.0}})
    assert kept["rope_theta"] == 1.0


def test_refuses_a_checkpoint_without_model_type(exports: dict[str, Path], tmp_path: Path) -> None:
    import json

    bad = tmp_path / "no_type"
    shutil.copytree(exports["llama"], bad)
    cfg = json.loads((bad / "config.json").read_text())
    del cfg["model_type"]
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(LoadError, match="no model_type"):
        nvfp4_metal.load(bad)
