"""Plain mlx-lm runs our MLX folders: ``mlx_lm.load(dir, trust_remote_code=True)`` and
``python -m mlx_lm generate --model dir --trust-remote-code`` build the model with the
folder's own model file (``nvfp4_mlx_lm.py``), every NVFP4 global applied, and give exactly
the logits and tokens of :func:`nvfp4_metal.load` on the same folder (dense, fused and
expert layers). The tokenizer comes
with the folder, also when it was converted from a GGUF."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import nvfp4_metal
import pytest
from nvfp4 import quantize
from nvfp4.fusion import fuse
from nvfp4.planes import NVFP4Planes
from nvfp4.testing import llama_layer_shapes
from nvfp4_checkpoints import open_checkpoint, write_checkpoint
from nvfp4_metal.loader import NoTokenizerWarning

mlx_lm = pytest.importorskip("mlx_lm")
tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("transformers")
from mlx_lm.generate import generate_step  # noqa: E402

STEPS = 10
PROMPT = "Hello world, café 42!"
HIDDEN, INTER, LAYERS = 64, 128, 2
SPECIALS = ("<s>", "</s>")


def _tokenizer_dir(path: Path) -> Path:
    """A byte-level BPE tokenizer: the 256 byte symbols, a few merges, ``<s>`` / ``</s>``."""
    pre = tokenizers.pre_tokenizers
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = pre.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(["Hello world, hello there: café 42 and 1999."] * 8, trainer)
    path.mkdir(parents=True)
    tok.save(str(path / "tokenizer.json"))
    config = {"bos_token": SPECIALS[0], "eos_token": SPECIALS[1]}
    (path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return path


_PROJECTIONS = llama_layer_shapes(HIDDEN, INTER, kv=32)
#: Phi-3's fused linears: one NVFP4 tensor of several partitions, each with its own global.
EXPERTS, MOE_INTER, HEAD_DIM = 4, 64, 16
_EXPERT_PROJECTIONS = {
    "gate_proj": (MOE_INTER, HIDDEN),
    "up_proj": (MOE_INTER, HIDDEN),
    "down_proj": (HIDDEN, MOE_INTER),
}
_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}
_PHI3_FUSED = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}


def _tiny_model(
    vocab: int, model_type: str = "llama"
) -> tuple[dict[str, NVFP4Planes], dict[str, Any], dict[str, Any]]:
    """Two decoder layers, every linear NVFP4 with its own global (~1e-4, far from 1: a path
    that drops one cannot give the same logits), float32 embeddings. ``llama``: separate
    projections, tied embeddings, the RoPE theta under transformers 5's ``rope_parameters``;
    ``phi3``: fused ``qkv_proj`` / ``gate_up_proj`` (planes with partitions, one global
    each) and an unquantized ``lm_head``; ``qwen3_moe``: Qwen3-MoE experts stored one by
    one (each expert its own global), a float32 router."""
    rng = np.random.default_rng(7)
    planes, tensors = {}, {}
    for layer in range(LAYERS):
        base = f"model.layers.{layer}."
        own = {}
        for proj, shape in _PROJECTIONS.items():
            # each projection its own scale, so each partition gets its own global
            w = (rng.standard_normal(shape) * 0.08 * (1 + len(own))).astype(np.float32)
            own[proj] = quantize(w, name=base + proj)
        if model_type == "phi3":
            for fused, parts in _PHI3_FUSED.items():
                planes[base + fused] = fuse([own.pop(p) for p in parts], name=base + fused)
        if model_type == "qwen3_moe":
            for proj in ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
                own.pop(proj)
            for e in range(EXPERTS):  # each expert its own global
                for proj, shape in _EXPERT_PROJECTIONS.items():
                    name = f"{base}mlp.experts.{e}.{proj}"
                    w = rng.standard_normal(shape).astype(np.float32) * 0.05 * (e + 1)
                    planes[name] = quantize(w, name=name)
            tensors[f"{base}mlp.gate.weight"] = rng.standard_normal((EXPERTS, HIDDEN)).astype(
                np.float32
            )
            for norm in ("q_norm", "k_norm"):
                tensors[f"{base}self_attn.{norm}.weight"] = np.ones(HEAD_DIM, np.float32)
        planes.update({base + proj: p for proj, p in own.items()})
        for norm in ("input_layernorm", "post_attention_layernorm"):
            tensors[f"{base}{norm}.weight"] = np.ones(HIDDEN, np.float32)
    tensors["model.embed_tokens.weight"] = rng.standard_normal((vocab, HIDDEN)).astype(np.float32)
    tensors["model.norm.weight"] = np.ones(HIDDEN, np.float32)
    config: dict[str, Any] = {
        "model_type": model_type,
        "architectures": [_ARCHITECTURES[model_type]],
        "hidden_size": HIDDEN,
        "intermediate_size": INTER,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": vocab,
        "max_position_embeddings": 128,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": model_type != "phi3",
    }
    if model_type == "llama":  # transformers 5's name, a theta far from mlx-lm's default
        config["rope_parameters"] = {"rope_theta": 500.0, "rope_type": "default"}
    else:
        config["rope_theta"] = 500.0
    if model_type == "phi3":
        lm_head = rng.standard_normal((vocab, HIDDEN)).astype(np.float32) * 0.1
        tensors["lm_head.weight"] = lm_head
    if model_type == "qwen3_moe":
        config.update(
            num_experts=EXPERTS,
            num_experts_per_tok=2,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            moe_intermediate_size=MOE_INTER,
            head_dim=HEAD_DIM,
            norm_topk_prob=True,
        )
    return planes, tensors, config


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``mlx``: our MLX folder of the Llama (tokenizer given); ``gguf``: the same model as a
    GGUF; ``mlx_from_gguf``: the GGUF converted back to an MLX folder; ``phi3``: the fused
    Phi-3's MLX folder; ``moe``: the Qwen3-MoE's."""
    base = tmp_path_factory.mktemp("plain_mlx_lm")
    tok = _tokenizer_dir(base / "tok")
    vocab = tokenizers.Tokenizer.from_file(str(tok / "tokenizer.json")).get_vocab_size()
    out = {"tok": tok}
    for kind, name in (("llama", "mlx"), ("phi3", "phi3"), ("qwen3_moe", "moe")):
        planes, tensors, config = _tiny_model(vocab, kind)
        out[name] = write_checkpoint(
            base / name, planes, flavour="mlx", tensors=tensors, config=config, tokenizer=tok
        )
    with open_checkpoint(out["mlx"]) as ck:
        out["gguf"] = write_checkpoint(base / "tiny.gguf", ck, flavour="gguf")
    with open_checkpoint(out["gguf"]) as ck:
        out["mlx_from_gguf"] = write_checkpoint(base / "mlx_from_gguf", ck, flavour="mlx")
    return out


def _greedy(model: Any, prompt: list[int]) -> tuple[list[int], list[np.ndarray]]:
    toks, logps = [], []
    for tok, logprobs in generate_step(mx.array(prompt), model, max_tokens=STEPS):
        toks.append(int(tok))
        logps.append(np.array(logprobs))
    return toks, logps


@pytest.mark.parametrize("name", ["mlx", "mlx_from_gguf", "phi3", "moe"])
def test_mlx_lm_load_equals_nvfp4_metal_load(folders: dict[str, Path], name: str) -> None:
    folder = folders[name]
    ours, our_tok = nvfp4_metal.load(folder)
    plain, plain_tok = mlx_lm.load(str(folder), trust_remote_code=True)
    prompt = plain_tok.encode(PROMPT)
    assert prompt == our_tok.encode(PROMPT)
    # the model file's layers hold the folder's globals, one per output row
    modules = dict(plain.named_modules())
    with open_checkpoint(folder) as ck:
        names = ck.quantized_names()
        per_layer = {"phi3": 4, "moe": 4 + 3 * EXPERTS}.get(name, 7)
        assert len(names) == LAYERS * per_layer
        for prefix in names:
            planes = ck.planes(prefix)
            want = planes.row_global()
            assert len(set(want.tolist())) == (planes.num_partitions or 1), prefix
            if ".experts." in prefix:  # stacked: switch_mlp.<proj>, row e of its globals
                parent, rest = prefix.split(".experts.")
                e, proj = rest.split(".", 1)
                module = modules[f"{parent}.switch_mlp.{proj}"]
                assert type(module).__name__ == "GlobalNVFP4SwitchLinear", prefix
                got = np.array(module["global_scale"])[int(e)]
            else:
                module = modules[prefix]
                assert type(module).__name__ == "GlobalNVFP4Linear", prefix
                got = np.array(module["global_scale"])
            assert np.array_equal(got, want), prefix
    x = mx.array([prompt])
    assert np.array_equal(np.array(plain(x)), np.array(ours(x)))  # bit-identical logits
    want, want_lp = _greedy(ours, prompt)
    got, got_lp = _greedy(plain, prompt)
    assert got == want
    for step, (a, b) in enumerate(zip(got_lp, want_lp, strict=True)):
        assert np.array_equal(a, b), f"step {step}: log-probabilities differ"


def test_without_trust_remote_code_mlx_lm_says_so(folders: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match=r"nvfp4_mlx_lm\.py.*trust_remote_code=True"):
        mlx_lm.load(str(folders["mlx"]))


def _cli_generate(folder: Path, prompt: str) -> str:
    """The completion ``python -m mlx_lm generate --trust-remote-code`` prints (greedy)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "mlx_lm", "generate", "--model", str(folder),
         "--trust-remote-code", "--prompt", prompt, "--max-tokens", str(STEPS), "--temp", "0"],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    # mlx_lm generate prints the completion between two "==========" lines
    return run.stdout.split("==========\n")[1].removesuffix("\n")


def test_mlx_lm_cli_generates_nvfp4_metal_tokens(folders: dict[str, Path]) -> None:
    folder = folders["mlx"]
    model, tok = nvfp4_metal.load(folder)
    want, _ = _greedy(model, tok.encode(PROMPT))
    assert _cli_generate(folder, PROMPT) == tok.decode(want)


def test_gguf_loads_with_its_tokenizer(folders: dict[str, Path]) -> None:
    _, from_dir = nvfp4_metal.load(folders["mlx"])
    _, from_gguf = nvfp4_metal.load(folders["gguf"])
    assert from_gguf is not None
    for text in (PROMPT, "  two  spaces\nand a line", "<s>hello</s>"):
        ids = from_dir.encode(text)
        assert from_gguf.encode(text) == ids
        assert from_gguf.decode(ids) == from_dir.decode(ids)


def test_no_tokenizer_is_said(folders: dict[str, Path], tmp_path: Path) -> None:
    planes, tensors, config = _tiny_model(300)
    bare = write_checkpoint(
        tmp_path / "bare", planes, flavour="mlx", tensors=tensors, config=config
    )
    with pytest.warns(NoTokenizerWarning, match=r"bare: no tokenizer files \(tokenizer\.json"):
        _, tok = nvfp4_metal.load(bare)
    assert tok is None
    with open_checkpoint(bare) as ck:
        gguf = write_checkpoint(tmp_path / "bare.gguf", ck, flavour="gguf")
    with pytest.warns(
        NoTokenizerWarning, match=r"no tokenizer metadata \(tokenizer\.ggml\.model\)"
    ):
        _, tok = nvfp4_metal.load(gguf)
    assert tok is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, tok = nvfp4_metal.load(gguf, tokenizer=False)
    assert tok is None


# ----------------------------------------------------------------------------- SmolLM2
@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The conformance suite's SmolLM2-135M NVFP4 checkpoint (ModelOpt, its tokenizer
    rebuilt from the GGUF it came from) and its MLX conversion."""
    pytest.importorskip("accelerate")  # transformers' GGUF loading needs it
    smol = pytest.importorskip("nvfp4_torch.smollm2")
    try:
        smol.gguf_file()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    base = tmp_path_factory.mktemp("smollm2")
    ckpt = smol.write_nvfp4_checkpoint(smol.quantize_model(smol.load_float32_model()), base / "mo")
    with open_checkpoint(ckpt) as ck:
        mlx_dir = write_checkpoint(base / "mlx", ck, flavour="mlx")
    return {"modelopt": ckpt, "mlx": mlx_dir}


def test_smollm2_in_plain_mlx_lm(smollm2: dict[str, Path]) -> None:
    folder = smollm2["mlx"]
    assert (folder / "tokenizer.json").is_file()
    assert (folder / "chat_template.jinja").is_file()
    ours, our_tok = nvfp4_metal.load(folder)
    plain, plain_tok = mlx_lm.load(str(folder), trust_remote_code=True)
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = plain_tok.apply_chat_template(chat, add_generation_prompt=True)
    assert prompt == our_tok.apply_chat_template(chat, add_generation_prompt=True)
    want, _ = _greedy(ours, prompt)
    got, _ = _greedy(plain, prompt)
    assert got == want
    assert "Paris" in plain_tok.decode(got)  # the model still knows (NVFP4 is close)
    # mlx-lm's command applies the chat template itself and stops at the end of turn
    eos = set(plain_tok.eos_token_ids)
    until_eos = want[: next((i for i, t in enumerate(want) if t in eos), len(want))]
    assert _cli_generate(folder, chat[0]["content"]) == plain_tok.decode(until_eos)


# ------------------------------------------------------------- the model file's sanitize
def test_model_file_sanitize_cases() -> None:
    from nvfp4_checkpoints.mlx_lm_model import sanitize

    def expert(e: int) -> dict[str, mx.array]:
        p = f"m.experts.{e}.up"
        return {
            f"{p}.weight": mx.zeros((4, 2), dtype=mx.uint32),
            f"{p}.scales": mx.full((4, 1), e, dtype=mx.uint8),
            f"{p}.global_scale": mx.array(0.5 + e, dtype=mx.float32),
        }

    folder = {**expert(0), **expert(1)}
    # experts kept one by one (no stack made by the architecture): dense layers, row globals
    kept = sanitize(folder, dict(folder))
    assert np.array_equal(np.array(kept["m.experts.1.up.global_scale"]), np.full(4, 1.5))
    # stacked by the architecture (.weight only): scales and globals stacked beside it
    arch = {k: v for k, v in folder.items() if not k.endswith(".weight")}
    arch["m.switch.up.weight"] = mx.zeros((2, 4, 2), dtype=mx.uint32)
    out = sanitize(folder, arch)
    assert sorted(out) == ["m.switch.up.global_scale", "m.switch.up.scales", "m.switch.up.weight"]
    assert np.array_equal(np.array(out["m.switch.up.scales"])[:, 0, 0], [0, 1])
    assert np.array_equal(np.array(out["m.switch.up.global_scale"]), [[0.5] * 4, [1.5] * 4])
    # two candidate stacks: refused, naming them
    arch["m.other.up.weight"] = mx.zeros((2, 4, 2), dtype=mx.uint32)
    with pytest.raises(ValueError, match=r"m\.experts\.\*\.up: expected one stacked"):
        sanitize(folder, arch)
    # fused planes: one global per partition, expanded per row; input scales dropped
    dense = {
        "q.weight": mx.zeros((6, 2), dtype=mx.uint32),
        "q.global_scale": mx.array([1.0, 2.0, 4.0], dtype=mx.float32),
        "q.partitions": mx.array([0, 2, 3, 6], dtype=mx.int64),
        "q.input_scale": mx.array(0.1, dtype=mx.float32),
    }
    out = sanitize(dense, dict(dense))
    assert sorted(out) == ["q.global_scale", "q.weight"]
    assert np.array_equal(np.array(out["q.global_scale"]), [1, 1, 2, 4, 4, 4])
    bad = {**dense, "q.partitions": mx.array([0, 2, 5], dtype=mx.int64)}
    with pytest.raises(ValueError, match=r"q: expected 2 partition globals over rows \[0, 6\)"):
        sanitize(bad, dict(bad))
