"""The compressed-tensors flavour: ``nvfp4-pack-quantized`` checkpoints, read and written.

A compressed-tensors NVFP4 linear ``<prefix>`` is ``<prefix>.weight_packed`` U8,
``.weight_scale`` F8_E4M3, ``.weight_global_scale`` F32 ``[1]`` (ENCODE = 1/decode: the
global read back is within the one ulp of a float32 reciprocal) and optionally
``.input_global_scale`` F32 ``[1]`` (ENCODE), byte layouts of
:mod:`nvfp4.layouts.compressed_tensors`; a legacy ``weight_shape`` tensor is ignored.
``config.json``'s ``quantization_config`` holds the ``NVFP4`` (static activation global)
or ``NVFP4A16`` (weights only) config groups.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import numpy.typing as npt
from nvfp4.layouts import (
    from_compressed_tensors,
    input_global_scale_from_input_scale,
    input_scale_from_input_global_scale,
    to_compressed_tensors,
)
from nvfp4.planes import NVFP4Planes
from nvfp4.spec import BLOCK_SIZE

from .flavour_io import FlavourIO
from .folder import Fields
from .hf import (
    PRODUCER,
    HFCheckpoint,
    PackedFormat,
    base_config,
    exclude_modules,
    spec_record,
)
from .source import Plan, PlaneItem, Source, natural, plane_items

__all__ = ["IO", "CompressedTensorsCheckpoint", "CompressedTensorsFormat", "ct_scheme"]


class CompressedTensorsCheckpoint(HFCheckpoint):
    """A compressed-tensors ``nvfp4-pack-quantized`` checkpoint: ``weight_packed`` U8,
    ``weight_scale`` F8_E4M3, ``weight_global_scale`` F32 (ENCODE), optionally
    ``input_global_scale`` (ENCODE). A legacy ``weight_shape`` tensor is ignored."""

    CODES = "weight_packed"
    SCALES = "weight_scale"
    OWNED = (
        "weight_packed",
        "weight_scale",
        "weight_global_scale",
        "input_global_scale",
        "weight_shape",
    )

    CLAIMS = ("weight_packed", "weight_global_scale", "weight_scale")
    GLOBAL = "weight_global_scale"
    GLOBAL_TENSOR = "weight_global_scale"
    INPUT = "input_global_scale"

    def __init__(self, path: Path) -> None:
        super().__init__(path, "compressed-tensors")

    def _read_quant_config(self, config: Fields) -> None:
        qc = config.obj("quantization_config", required=True)
        assert qc is not None
        groups = qc.obj("config_groups")
        for key, _ in groups.items() if groups is not None else ():
            groups.obj(key, required=True)  # type: ignore[union-attr]
        qc.str_list("ignore")
        self.quant_config = qc.data

    def _accept(self, prefix: str) -> bool:
        # a dense layer of a mixed checkpoint may have a weight_scale of its own (FP8)
        return f"{prefix}.{self.CODES}" in self.store or f"{prefix}.{self.GLOBAL}" in self.store

    def planes_from_parts(self, prefix: str, parts: Mapping[str, Any]) -> NVFP4Planes:
        return from_compressed_tensors(parts, name=prefix)

    def _decode_input(self, a: npt.NDArray[Any], name: str) -> npt.NDArray[Any]:
        return input_scale_from_input_global_scale(a, name)


class CompressedTensorsFormat(PackedFormat):
    """The compressed-tensors tensors (globals and input scale as ENCODE scales, scalars as
    ``[1]``) and config."""

    flavour = "compressed-tensors"
    label = "compressed-tensors"
    codes_name = "weight_packed"
    global_name = "weight_global_scale"
    input_name = "input_global_scale"
    scalar_shape = (1,)

    def layout(self, planes: NVFP4Planes) -> Mapping[str, npt.NDArray[Any]]:
        return to_compressed_tensors(planes)

    def input_array(self, item: PlaneItem) -> npt.NDArray[Any]:
        assert item.input_scale is not None
        return input_global_scale_from_input_scale(item.input_scale, item.key)

    def config_files(self, src: Source, layout: Plan) -> dict[str, dict[str, Any]]:
        items = plane_items(layout)
        with_input = sorted((it.key for it in items if it.input_scale is not None), key=natural)
        without = sorted((it.key for it in items if it.input_scale is None), key=natural)
        groups: dict[str, Any] = {}
        if with_input and without:
            targets_a = [f"re:^{re.escape(k)}$" for k in with_input]
            targets_b = [f"re:^{re.escape(k)}$" for k in without]
            groups["group_0"] = ct_scheme(targets_a, activations=True)
            groups["group_1"] = ct_scheme(targets_b, activations=False)
        else:
            groups["group_0"] = ct_scheme(["Linear"], activations=bool(with_input))
        config = base_config(src.config)
        config["quantization_config"] = {
            "config_groups": groups,
            "format": "nvfp4-pack-quantized",
            "global_compression_ratio": None,
            "ignore": exclude_modules(layout),
            "kv_cache_scheme": None,
            "quant_method": "compressed-tensors",
            "quantization_status": "compressed",
            "producer": dict(PRODUCER),
            "nvfp4": spec_record(),
        }
        return {"config.json": config}


def ct_scheme(targets: list[str], *, activations: bool) -> dict[str, Any]:
    """A compressed-tensors config group: the ``NVFP4`` preset (static activation global,
    block scales at run time) or ``NVFP4A16`` (weights only)."""
    weights = {
        "num_bits": 4,
        "type": "float",
        "symmetric": True,
        "group_size": BLOCK_SIZE,
        "strategy": "tensor_group",
        "dynamic": False,
        "observer": "minmax",
    }
    inputs = None
    if activations:
        inputs = {
            "num_bits": 4,
            "type": "float",
            "symmetric": True,
            "group_size": BLOCK_SIZE,
            "strategy": "tensor_group",
            "dynamic": "local",
            "observer": "static_minmax",
        }
    return {
        "targets": targets,
        "weights": weights,
        "input_activations": inputs,
        "output_activations": None,
        "format": "nvfp4-pack-quantized",
    }


FORMAT = CompressedTensorsFormat()
IO: Final[FlavourIO] = FORMAT.flavour_io(CompressedTensorsCheckpoint)
