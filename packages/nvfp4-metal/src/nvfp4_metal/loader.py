"""Load an NVFP4 checkpoint as an ``mlx_lm`` model whose quantized linears are NVFP4 modules.

:func:`load` takes a ModelOpt or compressed-tensors NVFP4 checkpoint directory (anything
:func:`nvfp4_checkpoints.open_checkpoint` reads with a Hugging Face ``config.json``, our
MLX-native directory too) and returns ``(model, tokenizer)``: the ``mlx_lm`` model of the
config's ``model_type``, so ``mlx_lm.generate(model, tokenizer, prompt=...)`` and
``mlx_lm.generate.generate_step`` work on it unchanged.

1. The config is read by the checkpoint reader and normalised for mlx-lm where transformers 5
   renamed keys (``rope_parameters`` -> ``rope_theta`` / ``rope_scaling``,
   ``num_local_experts`` -> ``num_experts``); existing keys are never overwritten.
2. The model class comes from mlx-lm (``mlx_lm.utils._get_classes``, the function
   ``mlx_lm.load`` uses), built from ``ModelArgs.from_dict(config)``.
3. The model's own ``sanitize`` runs on the non-quantized tensors plus one small int32
   **marker** per quantized tensor. Where sanitize renames or stacks weights (Qwen3-MoE
   stacks ``mlp.experts.<e>.<proj>`` into ``mlp.switch_mlp.<proj>``) the markers come out
   at the new names, stacked in expert order: that tells which NVFP4 tensors become which
   module, without re-implementing any architecture's renaming. Markers that sanitize
   drops (a tied ``lm_head``) are not loaded; any other transformation of a quantized
   tensor is refused with an error naming it.
4. Each marked module (an ``nn.Linear`` or ``SwitchLinear`` of the model, with the same
   shape) is replaced by :class:`~nvfp4_metal.nn.NVFP4Linear` /
   :class:`~nvfp4_metal.nn.NVFP4SwitchLinear` built by the direct transcode (experts are
   stacked with :func:`nvfp4.fusion.stack_experts`, globals ``(E,)``); then every weight is
   loaded with ``load_weights(strict=True)``, so a missing or unexpected tensor is an error.
5. The tokenizer is mlx-lm's (``mlx_lm.utils.load_tokenizer``): a directory's tokenizer
   files, or for a GGUF file the Hugging Face tokenizer rebuilt from its
   ``tokenizer.ggml.*`` keys (:func:`nvfp4_checkpoints.tokenizer.hf_tokenizer_from_gguf`,
   transformers' GGUF conversion). Where there is none (a directory without tokenizer
   files, a GGUF without tokenizer metadata, transformers missing) it is ``None`` and a
   :class:`NoTokenizerWarning` says why.

Static activation scales (``input_scale``) and KV-cache scales are not used (W4A16).

Checkpoints are read by nvfp4-checkpoints (``pip install 'nvfp4-metal[checkpoints]'``, which
the ``lm`` extra includes); without it importing this module raises an ``ImportError`` that
says so.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import numpy.typing as npt
from mlx.nn.layers.base import Module
from mlx.nn.layers.linear import Linear
from mlx.utils import tree_flatten, tree_unflatten
from nvfp4.frontend import decode_dtype
from nvfp4.fusion import stack_experts

try:
    from nvfp4_checkpoints import Checkpoint, CheckpointError, open_checkpoint
    from nvfp4_checkpoints.tokenizer import TokenizerUnavailable, tokenizer_folder
except ImportError as exc:
    raise ImportError(
        "nvfp4_metal.load reads checkpoints with nvfp4-checkpoints, which is not installed "
        f"({exc}): pip install 'nvfp4-metal[checkpoints]'"
    ) from exc

from .nn import NVFP4Linear, NVFP4SwitchLinear
from .ops import MX_DTYPES
from .settings import Impl

__all__ = [
    "AUX_SUFFIXES",
    "LoadError",
    "NoTokenizerWarning",
    "load",
    "load_model",
    "load_tokenizer",
    "mlx_lm_config",
]

#: Tensors a quantized checkpoint may hold that W4A16 decoding does not use.
AUX_SUFFIXES = (".input_scale", ".k_scale", ".v_scale", ".output_scale", "_amax")


class NoTokenizerWarning(UserWarning):
    """:func:`load` returns no tokenizer; the message says why."""


class LoadError(CheckpointError):
    """The checkpoint cannot be turned into an mlx-lm model (unsupported architecture,
    names or shapes that do not match the model). The message names what and where."""


def _require_mlx_lm() -> Any:
    try:
        import mlx_lm.utils as utils
    except ImportError as exc:
        raise LoadError(
            f"nvfp4_metal.load needs mlx-lm: pip install 'nvfp4-metal[lm]' ({exc})"
        ) from None
    return utils


def mlx_lm_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A Hugging Face ``config.json`` as mlx-lm's ``ModelArgs`` expect it (see the module
    docstring): keys transformers 5 renamed are filled in, nothing is overwritten, and the
    quantization blocks are dropped (the NVFP4 modules replace them)."""
    # the same reading as our MLX folders' model file gives plain mlx-lm
    from nvfp4_checkpoints.mlx_lm_model import mlx_lm_args

    skip = ("quantization_config", "quantization", "nvfp4", "model_file")
    return mlx_lm_args({k: v for k, v in config.items() if k not in skip})


def _to_mx(a: npt.NDArray[Any], dtype: mx.Dtype | None) -> mx.array:
    arr = mx.array(np.ascontiguousarray(a))
    if dtype is not None and mx.issubdtype(arr.dtype, mx.floating):
        arr = arr.astype(dtype)
    return arr


def _marker_owners(
    sanitized: Mapping[str, Any], quantized: list[str]
) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """Split sanitize's output into marked targets (module path -> source prefixes in
    order) and the plain weights."""
    targets: dict[str, list[str]] = {}
    plain: dict[str, Any] = {}
    for key, value in sanitized.items():
        if isinstance(value, mx.array) and value.dtype == mx.int32 and key.endswith(".weight"):
            ids = np.array(value).reshape(-1).tolist()
            shape = tuple(value.shape)
            if not (shape in ((1,), (len(ids), 1)) and all(i < 0 for i in ids)):
                raise LoadError(
                    f"{key}: the model's sanitize transformed NVFP4 weight(s) into shape {shape}; "
                    "only renaming and stacking experts are supported"
                )
            targets[key[: -len(".weight")]] = [quantized[-i - 1] for i in ids]
        else:
            plain[key] = value
    return targets, plain


def _module_map(model: Module) -> dict[str, Module]:
    return dict(model.named_modules())


def _check_target(path: str, module: Any, shape: tuple[int, ...], sources: list[str]) -> None:
    from mlx_lm.models.switch_layers import SwitchLinear

    if module is None:
        raise LoadError(
            f"{path}: NVFP4 tensor(s) {sources[:2]}{'...' if len(sources) > 2 else ''} have no "
            "module at that path in the mlx-lm model"
        )
    if len(shape) == 2 and not isinstance(module, Linear):
        raise LoadError(
            f"{path}: expected an nn.Linear for NVFP4 weights, found {type(module).__name__}"
        )
    if len(shape) == 3 and not isinstance(module, SwitchLinear):
        raise LoadError(
            f"{path}: expected mlx-lm's SwitchLinear for stacked experts, found "
            f"{type(module).__name__}"
        )
    expected = tuple(module["weight"].shape)
    if expected != shape:
        raise LoadError(f"{path}: NVFP4 weight shape {shape} does not match the model's {expected}")


def load_model(
    ckpt: Checkpoint,
    *,
    impl: Impl | str | None = None,
    transcode: str = "direct",
    dtype: Any = None,
    lazy: bool = False,
) -> Module:
    """The mlx-lm model of an opened checkpoint (see :func:`load`)."""
    utils = _require_mlx_lm()
    if not ckpt.config.get("model_type"):
        raise LoadError(f"{ckpt.path}: config.json has no model_type; cannot build an mlx-lm model")
    config = mlx_lm_config(ckpt.config)
    try:
        model_class, args_class = utils._get_classes(config)
    except ValueError as exc:
        raise LoadError(f"{ckpt.path}: {exc}") from None
    model = model_class(args_class.from_dict(config))
    mx_dtype = None
    if dtype is not None:
        mx_dtype = dtype if isinstance(dtype, mx.Dtype) else MX_DTYPES[decode_dtype(dtype)]

    quantized = ckpt.quantized_names()
    weights: dict[str, Any] = {}
    for name in ckpt.tensor_names():
        if name.endswith(AUX_SUFFIXES):
            continue
        weights[name] = _to_mx(ckpt.tensor(name), mx_dtype)
    for i, prefix in enumerate(quantized):
        weights[f"{prefix}.weight"] = mx.array([-(i + 1)], dtype=mx.int32)
    if hasattr(model, "sanitize"):
        weights = model.sanitize(weights)
    targets, plain = _marker_owners(weights, quantized)

    modules = _module_map(model)
    replacements: list[tuple[str, Module]] = []
    for path, sources in targets.items():
        if len(sources) == 1 and path == sources[0]:
            planes = ckpt.planes(sources[0])
        elif len(sources) == 1:
            planes = ckpt.planes(sources[0]).replace(name=path)
        else:
            planes = stack_experts([ckpt.planes(s) for s in sources], name=path)
        module = modules.get(path)
        _check_target(path, module, planes.shape, sources)
        bias = plain.get(f"{path}.bias")
        if bias is None and module is not None and "bias" in module:
            raise LoadError(f"{path}: the model's layer has a bias the checkpoint does not hold")
        cls = NVFP4SwitchLinear if planes.num_experts is not None else NVFP4Linear
        new = cls.from_planes(planes, bias, impl=impl, transcode=transcode)
        plain.pop(f"{path}.bias", None)
        replacements.append((path, new))
        if not lazy:
            mx.eval(new.parameters())
    model.update_modules(tree_unflatten(replacements))

    own: list[tuple[str, mx.array]] = []
    for path, layer in replacements:
        flat: Any = tree_flatten(layer.parameters())
        own.extend((f"{path}.{k}", v) for k, v in flat)
    try:
        model.load_weights(list(plain.items()) + own, strict=True)
    except ValueError as exc:
        raise LoadError(
            f"{ckpt.path}: the checkpoint does not fit the mlx-lm model: {exc}"
        ) from None
    model.eval()
    if not lazy:
        mx.eval(model.parameters())
    built: Module = model
    return built


def load(
    path: str | os.PathLike[str],
    *,
    impl: Impl | str | None = None,
    transcode: str = "direct",
    dtype: Any = None,
    tokenizer: bool = True,
    lazy: bool = False,
) -> tuple[Module, Any]:
    """Load an NVFP4 checkpoint directory or GGUF file as ``(mlx_lm model, tokenizer or None)``.

    Args:
        path: a ModelOpt or compressed-tensors NVFP4 checkpoint, our MLX-native one or a GGUF
            file.
        impl: ``"native"`` or ``"affine"`` (the rollback); default ``$NVFP4_METAL_IMPL``.
        transcode: ``"direct"`` (default: the bytes reinterpreted) or ``"dense"`` (decode to
            float16 and ``mx.quantize`` again; for comparisons).
        dtype: cast the non-quantized weights (embeddings, norms, ...) to this float dtype;
            default: as stored. Activations follow the embeddings' dtype.
        tokenizer: load mlx-lm's tokenizer wrapper (from the directory's tokenizer files or
            the GGUF's tokenizer metadata); where there is none, ``None`` and a
            :class:`NoTokenizerWarning` saying why.
        lazy: leave the weights unevaluated (MLX evaluates them on first use).

    Raises:
        LoadError / CheckpointError naming the path and the tensor or module concerned.
    """
    p = Path(path)
    with open_checkpoint(p) as ckpt:
        model = load_model(ckpt, impl=impl, transcode=transcode, dtype=dtype, lazy=lazy)
        config = ckpt.config
    tok = load_tokenizer(p, config) if tokenizer else None
    return model, tok


def load_tokenizer(path: str | os.PathLike[str], config: Mapping[str, Any]) -> Any:
    """mlx-lm's tokenizer of a checkpoint directory or GGUF file (module docstring, step 5),
    or ``None`` with a :class:`NoTokenizerWarning` naming the reason."""
    p = Path(path)
    utils = _require_mlx_lm()
    eos = config.get("eos_token_id")
    try:
        with tokenizer_folder(p) as folder:
            return utils.load_tokenizer(folder, eos_token_ids=eos)
    except TokenizerUnavailable as exc:
        reason = str(exc)
    warnings.warn(
        f"nvfp4_metal.load: no tokenizer: {reason} (pass tokenizer=False to load the model alone)",
        NoTokenizerWarning,
        stacklevel=3,
    )
    return None
