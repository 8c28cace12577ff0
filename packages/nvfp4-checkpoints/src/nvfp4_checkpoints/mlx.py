"""The MLX flavour: the MLX-native directory, read and written.

It is what ``mlx_lm`` loads, plus sidecars for what MLX's kernels do not apply themselves:

* ``config.json``: the source model config, with ``"quantization": {"group_size": 16,
  "bits": 4, "mode": "nvfp4"}`` (mlx_lm's quantization block) and our block ``"nvfp4":
  {"spec_version": "1.0", "format": "mlx-nvfp4", "global_scale": "global_scale",
  "input_scale": "input_scale", "partitions": "partitions", "producer": {...}}``;
* per quantized prefix: ``<prefix>.weight`` uint32 ``[E?, N, K/8]`` (the canonical code
  bytes read as little-endian words), ``<prefix>.scales`` uint8 ``[E?, N, K/16]`` (E4M3
  bytes), ``<prefix>.global_scale`` float32 sidecar (the DECODE global: ``()``, ``(E,)``,
  ``(P,)`` or ``(E, P)``, multiplied into the matmul output), optionally
  ``<prefix>.input_scale`` float32 ``()`` (activations' DECODE global) and
  ``<prefix>.partitions`` int64 ``(P + 1,)`` (row boundaries of fused planes);
* every other tensor as it is (bf16 stays bf16), under its Hugging Face name;
* ``nvfp4_mlx_lm.py``, named by ``config.json``'s ``"model_file"``: the model file with which
  plain mlx-lm applies the globals (:mod:`.mlx_lm_model`; mlx-lm's dense nvfp4 layers have
  none), so ``mlx_lm.generate --model <dir> --trust-remote-code`` and
  ``mlx_lm.load(dir, trust_remote_code=True)`` run the folder with exact NVFP4 numerics.

An ``mlx_lm`` nvfp4 model (no sidecar) reads with a global of 1.0, which is how MLX
decodes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.resources import files
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt
from nvfp4.layouts import MLXPlanes, from_mlx, to_mlx
from nvfp4.planes import NVFP4Planes
from nvfp4.spec import BLOCK_SIZE

from .checkpoint import PlaneShape
from .flavour_io import FlavourIO
from .flavours import CheckpointError
from .folder import Fields, short
from .hf import (
    MLX_LM_MODEL_FILE,
    Entry,
    HFCheckpoint,
    HFFormat,
    base_config,
    leading_dims,
    spec_record,
)
from .source import Plan, PlaneItem, Source, TensorItem, plane_items

__all__ = ["IO", "MLXCheckpoint", "MLXFormat"]


class MLXCheckpoint(HFCheckpoint):
    """Our MLX-native directory (see the module docstring): ``weight`` uint32
    ``[E?, N, K/8]``, ``scales`` uint8, sidecars ``global_scale`` (DECODE), optionally
    ``input_scale`` (DECODE) and ``partitions`` (int64 row boundaries of fused planes).
    An ``mlx_lm`` nvfp4 model (no sidecar) reads with a global of 1.0, which is how MLX
    decodes it."""

    CODES = "weight"
    SCALES = "scales"
    OWNED = ("weight", "scales", "global_scale", "input_scale", "partitions")

    CLAIMS = ("scales", "global_scale")
    CODES_DTYPE = "U32"
    CODES_PER_ELEMENT = 8
    SCALES_DTYPES = ("U8",)

    def __init__(self, path: Path) -> None:
        super().__init__(path, "mlx")
        self._check_recorded()

    def _check_recorded(self) -> None:
        """Our writer records the NVFP4 prefixes and the other tensors in ``config.json``'s
        ``nvfp4.tensors`` / ``nvfp4.other_tensors``: a tensor removed from the folder (a
        plain one, or an NVFP4 one's sidecar, which would make it read as a plain U32
        tensor) is refused, naming it, instead of converting without it. Folders without
        the record (mlx_lm's own) are not checked."""
        block = Fields(self.quant_config.get("nvfp4") or {}, self.path / "config.json", "nvfp4")
        for key, found in (
            ("tensors", self._quantized),
            ("other_tensors", self._plain),
        ):
            recorded = block.str_list(key)
            if recorded is None:
                continue
            have = set(found)
            missing = [n for n in recorded if n not in have]
            extra = sorted(have - set(recorded))
            what = "NVFP4" if key == "tensors" else "non-NVFP4"
            if missing or extra:
                raise CheckpointError(
                    f"{self.path / 'config.json'}: key 'nvfp4.{key}': expected the folder's "
                    f"{what} tensors to be the {len(recorded)} recorded, found "
                    + (
                        f"{short(missing[0])} missing"
                        if missing
                        else f"{short(extra[0])} unrecorded"
                    )
                    + f" ({len(missing)} missing, {len(extra)} unrecorded)"
                )

    def _read_quant_config(self, config: Fields) -> None:
        q = config.obj("quantization", required=True)
        assert q is not None
        q.text("mode", choices=frozenset({"nvfp4"}))
        for key, want in (("group_size", BLOCK_SIZE), ("bits", 4)):
            if q.raw(key, want) != want or isinstance(q.raw(key), bool):
                q.fail(key, f"{want} (NVFP4)", q.raw(key))
        block = config.obj("nvfp4")
        self.quant_config = {"quantization": q.data, "nvfp4": block.data if block else {}}

    def _accept(self, prefix: str) -> bool:
        return f"{prefix}.biases" not in self.store  # affine modes carry biases

    def plane_shape(self, prefix: str) -> PlaneShape:
        base = super().plane_shape(prefix)
        name = f"{prefix}.partitions"
        if name not in self.store:
            return base
        parts = self.store.info(name)
        if len(parts.shape) != 1 or parts.shape[0] < 2 or parts.dtype not in ("I64", "I32"):
            raise CheckpointError(
                f"{self.path}: tensor {short(name)}: expected I64 row boundaries of shape "
                f"(P + 1,) with P >= 1, found {parts.dtype} {list(parts.shape)}"
            )
        return PlaneShape(base.shape, parts.shape[0] - 1)

    def planes_from_parts(self, prefix: str, parts: Mapping[str, Any]) -> NVFP4Planes:
        self.plane_shape(prefix)  # checks the partitions tensor
        partitions = None
        if "partitions" in parts:
            partitions = tuple(int(b) for b in np.asarray(parts["partitions"]).tolist())
        # without a sidecar (mx.quantize with no global_scale, as mlx_lm writes) the scale
        # bytes are the whole block scale: the decode global is exactly 1
        mp = MLXPlanes(
            weight=parts["weight"],
            scales=parts["scales"],
            global_scale=parts.get("global_scale", np.asarray(1.0, dtype=np.float32)),
            partitions=partitions,
            name=prefix,
        )
        return from_mlx(mp)


class MLXFormat(HFFormat):
    """The MLX-native tensors, sidecars and config."""

    flavour = "mlx"

    def plane_entries(self, item: PlaneItem) -> list[Entry]:
        lead, (n, k) = leading_dims(item), item.shape.shape[-2:]
        parts = item.shape.partitions
        gshape = lead + ((parts,) if parts is not None else ())
        if item.shape.shared_global:
            gshape = ()
        out: list[Entry] = [
            (f"{item.key}.weight", "U32", (*lead, n, k // 8)),
            (f"{item.key}.scales", "U8", (*lead, n, k // BLOCK_SIZE)),
            (f"{item.key}.global_scale", "F32", gshape),
        ]
        if item.input_scale is not None:
            out.append((f"{item.key}.input_scale", "F32", tuple(item.input_scale.shape)))
        if parts is not None:
            out.append((f"{item.key}.partitions", "I64", (parts + 1,)))
        return out

    def plane_arrays(self, item: PlaneItem, planes: NVFP4Planes) -> list[npt.NDArray[Any]]:
        m = to_mlx(planes)
        lead = leading_dims(item)
        parts = item.shape.partitions
        gshape = lead + ((parts,) if parts is not None else ())
        if item.shape.shared_global:
            gshape = ()
        out: list[npt.NDArray[Any]] = [
            m.weight,
            m.scales,
            np.array(np.broadcast_to(m.global_scale, gshape), dtype=np.float32),
        ]
        if item.input_scale is not None:
            out.append(item.input_scale)
        if m.partitions is not None:
            out.append(np.asarray(m.partitions, dtype=np.int64))
        return out

    def config_files(self, src: Source, layout: Plan) -> dict[str, dict[str, Any]]:
        config = base_config(src.config)
        config["quantization"] = {"group_size": BLOCK_SIZE, "bits": 4, "mode": "nvfp4"}
        config["model_file"] = MLX_LM_MODEL_FILE
        config["nvfp4"] = {
            **spec_record(),
            "format": "mlx-nvfp4",
            "global_scale": "global_scale",
            "input_scale": "input_scale",
            "partitions": "partitions",
            "tensors": [it.key for it in plane_items(layout)],
            "other_tensors": [it.name for it in layout.items if isinstance(it, TensorItem)],
        }
        return {"config.json": config}

    def generated_files(self) -> dict[str, str]:
        source = files(__package__).joinpath("mlx_lm_model.py").read_text(encoding="utf-8")
        return {MLX_LM_MODEL_FILE: source}


FORMAT = MLXFormat()
IO: Final[FlavourIO] = FORMAT.flavour_io(MLXCheckpoint)
