"""The GGUF conventions this package's reader and writer share: the ``nvfp4.*`` metadata
keys, the architecture of a Hugging Face config, its hyper-parameters, and the RoPE row
permutation llama.cpp applies to the q/k projections of the ``llama`` architecture."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from ..flavours import CheckpointError, import_gguf
from ..folder import Fields

__all__ = [
    "KV_GGUF_NAMES",
    "KV_HF_CONFIG",
    "KV_HF_DTYPES",
    "KV_HF_NAMES",
    "KV_ROPE_PERMUTED",
    "KV_SPEC",
    "add_hparams",
    "config_from_metadata",
    "gguf_arch",
    "permuted_heads",
    "rope_permute_rows",
]

#: GGUF metadata keys this package writes (and reads back).
KV_SPEC: Final = "nvfp4.spec_version"
KV_HF_CONFIG: Final = "nvfp4.hf_config"
KV_GGUF_NAMES: Final = "nvfp4.gguf_names"
KV_HF_NAMES: Final = "nvfp4.hf_names"
KV_HF_DTYPES: Final = "nvfp4.hf_dtypes"
KV_ROPE_PERMUTED: Final = "nvfp4.rope_permuted"


def rope_permute_rows(a: npt.NDArray[Any], n_head: int, inverse: bool = False) -> npt.NDArray[Any]:
    """Reorder the rows of a q/k projection the way llama.cpp's converter does for
    Llama-family models (HF's rotate-half RoPE -> ggml's interleaved pairs), or undo it.
    Works on any array whose first axis is the output rows (codes, scale bytes, dense)."""
    rows = a.shape[0]
    if n_head <= 0 or rows % (2 * n_head):
        raise CheckpointError(f"cannot RoPE-permute {rows} rows over {n_head} heads")
    half = rows // n_head // 2
    if inverse:
        b = a.reshape(n_head, half, 2, *a.shape[1:]).swapaxes(1, 2)
    else:
        b = a.reshape(n_head, 2, half, *a.shape[1:]).swapaxes(1, 2)
    return np.ascontiguousarray(b.reshape(a.shape))


_ARCH_ALIASES: Final = {"mistral": "llama", "mixtral": "llama"}


def gguf_arch(config: Mapping[str, Any]) -> str:
    """gguf-py's architecture name for a Hugging Face ``config.model_type``
    (llama/mistral/mixtral -> ``llama``, qwen3_moe -> ``qwen3moe``...)."""
    gguf = import_gguf()
    model_type = Fields(dict(config), "config.json").text("model_type") or ""
    arch = _ARCH_ALIASES.get(model_type, model_type.replace("_", ""))
    known = set(gguf.MODEL_ARCH_NAMES.values())
    return arch if arch in known else (arch or "unknown")


_UINT32_MAX: Final = 2**32 - 1


def permuted_heads(arch: str, config: Mapping[str, Any]) -> dict[str, int]:
    """GGUF leaf names whose rows the writer RoPE-permutes, with their head counts: q and k
    of the ``llama`` architecture (as llama.cpp's converter does), else none."""
    f = Fields(dict(config), "config.json")
    n_head = f.integer("num_attention_heads", 1, _UINT32_MAX)
    if arch == "llama" and n_head is not None:
        return {"attn_q": n_head, "attn_k": f.integer("num_key_value_heads", 1, n_head) or n_head}
    return {}


def _rope_theta(config: Fields) -> float | None:
    theta = config.num("rope_theta", positive=True, float32=True)
    rp = config.obj("rope_parameters")
    if theta is None and rp is not None:
        theta = rp.num("rope_theta", positive=True, float32=True)
    return theta


def add_hparams(w: Any, config: Mapping[str, Any]) -> None:
    """Architecture hyper-parameters gguf-py / llama.cpp expect, where config.json has them
    (each checked: an integer that fits GGUF's uint32, a finite number)."""
    f = Fields(dict(config), "config.json")

    def num(*keys: str) -> Any:
        for k in keys:
            v = f.integer(k, 0, _UINT32_MAX)
            if v is not None:
                return v
        return None

    ints = (
        (w.add_context_length, ("max_position_embeddings",)),
        (w.add_embedding_length, ("hidden_size",)),
        (w.add_block_count, ("num_hidden_layers",)),
        (w.add_feed_forward_length, ("intermediate_size",)),
        (w.add_head_count, ("num_attention_heads",)),
        (w.add_head_count_kv, ("num_key_value_heads",)),
        (w.add_key_length, ("head_dim",)),
        (w.add_value_length, ("head_dim",)),
        (w.add_vocab_size, ("vocab_size",)),
        (w.add_expert_count, ("num_experts", "num_local_experts")),
        (w.add_expert_used_count, ("num_experts_per_tok",)),
        (w.add_expert_feed_forward_length, ("moe_intermediate_size",)),
    )
    for add, keys in ints:
        v = num(*keys)
        if v is not None:
            add(int(v))
    eps = f.num("rms_norm_eps", positive=True, float32=True)
    if eps is not None:
        w.add_layer_norm_rms_eps(eps)
    theta = _rope_theta(f)
    if theta is not None:
        w.add_rope_freq_base(theta)


def config_from_metadata(file: Any, arch: str) -> dict[str, Any]:
    """The Hugging Face ``config.json`` keys that :func:`add_hparams` writes, read back from
    a GGUF's metadata (``file``: a :class:`~.file.GGUFFile`), with ``model_type`` the
    architecture: the config of a GGUF that records none (llama.cpp's converter writes the
    hyper-parameters, not the config). Values that are not one integer (a per-layer
    array) or one finite number are left out."""
    gguf = import_gguf()
    llm, attention, rope = gguf.Keys.LLM, gguf.Keys.Attention, gguf.Keys.Rope
    ints = (
        ("max_position_embeddings", llm.CONTEXT_LENGTH),
        ("hidden_size", llm.EMBEDDING_LENGTH),
        ("num_hidden_layers", llm.BLOCK_COUNT),
        ("intermediate_size", llm.FEED_FORWARD_LENGTH),
        ("num_attention_heads", attention.HEAD_COUNT),
        ("num_key_value_heads", attention.HEAD_COUNT_KV),
        ("head_dim", attention.KEY_LENGTH),
        ("vocab_size", llm.VOCAB_SIZE),
        ("num_local_experts", llm.EXPERT_COUNT),
        ("num_experts_per_tok", llm.EXPERT_USED_COUNT),
        ("moe_intermediate_size", llm.EXPERT_FEED_FORWARD_LENGTH),
    )
    config: dict[str, Any] = {"model_type": arch} if arch else {}
    for hf_key, key in ints:
        v = file.value(key.format(arch=arch))
        if type(v) is int and 0 < v <= _UINT32_MAX:
            config[hf_key] = v
    for hf_key, key in (
        ("rms_norm_eps", attention.LAYERNORM_RMS_EPS),
        ("rope_theta", rope.FREQ_BASE),
    ):
        v = file.value(key.format(arch=arch))
        if type(v) in (int, float) and np.isfinite(v) and v > 0:
            config[hf_key] = float(v)
    return config
