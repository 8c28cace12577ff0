"""The lean batch-1 decoder ``generate`` runs is held to the transformers forward T6
certifies: the same greedy tokens and the same logits, bit for bit, on every Llama-family
architecture it claims, fused or not, in every activation mode, on the reference and cpu
backends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ARCHITECTURES = ("llama", "mistral", "qwen2")
PROMPT = [1, 5, 9, 2, 17, 4]


def _tiny_model(kind: str) -> Any:
    """A 2-layer random model of ``kind`` (grouped KV heads; qwen2 with q/k/v biases)."""
    common: dict[str, Any] = dict(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=kind != "mistral",
    )
    if kind == "llama":
        config = transformers.LlamaConfig(**common)
        model_cls = transformers.LlamaForCausalLM
    elif kind == "mistral":
        config = transformers.MistralConfig(**common, sliding_window=None)
        model_cls = transformers.MistralForCausalLM
    else:
        config = transformers.Qwen2Config(**common, use_sliding_window=False)
        model_cls = transformers.Qwen2ForCausalLM
    torch.manual_seed(11)
    model = model_cls(config).eval()
    with torch.no_grad():
        for p in model.parameters():  # weights large enough to move the logits
            p.normal_(0.0, 0.2)
    return model


@pytest.fixture(scope="module")
def tiny_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from nvfp4_conformance import smollm2

    root = tmp_path_factory.mktemp("lean")
    return {
        kind: smollm2.write_nvfp4_checkpoint(smollm2.quantize_model(_tiny_model(kind)), root / kind)
        for kind in ARCHITECTURES
    }


@pytest.mark.parametrize("kind", ARCHITECTURES)
@pytest.mark.parametrize("backend_name", ["reference", "cpu"])
@pytest.mark.parametrize("fuse", [False, True])
def test_lean_decoding_is_the_transformers_forward_bit_for_bit(
    tiny_checkpoints: dict[str, Path], kind: str, backend_name: str, fuse: bool
) -> None:
    import nvfp4
    from nvfp4_conformance import llm
    from nvfp4_conformance.lean_decoder import LeanDecoder, unsupported

    loaded = llm.load_model(tiny_checkpoints[kind], nvfp4.get_backend(backend_name), fuse=fuse)
    if kind == "qwen2":  # the biases ride on the NVFP4 linears
        assert loaded.model.model.layers[0].self_attn.q_proj.bias is not None
    assert unsupported(loaded.model) is None
    lean = LeanDecoder(loaded.model, len(PROMPT) + 12)
    for mode in ("w4a16", "w4a8"):
        with llm.activation_mode(loaded.model, mode):
            want = llm.greedy(loaded.model, PROMPT, 12)
            got = llm.greedy(loaded.model, PROMPT, 12, lean=lean)
        assert got.new_ids == want.new_ids, mode
        np.testing.assert_array_equal(got.logits, want.logits, err_msg=mode)
        # every step attends over a longer cache: its logits move
        assert np.abs(np.diff(want.logits, axis=0)).max(axis=1).min() > 1e-3, mode


def test_lean_decoder_refuses_what_it_does_not_cover(tiny_checkpoints: dict[str, Path]) -> None:
    import nvfp4
    from nvfp4_conformance import llm
    from nvfp4_conformance.lean_decoder import LeanDecoder, unsupported

    loaded = llm.load_model(tiny_checkpoints["llama"], nvfp4.get_backend("reference"))
    model = loaded.model
    model.config.hidden_act = "gelu"
    assert unsupported(model) == "hidden_act 'gelu' (covered: 'silu')"
    with pytest.raises(ValueError, match="unsupported model: hidden_act 'gelu'"):
        LeanDecoder(model, 8)
    model.config.hidden_act = "silu"
    model.config.model_type = "gemma"
    assert unsupported(model) == "model type 'gemma' (covered: llama, mistral, qwen2)"
    model.config.model_type = "llama"
    model.model.rotary_emb.rope_type = "llama3"
    assert unsupported(model) == "rope type 'llama3' (covered: 'default')"
    model.model.rotary_emb.rope_type = "default"

    lean = LeanDecoder(model, 8)
    with pytest.raises(ValueError, match="exceed the lean decoder's cache of 8 positions"):
        llm.greedy(model, PROMPT, 3, lean=lean)
    lean.forward(PROMPT)
    with pytest.raises(ValueError, match="several tokens only for the prompt"):
        lean.forward([1, 2])
    with pytest.raises(ValueError, match="9 positions exceed the cache's 8"):
        lean.forward([1]), lean.forward([1]), lean.forward([1])
