"""The model config's dimensions against the tensors' shapes, from headers alone.

A checkpoint whose ``config.json`` says one thing and whose tensors another would convert
"losslessly" into a model that cannot load or, worse, one that loads transposed or
truncated weights. :func:`check_config_dims` compares the dimensions a Llama-style
config states (``hidden_size``, ``intermediate_size``, ``num_attention_heads``,
``num_key_value_heads``, ``head_dim``, ``vocab_size``) with the shapes of the tensors whose
role the Hugging Face name makes plain, where the config states them (a config without a
dimension, or a name this module does not know, is not checked):

====================================================== ===================================
tensor (by name)                                       shape (out, in)
====================================================== ===================================
``model.embed_tokens.weight``, ``lm_head.weight``      ``[vocab_size, hidden_size]``
``*.input_layernorm.weight``, ``model.norm.weight``... ``[hidden_size]``
``*.self_attn.q_proj``                                 ``[heads x head_dim, hidden_size]``
``*.self_attn.k_proj``, ``*.self_attn.v_proj``         ``[kv_heads x head_dim, hidden_size]``
``*.self_attn.o_proj``                                 ``[hidden_size, heads x head_dim]``
``*.mlp.gate_proj``, ``*.mlp.up_proj``                 ``[intermediate_size, hidden_size]``
``*.mlp.down_proj``                                    ``[hidden_size, intermediate_size]``
====================================================== ===================================

``head_dim`` is the config's, else ``hidden_size / num_attention_heads``. NVFP4 tensors are
checked by their logical ``[N, K]``. A mismatch is one
:class:`~nvfp4_checkpoints.CheckpointError` naming the file, the tensor, the config key and
both shapes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from .flavours import CheckpointError
from .folder import short

__all__ = ["check_config_dims", "expected_shape"]

_RULES: Final = (
    (re.compile(r"^(model\.embed_tokens|lm_head)\.weight$"), ("vocab", "hidden")),
    (
        re.compile(r"^(model\.norm|.*\.(input_layernorm|post_attention_layernorm))\.weight$"),
        ("hidden",),
    ),
    (re.compile(r"^.*\.self_attn\.q_proj$"), ("q", "hidden")),
    (re.compile(r"^.*\.self_attn\.[kv]_proj$"), ("kv", "hidden")),
    (re.compile(r"^.*\.self_attn\.o_proj$"), ("hidden", "q")),
    (re.compile(r"^.*\.mlp\.(gate|up)_proj$"), ("inter", "hidden")),
    (re.compile(r"^.*\.mlp\.down_proj$"), ("hidden", "inter")),
)
_SAID: Final = {
    "vocab": "vocab_size",
    "hidden": "hidden_size",
    "inter": "intermediate_size",
    "q": "num_attention_heads x head_dim",
    "kv": "num_key_value_heads x head_dim",
}


def _positive(config: Mapping[str, Any], key: str) -> int | None:
    v = config.get(key)
    return v if type(v) is int and v > 0 else None


def _dims(config: Mapping[str, Any]) -> dict[str, int | None]:
    hidden = _positive(config, "hidden_size")
    heads = _positive(config, "num_attention_heads")
    kv_heads = _positive(config, "num_key_value_heads") or heads
    head_dim = _positive(config, "head_dim")
    if head_dim is None and hidden is not None and heads is not None and hidden % heads == 0:
        head_dim = hidden // heads
    return {
        "vocab": _positive(config, "vocab_size"),
        "hidden": hidden,
        "inter": _positive(config, "intermediate_size"),
        "q": heads * head_dim if heads and head_dim else None,
        "kv": kv_heads * head_dim if kv_heads and head_dim else None,
    }


def expected_shape(name: str, config: Mapping[str, Any]) -> tuple[tuple[int | None, ...], str]:
    """The shape the config gives tensor (or NVFP4 prefix) ``name`` (``None`` for a
    dimension it does not state) and the keys that say so; ``((), "")`` for a name this
    module does not know."""
    dims = _dims(config)
    for pattern, roles in _RULES:
        if pattern.match(name):
            return tuple(dims[r] for r in roles), " x ".join(_SAID[r] for r in roles)
    return (), ""


def check_config_dims(
    path: Path,
    config: Mapping[str, Any],
    shapes: Mapping[str, Callable[[], tuple[int, ...]]],
) -> None:
    """Refuse the first tensor of ``shapes`` (name -> its shape, from headers) whose shape
    disagrees with what ``config`` says it is."""
    if not any(_dims(config).values()):
        return
    for name, shape_of in shapes.items():
        want, said = expected_shape(name, config)
        if not want or all(w is None for w in want):
            continue
        shape = tuple(shape_of())
        if len(shape) != len(want) or any(
            w is not None and d != w for d, w in zip(shape, want, strict=True)
        ):
            wanted = " x ".join("?" if w is None else str(w) for w in want)
            raise CheckpointError(
                f"{path}: tensor {short(name)}: expected shape [{wanted}] ({said} of "
                f"config.json), found {list(shape)}"
            )
