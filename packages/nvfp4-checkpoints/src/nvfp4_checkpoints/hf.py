"""What the three Hugging Face flavours share: a directory of safetensors files.

A Hugging Face checkpoint is a directory of ``*.safetensors`` files, single or sharded with
``model.safetensors.index.json``, beside ``config.json`` (and the flavour's own config
files, tokenizer, generation config...).

* Reading: :class:`SafetensorsStore` (every tensor of the directory, through
  :mod:`.safetensors_io`) and :class:`HFCheckpoint`, the reader base: a prefix is quantized
  when its ``<prefix>.<codes suffix>`` and ``<prefix>.<scales suffix>`` tensors have the
  flavour's dtypes.
* Writing: :class:`HFFormat` (a flavour's tensor entries, arrays and config files) and
  :func:`write_hf`, which plans the shards from shapes alone, writes each safetensors file
  header first and then tensor by tensor, then the index, the configs and the source
  directory's other files. Outputs are ``model.safetensors``, or
  ``model-0000i-of-0000n.safetensors`` shards plus ``model.safetensors.index.json`` when
  larger than ``max_shard_bytes``.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt
from nvfp4.planes import NVFP4Planes, PlaneError

from ._version import __version__
from .checkpoint import Checkpoint, PlaneShape
from .flavour_io import WriteOptions
from .flavours import CheckpointError, Flavour, read_json
from .safetensors_io import (
    DTYPES,
    SafetensorsError,
    SafetensorsFile,
    SafetensorsWriter,
    TensorInfo,
    dtype_name,
)
from .source import Plan, PlaneItem, Progress, Source, TensorItem, fetch, natural, plan, slow

__all__ = [
    "DEFAULT_MAX_SHARD_BYTES",
    "INDEX_FILE",
    "PRODUCER",
    "Entry",
    "HFCheckpoint",
    "HFFormat",
    "SafetensorsStore",
    "base_config",
    "exclude_modules",
    "leading_dims",
    "refuse_partitions",
    "write_hf",
]

INDEX_FILE: Final = "model.safetensors.index.json"
#: Shard size above which Hugging Face outputs are split (bytes).
DEFAULT_MAX_SHARD_BYTES: Final = 5_000_000_000
#: The ``producer`` block of the configs written.
PRODUCER: Final = {"name": "nvfp4", "version": __version__}
_HF_CONFIG_FILES: Final = frozenset({"config.json", "hf_quant_config.json", INDEX_FILE})

Entry = tuple[str, str, tuple[int, ...]]  # (name, safetensors dtype, shape)


# =========================================================================== reading
class SafetensorsStore:
    """The tensors of a Hugging Face directory, single file or sharded with an index."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files: list[SafetensorsFile] = []
        self.where: dict[str, SafetensorsFile] = {}
        index = root / INDEX_FILE
        try:
            if index.is_file():
                weight_map = read_json(index).get("weight_map")
                if not isinstance(weight_map, dict):
                    raise CheckpointError(f"{index}: no 'weight_map' object")
                by_file: dict[str, list[str]] = {}
                for name, fname in weight_map.items():
                    by_file.setdefault(str(fname), []).append(str(name))
                for fname, names in by_file.items():
                    fpath = root / fname
                    if not fpath.is_file():
                        raise CheckpointError(f"{index}: shard {fname!r} is missing")
                    sf = SafetensorsFile(fpath)
                    self.files.append(sf)
                    for name in names:
                        if name not in sf:
                            raise CheckpointError(
                                f"{index}: tensor {name!r} is mapped to {fname!r}, "
                                "which does not hold it"
                            )
                        self.where[name] = sf
            else:
                paths = sorted(root.glob("*.safetensors"))
                if not paths:
                    raise CheckpointError(f"{root}: no *.safetensors files")
                for fpath in paths:
                    sf = SafetensorsFile(fpath)
                    self.files.append(sf)
                    for name in sf.names():
                        if name in self.where:
                            raise CheckpointError(
                                f"{root}: tensor {name!r} is in both "
                                f"{self.where[name].path.name} and {fpath.name}"
                            )
                        self.where[name] = sf
        except SafetensorsError as e:
            raise CheckpointError(str(e)) from None

    def names(self) -> list[str]:
        return list(self.where)

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def info(self, name: str) -> TensorInfo:
        return self.where[name].info(name)

    def get(self, name: str) -> npt.NDArray[Any]:
        try:
            return self.where[name].get(name)
        except SafetensorsError as e:
            raise CheckpointError(str(e)) from None


class HFCheckpoint(Checkpoint):
    """Shared machinery of the safetensors flavours: a prefix is quantized when its
    ``<prefix>.<codes suffix>`` and ``<prefix>.<scales suffix>`` tensors have the flavour's
    dtypes; the prefix's own tensors (``OWNED``) are hidden from :meth:`tensor_names`."""

    CODES: str
    SCALES: str
    OWNED: tuple[str, ...]

    def __init__(self, path: Path, flavour: Flavour) -> None:
        self.path = path
        self.flavour = flavour
        cfg = path / "config.json"
        self.config = read_json(cfg) if cfg.is_file() else {}
        self.store = SafetensorsStore(path)
        self._quantized = [p for p in self._candidates() if self._accept(p)]
        self._qset = frozenset(self._quantized)
        owned = {f"{p}.{s}" for p in self._qset for s in self.OWNED}
        self._plain = [n for n in self.store.names() if n not in owned]
        self._pset = frozenset(self._plain)

    def _candidates(self) -> list[str]:
        out = []
        suffix = "." + self.SCALES
        for name in self.store.names():
            if name.endswith(suffix):
                prefix = name[: -len(suffix)]
                if f"{prefix}.{self.CODES}" in self.store and self._looks_nvfp4(prefix):
                    out.append(prefix)
        return out

    def _looks_nvfp4(self, prefix: str) -> bool:
        codes = self.store.info(f"{prefix}.{self.CODES}")
        scales = self.store.info(f"{prefix}.{self.SCALES}")
        return (
            codes.dtype == "U8"
            and scales.dtype in ("F8_E4M3", "U8")
            and len(codes.shape) in (2, 3)
            and len(scales.shape) == len(codes.shape)
        )

    def _accept(self, prefix: str) -> bool:
        return True

    def quantized_names(self) -> list[str]:
        return list(self._quantized)

    def _check_prefix(self, prefix: str) -> None:
        if prefix not in self._qset:
            raise CheckpointError(f"{self.path}: {prefix!r} is not an NVFP4 tensor")

    def _parts(self, prefix: str) -> dict[str, npt.NDArray[Any]]:
        self._check_prefix(prefix)
        return {
            s: self.store.get(f"{prefix}.{s}") for s in self.OWNED if f"{prefix}.{s}" in self.store
        }

    def plane_shape(self, prefix: str) -> PlaneShape:
        self._check_prefix(prefix)
        codes = self.store.info(f"{prefix}.{self.CODES}")
        return PlaneShape((*codes.shape[:-1], self._k_of(codes)))

    def _k_of(self, codes: TensorInfo) -> int:
        return codes.shape[-1] * 2

    def tensor_names(self) -> list[str]:
        return list(self._plain)

    def tensor(self, name: str) -> npt.NDArray[Any]:
        if name not in self._pset:
            raise CheckpointError(f"{self.path}: no non-quantized tensor {name!r}")
        return self.store.get(name)

    def tensor_info(self, name: str) -> tuple[np.dtype[Any], tuple[int, ...]]:
        if name not in self._pset:
            raise CheckpointError(f"{self.path}: no non-quantized tensor {name!r}")
        info = self.store.info(name)
        return DTYPES[info.dtype], info.shape


# =========================================================================== writing
class HFFormat:
    """Entries and arrays of one Hugging Face flavour."""

    flavour: Flavour

    def plane_entries(self, item: PlaneItem) -> list[Entry]:
        raise NotImplementedError

    def plane_arrays(self, item: PlaneItem, planes: NVFP4Planes) -> list[npt.NDArray[Any]]:
        raise NotImplementedError

    def config_files(self, src: Source, layout: Plan) -> dict[str, dict[str, Any]]:
        raise NotImplementedError


def leading_dims(item: PlaneItem) -> tuple[int, ...]:
    return item.shape.shape[:-2]


def refuse_partitions(item: PlaneItem, flavour: str) -> None:
    if item.shape.partitions is not None:
        raise PlaneError(
            item.key,
            f"partitions (fused tensor) for {flavour}",
            "an unfused tensor (one per projection); call nvfp4.fusion.unfuse first",
            f"{item.shape.partitions} partitions",
        )


def base_config(config: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(config))
    for key in ("quantization_config", "quantization", "nvfp4"):
        out.pop(key, None)
    return out


def exclude_modules(layout: Plan) -> list[str]:
    """Prefixes of 2-D non-quantized ``.weight`` tensors (embeddings, lm_head, routers)."""
    return sorted(
        {
            it.name[: -len(".weight")]
            for it in layout.items
            if isinstance(it, TensorItem) and it.name.endswith(".weight") and len(it.shape) == 2
        },
        key=natural,
    )


def _tensor_entry(item: TensorItem) -> Entry:
    try:
        return (item.name, dtype_name(item.dtype), item.shape)
    except ValueError:
        raise CheckpointError(
            f"tensor {item.name!r}: dtype {item.dtype} has no safetensors type"
        ) from None


def _write_hf(
    dst_tmp: Path,
    fmt: HFFormat,
    src: Source,
    *,
    max_shard_bytes: int,
    progress: Progress | None,
    extra_files: list[Path],
) -> None:
    layout = plan(src, stack=False)
    units: list[tuple[PlaneItem | TensorItem, list[Entry]]] = []
    for it in layout.items:
        entries = fmt.plane_entries(it) if isinstance(it, PlaneItem) else [_tensor_entry(it)]
        units.append((it, entries))
    sizes = [sum(math.prod(s) * DTYPES[d].itemsize for _, d, s in e) for _, e in units]
    shards: list[list[int]] = [[]]
    acc = 0
    for i, size in enumerate(sizes):
        if shards[-1] and acc + size > max_shard_bytes:
            shards.append([])
            acc = 0
        shards[-1].append(i)
        acc += size
    total_bytes, total_items = sum(sizes), len(units)
    configs = fmt.config_files(src, layout)

    dst_tmp.mkdir()
    n = len(shards)
    names = (
        ["model.safetensors"]
        if n == 1
        else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    )
    weight_map: dict[str, str] = {}
    done_items = done_bytes = 0
    if progress:
        progress(0, total_items, 0, total_bytes)
    for fname, shard in zip(names, shards, strict=True):
        entries = [e for i in shard for e in units[i][1]]
        with SafetensorsWriter(dst_tmp / fname, entries, {"format": "pt"}) as w:
            for i in shard:
                it, its_entries = units[i]
                if isinstance(it, PlaneItem):
                    arrays = fmt.plane_arrays(it, fetch(src, it))
                else:
                    arrays = [src.tensor_of(it.name)]
                for (ename, _, _), arr in zip(its_entries, arrays, strict=True):
                    done_bytes += w.write(ename, arr)
                    weight_map[ename] = fname
                done_items += 1
                if progress:
                    progress(done_items, total_items, done_bytes, total_bytes)
                slow()
    if n > 1:
        index = {"metadata": {"total_size": total_bytes}, "weight_map": weight_map}
        _write_json(dst_tmp / INDEX_FILE, index)
    for name, content in configs.items():
        _write_json(dst_tmp / name, content)
    for extra in extra_files:
        shutil.copy2(extra, dst_tmp / extra.name)


def _write_json(path: Path, content: Mapping[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(content, f, indent=2)
        f.write("\n")


def _extra_files(origin: Checkpoint | None) -> list[Path]:
    """The source directory's other files (tokenizer, generation config...), copied into
    the output."""
    if origin is None or not origin.path.is_dir():
        return []
    return sorted(
        p
        for p in origin.path.iterdir()
        if p.is_file()
        and p.name not in _HF_CONFIG_FILES
        and not p.name.endswith(".safetensors")
        and not p.name.startswith(".")
    )


def write_hf(fmt: HFFormat, dst_tmp: Path, src: Source, options: WriteOptions) -> list[str]:
    """Write ``src`` as a Hugging Face directory of flavour ``fmt`` at ``dst_tmp``."""
    _write_hf(
        dst_tmp,
        fmt,
        src,
        max_shard_bytes=options.max_shard_bytes,
        progress=options.progress,
        extra_files=_extra_files(src.origin),
    )
    return []
