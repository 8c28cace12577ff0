"""Tiny random decoder models for tests of an NVFP4 integration: this package's, the
conformance suite's, an engine adapter's. Hidden size 64, K of every linear a multiple of 32
(so every mode, W4A8 included, takes them), grouped KV heads; ``pip install
'nvfp4-torch[models]'`` (transformers). Nothing heavy is imported until a model is built."""

from __future__ import annotations

from typing import Any

__all__ = ["KINDS", "tiny_model"]

#: Architectures :func:`tiny_model` builds.
KINDS = ("llama", "mistral", "qwen2")


def tiny_model(kind: str, seed: int, *, layers: int = 2, vocab_size: int = 96) -> Any:
    """A float32 transformers causal LM of ``kind`` (qwen2 with its q/k/v biases; mistral
    untied), ``layers`` decoder layers, weights drawn from N(0, 0.2) with ``seed``: large
    enough to move the logits."""
    import torch
    import transformers

    common: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=kind != "mistral",
    )
    model_cls: Any
    config: Any
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
    model: Any = model_cls(config)
    model.eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model
