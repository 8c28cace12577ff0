"""The ModelOpt flavour: NVIDIA ModelOpt's Hugging Face export, read and written.

A ModelOpt NVFP4 linear ``<prefix>`` is ``<prefix>.weight`` U8 (codes),
``.weight_scale`` F8_E4M3, ``.weight_scale_2`` F32 (the DECODE global) and ``.input_scale``
F32 (the activations' DECODE global), byte layouts of :mod:`nvfp4.layouts.modelopt`.
``hf_quant_config.json`` holds the ``quant_algo`` (``NVFP4`` when every layer has an input
scale, ``W4A16_NVFP4`` when none has, else ``MIXED_PRECISION`` with per-layer
``quantized_layers``), and ``config.json`` its ``quantization_config`` in the shape
ModelOpt's ``convert_hf_quant_config_format`` gives it. ModelOpt sources keep their
per-layer ``quant_algo`` when converted to ModelOpt.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import numpy.typing as npt
from nvfp4.layouts import from_modelopt, to_modelopt
from nvfp4.planes import NVFP4Planes
from nvfp4.spec import BLOCK_SIZE

from .checkpoint import Checkpoint
from .flavour_io import FlavourIO
from .flavours import MODELOPT_NVFP4_ALGOS, CheckpointError
from .folder import Fields, short
from .hf import (
    PRODUCER,
    HFCheckpoint,
    PackedFormat,
    base_config,
    exclude_modules,
    spec_record,
)
from .source import Plan, Source, plane_items

__all__ = [
    "IO",
    "ModelOptCheckpoint",
    "ModelOptFormat",
    "modelopt_config_json",
    "other_quantized_layers",
]


class ModelOptCheckpoint(HFCheckpoint):
    """A ModelOpt HF export: ``weight`` U8, ``weight_scale`` F8_E4M3, ``weight_scale_2``
    F32, ``input_scale`` F32 per quantized prefix. With ``MIXED_PRECISION`` only the
    layers whose ``quant_algo`` is an NVFP4 algorithm count as NVFP4 (the others' tensors
    are passed through as non-quantized tensors)."""

    CODES = "weight"
    SCALES = "weight_scale"
    OWNED = ("weight", "weight_scale", "weight_scale_2", "input_scale")

    CLAIMS = ("weight_scale", "weight_scale_2")
    GLOBAL = "weight_scale_2"
    GLOBAL_TENSOR = "weight_scale_2"

    def __init__(self, path: Path) -> None:
        super().__init__(path, "modelopt")

    def _read_quant_config(self, config: Fields) -> None:
        hq = self.folder.fields("hf_quant_config.json")
        if hq is not None:
            self.quant_config = hq.data
            q = hq.obj("quantization")
        else:
            q = config.obj("quantization_config")
            self.quant_config = {"quantization": q.data} if q is not None else {}
        self.quant_algo = (q.text("quant_algo") if q is not None else None) or ""
        layers = q.obj("quantized_layers") if q is not None else None
        self.layer_algos: dict[str, str] = {}
        for layer, _ in layers.items() if layers is not None else ():
            entry = layers.obj(layer, required=True)  # type: ignore[union-attr]
            assert entry is not None
            self.layer_algos[layer] = entry.text("quant_algo") or ""

    def _claimed(self) -> list[str]:
        claimed = super()._claimed()
        have = set(claimed)
        for layer, algo in self.layer_algos.items():
            if algo in MODELOPT_NVFP4_ALGOS and layer not in have:
                raise CheckpointError(
                    f"{self.path}: quantized_layers names {short(layer)} {algo} but the "
                    "checkpoint has no NVFP4 tensors for it"
                )
        return claimed

    def _accept(self, prefix: str) -> bool:
        if self.quant_algo == "MIXED_PRECISION" and prefix in self.layer_algos:
            return self.layer_algos[prefix] in MODELOPT_NVFP4_ALGOS
        return True

    def algo(self, prefix: str) -> str:
        """The prefix's ModelOpt ``quant_algo`` (``NVFP4``, ``W4A16_NVFP4``, ...)."""
        if prefix in self.layer_algos:
            return self.layer_algos[prefix]
        if self.quant_algo in MODELOPT_NVFP4_ALGOS:
            return self.quant_algo
        return "NVFP4" if self.input_scale(prefix) is not None else "W4A16_NVFP4"

    def planes_from_parts(self, prefix: str, parts: Mapping[str, Any]) -> NVFP4Planes:
        return from_modelopt(parts, name=prefix)


class ModelOptFormat(PackedFormat):
    """The ModelOpt tensors (the input scale stored as it is) and config files."""

    flavour = "modelopt"
    label = "ModelOpt"
    codes_name = "weight"
    global_name = "weight_scale_2"
    input_name = "input_scale"
    scalar_shape = ()

    def layout(self, planes: NVFP4Planes) -> Mapping[str, npt.NDArray[Any]]:
        return to_modelopt(planes)

    def config_files(self, src: Source, layout: Plan) -> dict[str, dict[str, Any]]:
        items = plane_items(layout)
        algos = _algos_of(src.origin)
        per_layer = {
            it.key: (algos or {}).get(it.key)
            or ("NVFP4" if it.input_scale is not None else "W4A16_NVFP4")
            for it in items
        }
        others = other_quantized_layers(src.origin)
        distinct = set(per_layer.values())
        quant: dict[str, Any]
        if len(distinct) == 1 and not others:
            quant = {
                "quant_algo": distinct.pop(),
                "kv_cache_quant_algo": None,
                "group_size": BLOCK_SIZE,
                "exclude_modules": exclude_modules(layout),
            }
        else:
            quant = {
                "quant_algo": "MIXED_PRECISION",
                "kv_cache_quant_algo": None,
                "quantized_layers": {
                    **{
                        k: {"quant_algo": a, "group_size": BLOCK_SIZE} for k, a in per_layer.items()
                    },
                    **others,
                },
            }
        hf_quant = {"producer": dict(PRODUCER), "quantization": quant, "nvfp4": spec_record()}
        config = base_config(src.config)
        config["quantization_config"] = modelopt_config_json(hf_quant)
        return {"config.json": config, "hf_quant_config.json": hf_quant}


def _modelopt_group(algo: str) -> dict[str, Any]:
    """ModelOpt's config group of ``algo`` (its ``_quant_algo_to_group_config``): NVFP4
    algorithms, FP8 (a ``MIXED_PRECISION`` source's FP8 layers), else the name alone."""
    if algo == "FP8":
        fp8 = {"dynamic": False, "num_bits": 8, "type": "float"}
        return {"input_activations": dict(fp8), "weights": dict(fp8)}
    if algo not in MODELOPT_NVFP4_ALGOS:
        return {"quant_algo": algo}
    weights = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": BLOCK_SIZE}
    if algo == "W4A16_NVFP4":
        return {"weights": weights}
    inputs = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": BLOCK_SIZE}
    return {"input_activations": inputs, "weights": weights}


def modelopt_config_json(hf_quant: Mapping[str, Any]) -> dict[str, Any]:
    """``config.json``'s ``quantization_config`` for an ``hf_quant_config.json``, in the
    shape ModelOpt's ``convert_hf_quant_config_format`` gives it (NVFP4 algorithms)."""
    q = hf_quant["quantization"]
    algo = q["quant_algo"]
    out: dict[str, Any] = {}
    if algo == "MIXED_PRECISION":
        by_cfg: dict[str, tuple[str, list[str]]] = {}  # one group per distinct layer config
        for layer, cfg in q["quantized_layers"].items():
            key = json.dumps(cfg, sort_keys=True)
            by_cfg.setdefault(key, (str(cfg.get("quant_algo", "")), []))[1].append(layer)
        groups = {}
        for i, (layer_algo, layers) in enumerate(by_cfg.values()):
            g = _modelopt_group(layer_algo)
            g["targets"] = sorted(layers)
            groups[f"group_{i}"] = g
        out["config_groups"] = groups
        out["quantized_layers"] = q["quantized_layers"]
    else:
        g = _modelopt_group(algo)
        g["targets"] = ["Linear"]
        out["config_groups"] = {"group_0": g}
    excl = q.get("exclude_modules")
    out["ignore"] = excl if excl is not None else []
    out["quant_algo"] = algo
    out["producer"] = hf_quant["producer"]
    out["quant_method"] = "modelopt"
    return out


def other_quantized_layers(origin: Checkpoint | None) -> dict[str, dict[str, Any]]:
    """A ModelOpt ``MIXED_PRECISION`` source's layers of another algorithm than NVFP4 (FP8,
    INT4_AWQ...) whose tensors it holds, with their ``quantized_layers`` entry: their
    tensors pass through as plain tensors, and only a ModelOpt output can say what they
    are (without it, an FP8 ``weight`` would be read as a plain weight, its scale ignored)."""
    if not isinstance(origin, ModelOptCheckpoint) or origin.quant_algo != "MIXED_PRECISION":
        return {}
    plain = set(origin.tensor_names())
    entries = origin.quant_config.get("quantization", {}).get("quantized_layers", {})
    return {
        layer: dict(entries[layer])
        for layer, algo in origin.layer_algos.items()
        if algo not in MODELOPT_NVFP4_ALGOS and any(n.startswith(f"{layer}.") for n in plain)
    }


def _algos_of(origin: Checkpoint | None) -> dict[str, str] | None:
    """A ModelOpt source's per-layer NVFP4 ``quant_algo`` (kept when writing ModelOpt)."""
    if isinstance(origin, ModelOptCheckpoint):
        return {
            p: origin.algo(p)
            for p in origin.quantized_names()
            if origin.algo(p) in MODELOPT_NVFP4_ALGOS
        }
    return None


FORMAT = ModelOptFormat()
IO: Final[FlavourIO] = FORMAT.flavour_io(ModelOptCheckpoint)
