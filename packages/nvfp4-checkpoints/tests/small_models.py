"""The small models the tests build: a Llama ``config.json`` and two byte-level BPE
tokenizers (one trained from a corpus, one spelled out).

Nothing here is an oracle: these are inputs, the same for every test that needs them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def llama_config(
    *, hidden: int = 64, intermediate: int = 64, kv_heads: int = 2, vocab: int = 64, **more: Any
) -> dict[str, Any]:
    """A one-layer ``LlamaForCausalLM`` config with 4 attention heads (``more``: further
    keys, appended)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": 1,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_attention_heads": 4,
        "num_key_value_heads": kv_heads,
        "vocab_size": vocab,
        **more,
    }


def byte_level_bpe(
    path: Path,
    steps: Sequence[Any],
    specials: list[str],
    *,
    corpus: list[str],
    vocab_size: int,
    normal_added: Sequence[str] = (),
) -> Path:
    """``path/tokenizer.json``: a byte-level BPE of ``vocab_size`` trained on ``corpus``,
    pre-tokenized by ``steps`` then ByteLevel (whose own regex is used only when no step is
    a ``Split``), with the special tokens ``specials`` and the normal added tokens
    ``normal_added``. Returns ``path`` (created)."""
    import tokenizers

    pre = tokenizers.pre_tokenizers
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    use_regex = not any(isinstance(s, pre.Split) for s in steps)
    tok.pre_tokenizer = pre.Sequence(
        [*steps, pre.ByteLevel(add_prefix_space=False, use_regex=use_regex)]
    )
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    tok.add_tokens([tokenizers.AddedToken(t, normalized=False) for t in normal_added])
    path.mkdir(parents=True)
    tok.save(str(path / "tokenizer.json"))
    return path


#: A byte-level BPE tokenizer.json small enough to spell out (what a GGUF output converts).
TOKENIZER_JSON = {
    "version": "1.0",
    "added_tokens": [],
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]]},
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
    "decoder": {"type": "ByteLevel"},
}
