"""NVFP4 checkpoints as torch models: a transformers model whose linears are NVFP4.

* :func:`swap_linears` replaces each ``torch.nn.Linear`` of a model at a quantized prefix of
  a checkpoint with :class:`nvfp4_torch.modules.NVFP4Linear` (the planes as buffers),
  keeping the linear's bias;
* :func:`load_causal_lm` builds the float32 causal LM a checkpoint's ``config.json``
  describes, swaps its linears and loads every other tensor: an ordinary
  ``torch.nn.Module`` (``model.generate``, ``torch.compile``, ``state_dict`` work on it), its
  products through ``torch.ops.nvfp4``;
* :func:`load_model` does the same with every NVFP4 linear bound to one backend object
  (:func:`nvfp4_torch.modules.bind_linears`, optionally fused): what ``generate`` decodes
  with and what tier T6 of the conformance suite certifies.

The checkpoint is any flavour nvfp4-checkpoints reads (ModelOpt, compressed-tensors, MLX
folders, GGUF files). Needs transformers and nvfp4-checkpoints
(``pip install 'nvfp4-torch[models]'``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .modules import NVFP4Linear, bind_linears

__all__ = ["LinearFactory", "LoadedModel", "load_causal_lm", "load_model", "swap_linears"]

#: Tensors a quantized checkpoint holds besides weights that a W4A16 model does not use.
AUX_SUFFIXES = (".input_scale", ".k_scale", ".v_scale", ".output_scale", "_amax")


def _input_scale(ckpt: Any, prefix: str) -> float | None:
    """The checkpoint's static activation scale of ``prefix`` (ModelOpt's ``input_scale``, a
    decode multiplier, as the ops take it)."""
    name = f"{prefix}.input_scale"
    if name not in ckpt.tensor_names():
        return None
    value = np.asarray(ckpt.tensor(name), dtype=np.float32)
    if value.size != 1 or not np.isfinite(value).all() or float(value.reshape(())) <= 0:
        raise ValueError(
            f"{ckpt.path}: tensor {name!r}: expected one finite positive float, found "
            f"shape {value.shape} value {value.reshape(-1)[:4].tolist()}"
        )
    return float(value.reshape(()))


#: Makes the module that replaces a linear: ``make(prefix, planes, bias, input_scale)``.
LinearFactory = Callable[[str, Any, Any, "float | None"], Any]


def swap_linears(
    model: Any, ckpt: Any, *, activations: str = "w4a16", make: LinearFactory | None = None
) -> list[str]:
    """Replace the linears of ``model`` at every quantized prefix of the open checkpoint
    ``ckpt`` (from :func:`nvfp4_checkpoints.open_checkpoint`) with :class:`NVFP4Linear` (or
    what ``make(prefix, planes, bias, input_scale)`` returns); returns the
    prefixes. Each must be a ``torch.nn.Linear`` of the planes' shape; its bias (from the
    checkpoint where it has one, else the module's) is kept."""
    if make is None:

        def make(prefix: str, planes: Any, bias: Any, scale: float | None) -> Any:
            return NVFP4Linear(planes, bias, activations=activations, input_scale=scale)

    modules = dict(model.named_modules())
    names = set(ckpt.tensor_names())
    swapped = []
    for prefix in ckpt.quantized_names():
        old = modules.get(prefix)
        if not isinstance(old, torch.nn.Linear):
            found = type(old).__name__ if old is not None else "no module"
            raise ValueError(
                f"{ckpt.path}: tensor {prefix!r} is NVFP4, expected a torch.nn.Linear there, "
                f"found {found}"
            )
        planes = ckpt.planes(prefix)
        if planes.num_experts is not None or planes.shape != (old.out_features, old.in_features):
            raise ValueError(
                f"{ckpt.path}: tensor {prefix!r}: NVFP4 planes of shape {planes.shape}, "
                f"expected the Linear's {(old.out_features, old.in_features)}"
            )
        bias = None
        if f"{prefix}.bias" in names:
            arr = np.asarray(ckpt.tensor(f"{prefix}.bias"), dtype=np.float32)
            bias = torch.from_numpy(arr.copy())
        elif old.bias is not None:  # the module's own bias is an untrained initial value
            raise ValueError(
                f"{ckpt.path}: tensor {prefix + '.bias'!r}: the model's Linear has a bias, "
                "expected it in the checkpoint, found none"
            )
        scale = _input_scale(ckpt, prefix) if activations in ("w4a4", "w4a8_fp8") else None
        model.set_submodule(prefix, make(prefix, planes, bias, scale))
        swapped.append(prefix)
    return swapped


def _model_config(raw: dict[str, Any], path: Path) -> Any:
    from transformers import AutoConfig

    cfg = {k: v for k, v in raw.items() if k not in ("quantization_config", "transformers_version")}
    model_type = cfg.pop("model_type", None)
    if not isinstance(model_type, str) or not model_type:
        raise ValueError(
            f"{path / 'config.json'}: key 'model_type': expected a name, found {model_type!r}"
        )
    return AutoConfig.for_model(model_type, **cfg)


def load_causal_lm(
    checkpoint: str | os.PathLike[str],
    *,
    activations: str = "w4a16",
    make: LinearFactory | None = None,
    use_cache: bool | None = None,
) -> Any:
    """The float32 causal LM of a quantized checkpoint folder, its NVFP4 linears swapped in
    (:func:`swap_linears`, with ``make``) and every other tensor loaded; in eval mode.
    ``use_cache`` overrides the config's."""
    from nvfp4_checkpoints import open_checkpoint
    from transformers import AutoModelForCausalLM

    path = Path(checkpoint)
    with open_checkpoint(path) as ckpt:
        config = _model_config(dict(ckpt.config), path)
        if use_cache is not None:
            config.use_cache = use_cache
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config).to(torch.float32).eval()
        quantized = swap_linears(model, ckpt, activations=activations, make=make)
        skip = {f"{p}.bias" for p in quantized}
        state = {
            name: torch.from_numpy(np.asarray(ckpt.tensor(name)).astype(np.float32, copy=True))
            for name in ckpt.tensor_names()
            if not name.endswith(AUX_SUFFIXES) and name not in skip
        }
    result = model.load_state_dict(state, strict=False)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    missing = [
        k
        for k in result.missing_keys
        if not (tied and k == "lm_head.weight")
        and not k.endswith("rotary_emb.inv_freq")
        and k.rsplit(".", 1)[0] not in quantized
    ]
    if missing:
        raise ValueError(f"{path}: the checkpoint lacks tensors the model needs: {missing[:10]}")
    if result.unexpected_keys:
        raise ValueError(
            f"{path}: the checkpoint has tensors the model does not: {result.unexpected_keys[:10]}"
        )
    if tied:
        model.tie_weights()
    return model


@dataclass
class LoadedModel:
    """A causal LM whose NVFP4 linears are bound to ``backend``."""

    model: Any
    backend: Any
    quantized: list[str]
    config: dict[str, Any]
    #: backend products per forward pass (fewer than ``quantized`` when fused)
    products: int = 0


def load_model(
    checkpoint: str | os.PathLike[str], backend: Any, *, fuse: bool = False, bind: bool = True
) -> LoadedModel:
    """The float32 model of an NVFP4 checkpoint (:func:`load_causal_lm`) with every NVFP4
    linear bound to ``backend`` (an :class:`nvfp4.Frontend`, or any object with its verbs):
    each product is ``backend.qmm`` (or the verb of the linear's activation mode) on a handle
    ``backend.prepare`` made once. ``fuse``: q/k/v and gate/up share one product each
    (:func:`nvfp4_torch.modules.bind_linears`); T6 certifies the unfused model, one backend
    call per checkpoint tensor. ``bind=False`` leaves the linears unbound (``products``
    0): a tensor-parallel rank prepares only its shards
    (:class:`nvfp4_torch.parallel_decoder.ParallelDecoder`)."""
    from nvfp4_checkpoints import open_checkpoint

    linears: dict[str, NVFP4Linear] = {}

    def make(prefix: str, planes: Any, bias: Any, _input_scale: float | None) -> Any:
        linears[prefix] = NVFP4Linear(planes, bias)
        return linears[prefix]

    model = load_causal_lm(checkpoint, make=make, use_cache=True)
    products = bind_linears(linears, backend, fuse=fuse) if bind else 0
    with open_checkpoint(Path(checkpoint)) as ckpt:
        raw_config = dict(ckpt.config)
        quantized = list(ckpt.quantized_names())
    return LoadedModel(model, backend, quantized, raw_config, products)
