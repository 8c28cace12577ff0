"""NVFP4 with its global scale in plain mlx-lm: the model file of our MLX folders.

nvfp4-checkpoints copies this file, unchanged, into every MLX folder it writes (as
``nvfp4_mlx_lm.py``) and names it in the folder's ``config.json`` (``"model_file"``), so
mlx-lm's own loader builds the model with it when trusted::

    mlx_lm.generate --model <folder> --trust-remote-code --prompt "..."
    model, tokenizer = mlx_lm.load("<folder>", trust_remote_code=True)

Why a file: mlx-lm (0.32) decodes an ``nvfp4`` weight as ``e2m1(code) * e4m3(scale)`` and
applies the NVFP4 per-tensor decode global (``<prefix>.global_scale``) only on its expert
(switch) layers; its dense ``QuantizedLinear`` has no global, so the folder's
``global_scale`` tensors are refused ("parameters not in model"). Folding the global into
the E4M3 scale bytes would change the numbers, so it is applied here instead.

What it does: ``ModelArgs.from_dict(config)`` picks the config's own mlx-lm architecture
(``model_type``, as mlx-lm does without a model file) and reads the config as mlx-lm's
``ModelArgs`` expect it where transformers 5 renamed keys (:func:`mlx_lm_args`:
``rope_parameters`` -> ``rope_theta`` / ``rope_scaling``, ``num_local_experts`` ->
``num_experts``; existing keys are never overwritten); ``Model(args)`` builds it and gives
its ``nn.Linear`` layers a ``to_quantized`` that takes ``global_scale`` - mlx-lm's loader
passes ``global_scale=True`` for every layer whose ``<prefix>.global_scale`` the folder
holds, and gets a :class:`GlobalNVFP4Linear`::

    y = (quantized_matmul(x as float32, weight, scales, mode="nvfp4") * global).astype(x.dtype)

with the global per output row (``[N]``). That is the graph of nvfp4-metal's
``NVFP4Linear`` (``nvfp4_metal.load``), so both give the same tokens. :func:`sanitize`
turns the folder's sidecars into that row global after the architecture's own sanitize:
a scalar global is broadcast to ``[N]``; fused planes (``<prefix>.partitions``, one global
per row range) are expanded row by row; ``<prefix>.input_scale`` (the activations' global,
unused by this weights-only path) is dropped.

Expert layers likewise: mlx-lm's ``SwitchLinear`` gets a ``to_quantized`` giving a
:class:`GlobalNVFP4SwitchLinear` (``gather_qmm`` in float32, then each row times its
expert's row global, as nvfp4-metal's ``NVFP4SwitchLinear``). Our folders store experts one
by one under their Hugging Face names (``...experts.<e>.<proj>``); the architectures'
sanitize stacks only their ``.weight`` tensors (into ``...switch_mlp.<proj>.weight``), so
:func:`sanitize` stacks each expert's ``scales`` and row global the same way, beside the
stacked weight it finds under the same parent module.

Layers without a global (mlx-lm's own nvfp4 folders) and other quantization modes keep
mlx-lm's layers.

Self-contained: it imports mlx and mlx-lm only.
"""

from __future__ import annotations

import re
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.switch_layers import SwitchLinear
from mlx_lm.utils import _get_classes

#: NVFP4's block size: 16 codes share one E4M3 scale byte.
GROUP_SIZE = 16
#: FP4 codes per packed uint32 word.
CODES_PER_WORD = 8


class GlobalNVFP4Linear(nn.Module):
    """``x [..., K] -> [..., N]`` for an NVFP4 weight with its decode global (per row)."""

    def __init__(self, input_dims: int, output_dims: int, bias: bool) -> None:
        super().__init__()
        # placeholders: mlx-lm's loader replaces them with the folder's tensors
        self.weight = mx.zeros((output_dims, input_dims // CODES_PER_WORD), dtype=mx.uint32)
        self.scales = mx.zeros((output_dims, input_dims // GROUP_SIZE), dtype=mx.uint8)
        self.global_scale = mx.ones((output_dims,), dtype=mx.float32)
        if bias:
            self.bias = mx.zeros((output_dims,))
        self.freeze()

    def __call__(self, x: mx.array) -> mx.array:
        # float32 throughout: the codes times the E4M3 scales can exceed float16 before
        # the global (often ~1e-4) brings the product back
        y = mx.quantized_matmul(
            x.astype(mx.float32),
            self["weight"],
            self["scales"],
            transpose=True,
            group_size=GROUP_SIZE,
            bits=4,
            mode="nvfp4",
        )
        y = (y * self["global_scale"]).astype(x.dtype)
        if "bias" in self:
            y = y + self["bias"]
        return y


class GlobalNVFP4SwitchLinear(nn.Module):
    """mlx-lm's ``SwitchLinear`` call (``x [..., 1, K]`` against ``indices``) for NVFP4
    experts ``[E, N, K]`` with a row global per expert ``[E, N]``."""

    def __init__(self, input_dims: int, output_dims: int, num_experts: int, bias: bool) -> None:
        super().__init__()
        e, n = num_experts, output_dims
        self.weight = mx.zeros((e, n, input_dims // CODES_PER_WORD), dtype=mx.uint32)
        self.scales = mx.zeros((e, n, input_dims // GROUP_SIZE), dtype=mx.uint8)
        self.global_scale = mx.ones((e, n), dtype=mx.float32)
        if bias:
            self.bias = mx.zeros((e, n))
        self.freeze()

    def __call__(self, x: mx.array, indices: mx.array, sorted_indices: bool = False) -> mx.array:
        y = mx.gather_qmm(
            x.astype(mx.float32),
            self["weight"],
            self["scales"],
            None,
            rhs_indices=indices,
            transpose=True,
            group_size=GROUP_SIZE,
            bits=4,
            mode="nvfp4",
            sorted_indices=sorted_indices,
        )
        # y: indices.shape + (1, N); each row times its expert's row global
        y = (y * mx.expand_dims(self["global_scale"][indices], -2)).astype(x.dtype)
        if "bias" in self:
            y = y + mx.expand_dims(self["bias"][indices], -2)
        return y


class _SwitchLinear(SwitchLinear):
    """mlx-lm's ``SwitchLinear`` whose ``to_quantized`` gives our layer for a global."""

    def to_quantized(
        self,
        group_size: int = 64,
        bits: int = 4,
        mode: str = "affine",
        global_scale: bool = False,
    ) -> nn.Module:
        if global_scale and mode == "nvfp4":
            num_experts, output_dims, input_dims = self.weight.shape
            return GlobalNVFP4SwitchLinear(input_dims, output_dims, num_experts, "bias" in self)
        return super().to_quantized(group_size, bits, mode, global_scale)


class _Linear(nn.Linear):
    """``nn.Linear`` whose ``to_quantized`` also takes mlx-lm's ``global_scale`` flag."""

    def to_quantized(
        self,
        group_size: int | None = None,
        bits: int | None = None,
        mode: str = "affine",
        global_scale: bool = False,
        **kwargs: Any,
    ) -> nn.Module:
        if global_scale:
            if mode != "nvfp4":
                raise ValueError(f"a global scale needs mode 'nvfp4', found {mode!r}")
            output_dims, input_dims = self.weight.shape
            return GlobalNVFP4Linear(input_dims, output_dims, "bias" in self)
        return super().to_quantized(group_size=group_size, bits=bits, mode=mode, **kwargs)


def _row_global(g: mx.array, partitions: mx.array | None, rows: int, name: str) -> mx.array:
    """The float32 global of each of ``rows`` output rows: a scalar broadcast, or one
    value per partition ``p`` over rows ``partitions[p] <= n < partitions[p + 1]``."""
    g = g.astype(mx.float32)
    if partitions is None:
        if g.size != 1:
            raise ValueError(f"{name}: expected a scalar global_scale, found shape {g.shape}")
        return mx.broadcast_to(g.reshape(()), (rows,))
    bounds = partitions.astype(mx.int64).reshape(-1)
    if g.size != bounds.size - 1 or int(bounds[0].item()) != 0 or int(bounds[-1].item()) != rows:
        raise ValueError(
            f"{name}: expected {bounds.size - 1} partition globals over rows [0, {rows}), "
            f"found global_scale {g.shape} and partitions {bounds.tolist()}"
        )
    # the partition of row n is the number of inner boundaries <= n
    n = mx.arange(rows, dtype=mx.int64)
    part = mx.sum(n[:, None] >= bounds[None, 1:-1], axis=1)
    return g.reshape(-1)[part]


#: A per-expert tensor the architecture's sanitize left unstacked.
_EXPERT_PART = re.compile(
    r"^(?P<parent>.+)\.experts\.(?P<e>\d+)\.(?P<proj>[^.]+)\.(?P<what>scales|global_scale)$"
)


def _stack_experts(out: dict[str, mx.array], weights: dict[str, mx.array], new: set[str]) -> None:
    """Stack the experts' ``scales`` and row globals beside the ``.weight`` stack that the
    architecture's sanitize made (a key it created, ``<parent>.<...>.<proj>.weight``)."""
    groups: dict[tuple[str, str], set[int]] = {}
    for key in out:
        m = _EXPERT_PART.match(key)
        if m:
            groups.setdefault((m["parent"], m["proj"]), set()).add(int(m["e"]))
    for (parent, proj), experts in groups.items():
        targets = [k for k in new if k.startswith(f"{parent}.") and k.endswith(f".{proj}.weight")]
        if not targets and all(f"{parent}.experts.{i}.{proj}.weight" in out for i in experts):
            continue  # experts kept one by one (plain linears): each is a dense layer
        if len(targets) != 1 or out[targets[0]].ndim != 3:
            raise ValueError(
                f"{parent}.experts.*.{proj}: expected one stacked [E, N, K/8] weight made by "
                f"the model's sanitize, found {sorted(targets)}"
            )
        stacked = targets[0][: -len(".weight")]
        e, n = out[targets[0]].shape[:2]
        if experts != set(range(e)):
            raise ValueError(f"{parent}.experts.*.{proj}: expected experts 0..{e - 1}")
        scales, rows = [], []
        for i in range(e):
            prefix = f"{parent}.experts.{i}.{proj}"
            scales.append(out.pop(f"{prefix}.scales"))
            g = out.pop(f"{prefix}.global_scale")
            rows.append(_row_global(g, weights.get(f"{prefix}.partitions"), n, prefix))
        out[f"{stacked}.scales"] = mx.stack(scales)
        out[f"{stacked}.global_scale"] = mx.stack(rows)


def sanitize(weights: dict[str, mx.array], sanitized: dict[str, mx.array]) -> dict[str, mx.array]:
    """``sanitized`` (the architecture's sanitize of the folder's ``weights``) with the
    sidecars as our layers hold them (module docstring)."""
    new = set(sanitized) - set(weights)
    out = {k: v for k, v in sanitized.items() if not k.endswith((".input_scale", ".partitions"))}
    _stack_experts(out, weights, new)
    for key in [k for k in out if k.endswith(".global_scale")]:
        prefix = key[: -len(".global_scale")]
        codes = out.get(f"{prefix}.weight")
        if codes is not None and codes.ndim == 2:
            parts = weights.get(f"{prefix}.partitions")
            out[key] = _row_global(out[key], parts, codes.shape[0], prefix)
    return out


def mlx_lm_args(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with the keys mlx-lm's ``ModelArgs`` read filled in from transformers 5's
    names (module docstring); nothing is overwritten."""
    cfg = dict(config)
    rope = cfg.get("rope_parameters")
    if isinstance(rope, dict):
        if "rope_theta" not in cfg and "rope_theta" in rope:
            cfg["rope_theta"] = rope["rope_theta"]
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind not in (None, "default") and not cfg.get("rope_scaling"):
            cfg["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    if "num_experts" not in cfg and "num_local_experts" in cfg:
        cfg["num_experts"] = cfg["num_local_experts"]
    return cfg


class ModelArgs:
    """mlx-lm calls ``ModelArgs.from_dict(config)`` then ``Model(args)``: the config's own
    architecture's arguments, with its model class."""

    def __init__(self, model_class: type[nn.Module], args: Any) -> None:
        self.model_class = model_class
        self.args = args

    @classmethod
    def from_dict(cls, params: dict[str, Any]) -> ModelArgs:
        params = mlx_lm_args(params)
        model_class, args_class = _get_classes(params)
        return cls(model_class, args_class.from_dict(params))


def Model(args: ModelArgs) -> nn.Module:  # mlx-lm calls ``arch.Model(args)``
    """The architecture's model, its linears taking the NVFP4 global (module docstring)."""
    base = args.model_class

    class NVFP4Model(base):  # type: ignore[misc, valid-type]
        def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
            own = getattr(super(), "sanitize", None)
            return sanitize(weights, own(dict(weights)) if own is not None else dict(weights))

    NVFP4Model.__name__ = NVFP4Model.__qualname__ = f"NVFP4{base.__name__}"
    model = NVFP4Model(args.args)
    for _, module in model.named_modules():
        # the same module, one method more (no new arrays): mlx-lm's loader calls it
        if type(module) is nn.Linear:
            module.__class__ = _Linear
        elif type(module) is SwitchLinear:
            module.__class__ = _SwitchLinear
    return model
