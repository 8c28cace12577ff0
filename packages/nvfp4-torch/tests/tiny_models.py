"""Tiny random decoder models for the suite's tests: 2 layers, hidden 64, K of every linear
a multiple of 32, grouped KV heads."""

from __future__ import annotations

from typing import Any

#: Architectures :func:`tiny_model` builds.
KINDS = ("llama", "mistral", "qwen2")


def tiny_model(kind: str, seed: int) -> Any:
    """A float32 model of ``kind`` (qwen2 with its q/k/v biases; mistral untied), weights
    drawn from N(0, 0.2) with ``seed``: large enough to move the logits."""
    import torch
    import transformers

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
        model_cls, config = transformers.LlamaForCausalLM, transformers.LlamaConfig(**common)
    elif kind == "mistral":
        config = transformers.MistralConfig(**common, sliding_window=None)
        model_cls = transformers.MistralForCausalLM
    elif kind == "qwen2":
        config = transformers.Qwen2Config(**common, use_sliding_window=False)
        model_cls = transformers.Qwen2ForCausalLM
    else:
        raise ValueError(f"tiny_model: kind {kind!r}; expected one of {', '.join(KINDS)}")
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model
