"""Write NVFP4 checkpoints: ModelOpt HF, compressed-tensors HF, MLX native and GGUF.

Every writer streams: the output's layout (names, dtypes, shapes, shards) is planned from
shapes alone, the headers are written first, then the tensors one at a time, each fetched,
transcoded by :mod:`nvfp4.layouts` (a byte shuffle, never a decode) and written before the
next is read. Peak memory is about one (expert-stacked, for GGUF) tensor. Every writer is
atomic (:mod:`.atomic`): the output appears under its name complete or not at all.

* :func:`write_checkpoint` converts an opened :class:`~nvfp4_checkpoints.Checkpoint` to any
  flavour, copying the source directory's other files (tokenizer, generation config...)
  into directory outputs.
* :func:`write_modelopt`, :func:`write_compressed_tensors`, :func:`write_mlx` and
  :func:`write_gguf` write from mappings ``prefix -> NVFP4Planes`` and ``name -> array``.
  Expert-stacked planes ``[E, N, K]`` under a key containing ``{}`` (``"...experts.{}.
  gate_proj"``) are written per expert (``experts.0.gate_proj`` ...), as Hugging Face
  checkpoints store them; GGUF stacks experts again.

Hugging Face outputs are ``model.safetensors``, or ``model-0000i-of-0000n.safetensors``
shards plus ``model.safetensors.index.json`` when larger than ``max_shard_bytes``.

**The MLX-native directory** (read back by :class:`~nvfp4_checkpoints.reader.MLXCheckpoint`)
is what ``mlx_lm`` loads, plus sidecars for what MLX's kernels do not apply themselves:

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
* every other tensor as it is (bf16 stays bf16), under its Hugging Face name.

**GGUF** (``NVFP4``, ggml type 40, via the ``gguf`` package): ``<base>.weight`` NVFP4,
``<base>.scale`` F32 ``[1]`` (``[E]`` for merged experts), ``<base>.input_scale`` when
present. Names go through gguf-py's tensor-name map of the architecture
(``config.model_type``: llama/mistral/mixtral -> ``llama``, qwen3_moe -> ``qwen3moe``...),
experts are merged into ``[E, N, K]`` tensors as llama.cpp expects, q/k rows of the
``llama`` architecture are RoPE-permuted as llama.cpp's converter does, and 1-D bf16/f16
tensors are widened to F32 (lossless). Names the map does not know keep their Hugging Face
name. The metadata holds the architecture's hyper-parameters from ``config.json`` and
``nvfp4.*`` keys (spec version, the HF config, the GGUF<->HF name map and original dtypes)
from which :class:`~nvfp4_checkpoints.reader.GGUFCheckpoint` restores the HF view exactly.
K % 64 != 0 is refused before anything is written. The tokenizer (``tokenizer.ggml.*``,
which llama.cpp needs to load the file) comes from the source directory's Hugging Face
``tokenizer.json`` (:mod:`.gguf_vocab`), or is copied from a GGUF source; without one the
GGUF has none and :func:`write_checkpoint` logs a one-line note.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt
from nvfp4.fusion import stack_experts, unstack_experts
from nvfp4.layouts import (
    input_global_scale_from_input_scale,
    to_compressed_tensors,
    to_mlx,
    to_modelopt,
)
from nvfp4.layouts.gguf import gguf_global, iter_gguf_data
from nvfp4.planes import NVFP4Planes, PlaneError
from nvfp4.spec import BLOCK_SIZE, GGUF_BLOCK_BYTES, GGUF_SUPER_BLOCK, SPEC_VERSION

from . import __version__
from .atomic import atomic_output
from .flavours import FLAVOURS, MODELOPT_NVFP4_ALGOS, CheckpointError, import_gguf
from .gguf_file import PLAIN_TYPES
from .gguf_vocab import TOKENIZER_FILE, add_hf_tokenizer, copy_gguf_tokenizer, has_hf_tokenizer
from .overlapped import OverlappedWriter
from .reader import (
    INDEX_FILE,
    KV_GGUF_NAMES,
    KV_HF_CONFIG,
    KV_HF_DTYPES,
    KV_HF_NAMES,
    KV_ROPE_PERMUTED,
    KV_SPEC,
    Checkpoint,
    GGUFCheckpoint,
    ModelOptCheckpoint,
    PlaneShape,
    group_experts,
    rope_permute_rows,
)
from .safetensors_io import DTYPES, SafetensorsWriter, dtype_name

__all__ = [
    "DEFAULT_MAX_SHARD_BYTES",
    "Progress",
    "write_checkpoint",
    "write_compressed_tensors",
    "write_gguf",
    "write_mlx",
    "write_modelopt",
]

#: Shard size above which Hugging Face outputs are split (bytes).
DEFAULT_MAX_SHARD_BYTES: Final = 5_000_000_000
#: ``progress(tensors_done, tensors_total, bytes_done, bytes_total)``.
Progress = Callable[[int, int, int, int], None]
#: Test hook: seconds to sleep after each tensor (to interrupt a conversion mid-way).
SLOW_ENV: Final = "NVFP4_TEST_SLOW_CONVERT"
_PRODUCER: Final = {"name": "nvfp4", "version": __version__}
_HF_CONFIG_FILES: Final = frozenset({"config.json", "hf_quant_config.json", INDEX_FILE})

Entry = tuple[str, str, tuple[int, ...]]  # (name, safetensors dtype, shape)
#: Adds tokenizer keys to a GGUFWriter; returns whether it added any.
TokenizerWriter = Callable[[Any], bool]
logger = logging.getLogger(__name__)


# ============================================================================ sources
class _Source:
    """What a writer reads: quantized prefixes (2-D, or stacked without ``{}``) and plain
    tensors, fetched one at a time."""

    def __init__(
        self,
        prefixes: Sequence[str],
        shape_of: Callable[[str], PlaneShape],
        planes_of: Callable[[str], NVFP4Planes],
        input_of: Callable[[str], float | None],
        tensor_names: Sequence[str],
        info_of: Callable[[str], tuple[np.dtype[Any], tuple[int, ...]]],
        tensor_of: Callable[[str], npt.NDArray[Any]],
        config: Mapping[str, Any],
        tokenizer: TokenizerWriter | None = None,
    ) -> None:
        self.prefixes = list(prefixes)
        self.shape_of = shape_of
        self.planes_of = planes_of
        self.input_of = input_of
        self.tensor_names = list(tensor_names)
        self.info_of = info_of
        self.tensor_of = tensor_of
        self.config = dict(config)
        self.tokenizer = tokenizer  # GGUF only
        self.tokenizer_written = False


def _checkpoint_source(src: Checkpoint) -> _Source:
    return _Source(
        src.quantized_names(),
        src.plane_shape,
        src.planes,
        src.input_scale,
        src.tensor_names(),
        src.tensor_info,
        src.tensor,
        src.config,
    )


def _mapping_source(
    planes: Mapping[str, NVFP4Planes],
    tensors: Mapping[str, npt.ArrayLike],
    config: Mapping[str, Any],
    input_scales: Mapping[str, float] | None,
) -> _Source:
    """Planes under ``{}`` keys are presented per expert (views, no copy)."""
    scales = dict(input_scales or {})
    members: dict[str, tuple[str, int | None]] = {}
    for key, p in planes.items():
        if not isinstance(p, NVFP4Planes):
            raise PlaneError(key, "planes type", "nvfp4.NVFP4Planes", type(p).__name__)
        if "{}" in key:
            if p.num_experts is None:
                raise PlaneError(key, "planes under a '{}' key", "[E, N, K] planes", p.shape)
            for i in range(p.num_experts):
                members[key.format(i)] = (key, i)
        else:
            members[key] = (key, None)

    def planes_of(prefix: str) -> NVFP4Planes:
        key, i = members[prefix]
        p = planes[key]
        return p if i is None else unstack_experts(p)[i].replace(name=prefix)

    def shape_of(prefix: str) -> PlaneShape:
        key, i = members[prefix]
        p = planes[key]
        dims = p.shape if i is None else p.shape[1:]
        return PlaneShape(tuple(dims), p.num_partitions)

    def input_of(prefix: str) -> float | None:
        key, _ = members[prefix]
        v = scales.get(prefix, scales.get(key))
        return None if v is None else float(v)

    arrays = {k: np.asarray(v) for k, v in tensors.items()}
    return _Source(
        list(members),
        shape_of,
        planes_of,
        input_of,
        list(arrays),
        lambda n: (arrays[n].dtype, tuple(arrays[n].shape)),
        lambda n: arrays[n],
        config,
    )


# ============================================================================== plan
@dataclass
class _PlaneItem:
    key: str  # output prefix ("...experts.{}.proj" for a GGUF expert stack)
    members: list[str]  # source prefixes (several: stack them)
    shape: PlaneShape  # of the output planes
    input_scale: npt.NDArray[np.float32] | None  # () or (E,)


@dataclass
class _TensorItem:
    name: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]


@dataclass
class _Plan:
    items: list[_PlaneItem | _TensorItem] = field(default_factory=list)


def _item_key(item: _PlaneItem | _TensorItem) -> str:
    return item.key if isinstance(item, _PlaneItem) else item.name


def _natural(s: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def _plan(src: _Source, *, stack: bool) -> _Plan:
    """Items in natural name order; with ``stack`` complete expert runs become stacks."""
    items: list[_PlaneItem | _TensorItem] = []
    stacked: set[str] = set()
    if stack:
        for key, members in group_experts(src.prefixes, src.shape_of).items():
            first = src.shape_of(members[0])
            if first.partitions is not None:
                continue
            shape = PlaneShape((len(members), *first.shape), None)
            items.append(_PlaneItem(key, members, shape, _stacked_input(src, key, members)))
            stacked.update(members)
    for p in src.prefixes:
        if p in stacked:
            continue
        v = src.input_of(p)
        inp = None if v is None else np.asarray(v, dtype=np.float32)
        items.append(_PlaneItem(p, [p], src.shape_of(p), inp))
    for n in src.tensor_names:
        dt, dims = src.info_of(n)
        items.append(_TensorItem(n, np.dtype(dt), tuple(dims)))
    items.sort(key=lambda it: _natural(_item_key(it)))
    return _Plan(items)


def _stacked_input(src: _Source, key: str, members: list[str]) -> npt.NDArray[np.float32] | None:
    values = [src.input_of(m) for m in members]
    if all(v is None for v in values):
        return None
    if any(v is None for v in values):
        missing = members[values.index(None)]
        raise CheckpointError(f"{key}: expert {missing!r} has no input_scale but others do")
    return np.asarray(values, dtype=np.float32)


def _fetch(src: _Source, item: _PlaneItem) -> NVFP4Planes:
    if len(item.members) == 1 and item.key == item.members[0]:
        return src.planes_of(item.key)
    return stack_experts([src.planes_of(m) for m in item.members], name=item.key)


def _slow() -> None:
    delay = os.environ.get(SLOW_ENV)
    if delay:
        time.sleep(float(delay))


# ====================================================================== HF formats
class _HFFormat:
    """Entries and arrays of one Hugging Face flavour."""

    flavour: str

    def plane_entries(self, item: _PlaneItem) -> list[Entry]:
        raise NotImplementedError

    def plane_arrays(self, item: _PlaneItem, planes: NVFP4Planes) -> list[npt.NDArray[Any]]:
        raise NotImplementedError

    def config_files(
        self, src: _Source, plan: _Plan, algos: Mapping[str, str] | None
    ) -> dict[str, dict[str, Any]]:
        raise NotImplementedError


def _lead(item: _PlaneItem) -> tuple[int, ...]:
    return item.shape.shape[:-2]


def _refuse_partitions(item: _PlaneItem, flavour: str) -> None:
    if item.shape.partitions is not None:
        raise PlaneError(
            item.key,
            f"partitions (fused tensor) for {flavour}",
            "an unfused tensor (one per projection); call nvfp4.fusion.unfuse first",
            f"{item.shape.partitions} partitions",
        )


def _base_config(config: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(config))
    for key in ("quantization_config", "quantization", "nvfp4"):
        out.pop(key, None)
    return out


def _exclude_modules(plan: _Plan) -> list[str]:
    """Prefixes of 2-D non-quantized ``.weight`` tensors (embeddings, lm_head, routers)."""
    return sorted(
        {
            it.name[: -len(".weight")]
            for it in plan.items
            if isinstance(it, _TensorItem) and it.name.endswith(".weight") and len(it.shape) == 2
        },
        key=_natural,
    )


def _plane_items(plan: _Plan) -> list[_PlaneItem]:
    return [it for it in plan.items if isinstance(it, _PlaneItem)]


class _ModelOpt(_HFFormat):
    flavour = "modelopt"

    def plane_entries(self, item: _PlaneItem) -> list[Entry]:
        _refuse_partitions(item, "ModelOpt")
        lead, (n, k) = _lead(item), item.shape.shape[-2:]
        out: list[Entry] = [
            (f"{item.key}.weight", "U8", (*lead, n, k // 2)),
            (f"{item.key}.weight_scale", "F8_E4M3", (*lead, n, k // BLOCK_SIZE)),
            (f"{item.key}.weight_scale_2", "F32", lead),
        ]
        if item.input_scale is not None:
            out.append((f"{item.key}.input_scale", "F32", tuple(item.input_scale.shape)))
        return out

    def plane_arrays(self, item: _PlaneItem, planes: NVFP4Planes) -> list[npt.NDArray[Any]]:
        t = to_modelopt(planes)
        out = [t["weight"], t["weight_scale"], t["weight_scale_2"]]
        if item.input_scale is not None:
            out.append(item.input_scale)
        return out

    def config_files(
        self, src: _Source, plan: _Plan, algos: Mapping[str, str] | None
    ) -> dict[str, dict[str, Any]]:
        items = _plane_items(plan)
        per_layer = {
            it.key: (algos or {}).get(it.key)
            or ("NVFP4" if it.input_scale is not None else "W4A16_NVFP4")
            for it in items
        }
        distinct = set(per_layer.values())
        quant: dict[str, Any]
        if len(distinct) == 1:
            quant = {
                "quant_algo": distinct.pop(),
                "kv_cache_quant_algo": None,
                "group_size": BLOCK_SIZE,
                "exclude_modules": _exclude_modules(plan),
            }
        else:
            quant = {
                "quant_algo": "MIXED_PRECISION",
                "kv_cache_quant_algo": None,
                "quantized_layers": {
                    k: {"quant_algo": a, "group_size": BLOCK_SIZE} for k, a in per_layer.items()
                },
            }
        hf_quant = {"producer": dict(_PRODUCER), "quantization": quant}
        config = _base_config(src.config)
        config["quantization_config"] = modelopt_config_json(hf_quant)
        return {"config.json": config, "hf_quant_config.json": hf_quant}


def _modelopt_group(algo: str) -> dict[str, Any]:
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
        by_cfg: dict[tuple[Any, ...], list[str]] = {}
        for layer, cfg in q["quantized_layers"].items():
            by_cfg.setdefault(tuple(sorted(cfg.items())), []).append(layer)
        groups = {}
        for i, (cfg_key, layers) in enumerate(by_cfg.items()):
            g = _modelopt_group(str(dict(cfg_key).get("quant_algo", "")))
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


class _CompressedTensors(_HFFormat):
    flavour = "compressed-tensors"

    def plane_entries(self, item: _PlaneItem) -> list[Entry]:
        _refuse_partitions(item, "compressed-tensors")
        lead, (n, k) = _lead(item), item.shape.shape[-2:]
        out: list[Entry] = [
            (f"{item.key}.weight_packed", "U8", (*lead, n, k // 2)),
            (f"{item.key}.weight_scale", "F8_E4M3", (*lead, n, k // BLOCK_SIZE)),
            (f"{item.key}.weight_global_scale", "F32", lead or (1,)),
        ]
        if item.input_scale is not None:
            shape = tuple(item.input_scale.shape) or (1,)
            out.append((f"{item.key}.input_global_scale", "F32", shape))
        return out

    def plane_arrays(self, item: _PlaneItem, planes: NVFP4Planes) -> list[npt.NDArray[Any]]:
        t = to_compressed_tensors(planes)
        out = [t["weight_packed"], t["weight_scale"], t["weight_global_scale"]]
        if item.input_scale is not None:
            out.append(input_global_scale_from_input_scale(item.input_scale, item.key))
        return out

    def config_files(
        self, src: _Source, plan: _Plan, algos: Mapping[str, str] | None
    ) -> dict[str, dict[str, Any]]:
        items = _plane_items(plan)
        with_input = sorted((it.key for it in items if it.input_scale is not None), key=_natural)
        without = sorted((it.key for it in items if it.input_scale is None), key=_natural)
        groups: dict[str, Any] = {}
        if with_input and without:
            targets_a = [f"re:^{re.escape(k)}$" for k in with_input]
            targets_b = [f"re:^{re.escape(k)}$" for k in without]
            groups["group_0"] = ct_scheme(targets_a, activations=True)
            groups["group_1"] = ct_scheme(targets_b, activations=False)
        else:
            groups["group_0"] = ct_scheme(["Linear"], activations=bool(with_input))
        config = _base_config(src.config)
        config["quantization_config"] = {
            "config_groups": groups,
            "format": "nvfp4-pack-quantized",
            "global_compression_ratio": None,
            "ignore": _exclude_modules(plan),
            "kv_cache_scheme": None,
            "quant_method": "compressed-tensors",
            "quantization_status": "compressed",
            "producer": dict(_PRODUCER),
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


class _MLX(_HFFormat):
    flavour = "mlx"

    def plane_entries(self, item: _PlaneItem) -> list[Entry]:
        lead, (n, k) = _lead(item), item.shape.shape[-2:]
        parts = item.shape.partitions
        gshape = lead + ((parts,) if parts is not None else ())
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

    def plane_arrays(self, item: _PlaneItem, planes: NVFP4Planes) -> list[npt.NDArray[Any]]:
        m = to_mlx(planes)
        lead = _lead(item)
        parts = item.shape.partitions
        gshape = lead + ((parts,) if parts is not None else ())
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

    def config_files(
        self, src: _Source, plan: _Plan, algos: Mapping[str, str] | None
    ) -> dict[str, dict[str, Any]]:
        config = _base_config(src.config)
        config["quantization"] = {"group_size": BLOCK_SIZE, "bits": 4, "mode": "nvfp4"}
        config["nvfp4"] = {
            "spec_version": SPEC_VERSION,
            "format": "mlx-nvfp4",
            "global_scale": "global_scale",
            "input_scale": "input_scale",
            "partitions": "partitions",
            "producer": dict(_PRODUCER),
        }
        return {"config.json": config}


_HF_FORMATS: Final[Mapping[str, _HFFormat]] = {
    "modelopt": _ModelOpt(),
    "compressed-tensors": _CompressedTensors(),
    "mlx": _MLX(),
}


def _tensor_entry(item: _TensorItem) -> Entry:
    try:
        return (item.name, dtype_name(item.dtype), item.shape)
    except ValueError:
        raise CheckpointError(
            f"tensor {item.name!r}: dtype {item.dtype} has no safetensors type"
        ) from None


def _write_hf(
    dst_tmp: Path,
    fmt: _HFFormat,
    src: _Source,
    *,
    max_shard_bytes: int,
    progress: Progress | None,
    algos: Mapping[str, str] | None,
    extra_files: Sequence[Path],
) -> None:
    plan = _plan(src, stack=False)
    units: list[tuple[_PlaneItem | _TensorItem, list[Entry]]] = []
    for it in plan.items:
        entries = fmt.plane_entries(it) if isinstance(it, _PlaneItem) else [_tensor_entry(it)]
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
    configs = fmt.config_files(src, plan, algos)

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
                if isinstance(it, _PlaneItem):
                    arrays = fmt.plane_arrays(it, _fetch(src, it))
                else:
                    arrays = [src.tensor_of(it.name)]
                for (ename, _, _), arr in zip(its_entries, arrays, strict=True):
                    done_bytes += w.write(ename, arr)
                    weight_map[ename] = fname
                done_items += 1
                if progress:
                    progress(done_items, total_items, done_bytes, total_bytes)
                _slow()
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


# ============================================================================== GGUF
_GGUF_ARCH_ALIASES: Final = {"mistral": "llama", "mixtral": "llama"}
_GGUF_PLAIN_TYPES: Final = tuple(name for name, _ in PLAIN_TYPES.values())


def _gguf_arch(config: Mapping[str, Any]) -> str:
    gguf = import_gguf()
    model_type = str(config.get("model_type") or "")
    arch = _GGUF_ARCH_ALIASES.get(model_type, model_type.replace("_", ""))
    known = set(gguf.MODEL_ARCH_NAMES.values())
    return arch if arch in known else (arch or "unknown")


def _rope_theta(config: Mapping[str, Any]) -> float | None:
    if isinstance(config.get("rope_theta"), (int, float)):
        return float(config["rope_theta"])
    rp = config.get("rope_parameters")
    if isinstance(rp, dict) and isinstance(rp.get("rope_theta"), (int, float)):
        return float(rp["rope_theta"])
    return None


def _gguf_hparams(w: Any, config: Mapping[str, Any]) -> None:
    """Architecture hyper-parameters gguf-py / llama.cpp expect, where config.json has them."""

    def num(*keys: str) -> Any:
        for k in keys:
            v = config.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
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
    eps = num("rms_norm_eps")
    if eps is not None:
        w.add_layer_norm_rms_eps(float(eps))
    theta = _rope_theta(config)
    if theta is not None:
        w.add_rope_freq_base(theta)


def _write_gguf(dst_tmp: Path, src: _Source, *, progress: Progress | None) -> None:
    gguf = import_gguf()
    config = src.config
    arch = _gguf_arch(config)
    plan = _plan(src, stack=True)
    for it in _plane_items(plan):
        if it.shape.k % GGUF_SUPER_BLOCK:
            raise PlaneError(
                it.key,
                "K for GGUF NVFP4",
                f"a multiple of {GGUF_SUPER_BLOCK}",
                f"K = {it.shape.k}",
            )
    n_layers = int(config.get("num_hidden_layers") or 0)
    tmap = None
    arch_enum = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}.get(arch)
    if arch_enum is not None:
        tmap = gguf.get_tensor_name_map(arch_enum, n_layers)
    heads: dict[str, int] = {}
    if arch == "llama" and isinstance(config.get("num_attention_heads"), int):
        n_head = int(config["num_attention_heads"])
        heads = {"attn_q": n_head, "attn_k": int(config.get("num_key_value_heads") or n_head)}

    def gguf_name(hf: str, suffixes: tuple[str, ...]) -> str | None:
        return tmap.get_name(hf, try_suffixes=suffixes) if tmap is not None else None

    w = gguf.GGUFWriter(None, arch)
    w.add_name(str(config.get("_name_or_path") or config.get("model_type") or "nvfp4 model"))
    _gguf_hparams(w, config)
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_NVFP4))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_string(KV_SPEC, SPEC_VERSION)
    w.add_string(KV_HF_CONFIG, json.dumps(config, sort_keys=True))
    if src.tokenizer is not None:
        src.tokenizer_written = src.tokenizer(w)

    nvfp4_type = gguf.GGMLQuantizationType.NVFP4
    bf16_type = gguf.GGMLQuantizationType.BF16
    gguf_names: list[str] = []
    hf_names: list[str] = []
    hf_dtypes: list[str] = []
    # (item, [(gguf tensor name, producer index)], permute heads)
    work: list[tuple[_PlaneItem | _TensorItem, list[str], int | None, bool]] = []
    seen: set[str] = set()
    total_bytes = 0

    def claim(name: str, owner: str) -> None:
        if name in seen:
            raise CheckpointError(f"GGUF tensor name {name!r} (from {owner!r}) is used twice")
        seen.add(name)

    for item in plan.items:
        if isinstance(item, _PlaneItem):
            it = item
            hf = it.key.replace(".{}", "")
            mapped = gguf_name(hf + ".weight", (".weight",))
            base = mapped[: -len(".weight")] if mapped else hf
            perm = heads.get(base.rpartition(".")[2])
            lead, (n, k) = it.shape.shape[:-2], it.shape.shape[-2:]
            data_shape = (*lead, n, k // GGUF_SUPER_BLOCK * GGUF_BLOCK_BYTES)
            names = [f"{base}.weight", f"{base}.scale"]
            for nm in names:
                claim(nm, it.key)
            w.add_tensor_info(
                names[0], data_shape, np.dtype(np.uint8), math.prod(data_shape), nvfp4_type
            )
            scale_n = lead[0] if lead else 1
            w.add_tensor_info(names[1], (scale_n,), np.dtype(np.float32), 4 * scale_n)
            total_bytes += math.prod(data_shape) + 4 * scale_n
            if it.input_scale is not None:
                names.append(f"{base}.input_scale")
                claim(names[-1], it.key)
                w.add_tensor_info(names[-1], (scale_n,), np.dtype(np.float32), 4 * scale_n)
                total_bytes += 4 * scale_n
            gguf_names.append(base)
            hf_names.append(it.key)
            hf_dtypes.append("")
            work.append((it, names, perm, False))
        else:
            t_it = item
            st = dtype_name(t_it.dtype) if t_it.dtype in DTYPES.values() else str(t_it.dtype)
            if st not in _GGUF_PLAIN_TYPES:
                raise CheckpointError(
                    f"tensor {t_it.name!r}: dtype {st} has no GGUF type "
                    f"(GGUF holds {', '.join(_GGUF_PLAIN_TYPES)} besides NVFP4)"
                )
            gname = gguf_name(t_it.name, (".weight", ".bias")) or t_it.name
            claim(gname, t_it.name)
            widen = len(t_it.shape) <= 1 and st in ("BF16", "F16")
            perm = None
            if len(t_it.shape) == 2 and gname.endswith(".weight"):
                perm = heads.get(gname[: -len(".weight")].rpartition(".")[2])
            if widen:
                w.add_tensor_info(
                    gname, t_it.shape, np.dtype(np.float32), 4 * math.prod(t_it.shape)
                )
                nbytes = 4 * math.prod(t_it.shape)
            elif st == "BF16":
                nbytes = 2 * math.prod(t_it.shape)
                w.add_tensor_info(gname, t_it.shape, np.dtype(np.uint16), nbytes, bf16_type)
            else:
                nbytes = t_it.dtype.itemsize * math.prod(t_it.shape)
                w.add_tensor_info(gname, t_it.shape, t_it.dtype, nbytes)
            total_bytes += nbytes
            gguf_names.append(gname)
            hf_names.append(t_it.name)
            hf_dtypes.append(st)
            work.append((t_it, [gname], perm, widen))
    w.add_array(KV_GGUF_NAMES, gguf_names)
    w.add_array(KV_HF_NAMES, hf_names)
    w.add_array(KV_HF_DTYPES, hf_dtypes)
    w.add_bool(KV_ROPE_PERMUTED, bool(heads))

    w.write_header_to_file(path=dst_tmp)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    done_bytes = done_items = 0
    total_items = len(work)
    if progress:
        progress(0, total_items, 0, total_bytes)
    assert w.fout is not None
    assert len(w.fout) == 1
    fout = w.fout[0]
    # The tensor data is ours to write (gguf-py's write_tensor_data wants each tensor whole):
    # every tensor starts at a multiple of the alignment, in the order of the tensor infos,
    # which is the order of `work`. NVFP4 data is transcoded a chunk at a time into recycled
    # buffers while a second thread writes the previous chunk.
    try:
        with OverlappedWriter(fout) as out:
            out.align(w.data_alignment)
            for job, _names, perm, widen in work:
                arrays: list[npt.NDArray[Any]]
                if isinstance(job, _PlaneItem):
                    planes = _fetch(src, job)
                    if perm is not None:
                        planes = planes.replace(
                            codes=rope_permute_rows(planes.codes, perm),
                            scales=rope_permute_rows(planes.scales, perm),
                        )
                    scale = gguf_global(planes)
                    for chunk in iter_gguf_data(planes, buffer=out.buffer):
                        out.write(chunk, recycle=True)
                        done_bytes += int(chunk.nbytes)
                    out.align(w.data_alignment)
                    arrays = [scale]
                    if job.input_scale is not None:
                        arrays.append(np.asarray(job.input_scale, dtype=np.float32).reshape(-1))
                else:
                    a = np.asarray(src.tensor_of(job.name))
                    if perm is not None:
                        a = rope_permute_rows(a, perm)
                    if widen:
                        a = a.astype(np.float32)
                    elif a.dtype == DTYPES["BF16"]:
                        a = a.view(np.uint16)
                    arrays = [a]
                for arr in arrays:
                    out.write(np.ascontiguousarray(arr))
                    out.align(w.data_alignment)
                    done_bytes += int(arr.nbytes)
                done_items += 1
                if progress:
                    progress(done_items, total_items, done_bytes, total_bytes)
                _slow()
        fout.flush()
        os.fsync(fout.fileno())
    finally:
        w.close()


# ======================================================================== public API
def _algos_of(src: Checkpoint) -> dict[str, str] | None:
    if isinstance(src, ModelOptCheckpoint):
        return {
            p: src.algo(p) for p in src.quantized_names() if src.algo(p) in MODELOPT_NVFP4_ALGOS
        }
    return None


def _extra_files(src: Checkpoint) -> list[Path]:
    if not src.path.is_dir():
        return []
    return sorted(
        p
        for p in src.path.iterdir()
        if p.is_file()
        and p.name not in _HF_CONFIG_FILES
        and not p.name.endswith(".safetensors")
        and not p.name.startswith(".")
    )


def _write(
    dst: str | os.PathLike[str],
    to: str,
    src: _Source,
    *,
    force: bool,
    progress: Progress | None,
    max_shard_bytes: int,
    algos: Mapping[str, str] | None = None,
    extra_files: Sequence[Path] = (),
) -> Path:
    if to not in FLAVOURS:
        raise CheckpointError(f"unknown output flavour {to!r} (one of {', '.join(FLAVOURS)})")
    if max_shard_bytes <= 0:
        raise CheckpointError(f"max_shard_bytes must be positive, found {max_shard_bytes}")
    target = Path(dst)
    with atomic_output(target, force=force) as tmp:
        if to == "gguf":
            _write_gguf(tmp, src, progress=progress)
        else:
            _write_hf(
                tmp,
                _HF_FORMATS[to],
                src,
                max_shard_bytes=max_shard_bytes,
                progress=progress,
                algos=algos,
                extra_files=extra_files,
            )
    return target


def write_checkpoint(
    dst: str | os.PathLike[str],
    src: Checkpoint,
    to: str,
    *,
    force: bool = False,
    progress: Progress | None = None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> Path:
    """Convert ``src`` to flavour ``to`` (``"modelopt"``, ``"compressed-tensors"``,
    ``"mlx"`` or ``"gguf"``) at ``dst``: streaming, tensor by tensor, atomic.

    Quantized tensors are transcoded losslessly (the compressed-tensors global within the
    one ulp of a float32 reciprocal); other tensors are copied as they are (GGUF widens
    1-D bf16/f16 to F32 and records the original dtype). ModelOpt sources keep their
    per-layer ``quant_algo``. ``progress(tensors_done, tensors_total, bytes_done,
    bytes_total)`` is called after each tensor. Raises
    :class:`~nvfp4_checkpoints.CheckpointError` when ``dst`` exists and ``force`` is false,
    and :class:`~nvfp4.PlaneError` for planes the target cannot hold (K % 64 for GGUF,
    fused partitions for ModelOpt / compressed-tensors), before writing anything.

    A GGUF gets the tokenizer of the source directory's ``tokenizer.json``
    (:mod:`nvfp4_checkpoints.gguf_vocab`), or the ``tokenizer.*`` keys of a GGUF source;
    when the source has none, a one-line note is logged (``nvfp4_checkpoints.writers``).
    """
    source = _checkpoint_source(src)
    if to == "gguf":
        source.tokenizer = _tokenizer_of(src)
    out = _write(
        dst,
        to,
        source,
        force=force,
        progress=progress,
        max_shard_bytes=max_shard_bytes,
        algos=_algos_of(src),
        extra_files=_extra_files(src) if to != "gguf" else (),
    )
    if to == "gguf" and source.tokenizer is None:
        logger.warning(
            "nvfp4: note: %s has no Hugging Face tokenizer (%s): the GGUF has no tokenizer "
            "metadata, which llama.cpp needs to load it",
            src.path,
            TOKENIZER_FILE,
        )
    elif to == "gguf" and isinstance(src, GGUFCheckpoint) and not source.tokenizer_written:
        logger.warning(
            "nvfp4: note: %s has no tokenizer metadata: neither has the GGUF written", src.path
        )
    return out


def _tokenizer_of(src: Checkpoint) -> TokenizerWriter | None:
    """How to give a GGUF written from ``src`` its tokenizer, or ``None`` (no source)."""
    if isinstance(src, GGUFCheckpoint):
        return lambda w: bool(copy_gguf_tokenizer(src.file, w))
    if has_hf_tokenizer(src.path):
        return lambda w: add_hf_tokenizer(w, src.path, src.config) is not None
    return None


def _from_mappings(
    to: str,
    dst: str | os.PathLike[str],
    planes: Mapping[str, NVFP4Planes],
    tensors: Mapping[str, npt.ArrayLike],
    config: Mapping[str, Any],
    input_scales: Mapping[str, float] | None,
    force: bool,
    max_shard_bytes: int,
    progress: Progress | None,
) -> Path:
    src = _mapping_source(planes, tensors, config, input_scales)
    return _write(dst, to, src, force=force, progress=progress, max_shard_bytes=max_shard_bytes)


def write_modelopt(
    dst: str | os.PathLike[str],
    planes: Mapping[str, NVFP4Planes],
    tensors: Mapping[str, npt.ArrayLike],
    config: Mapping[str, Any],
    *,
    input_scales: Mapping[str, float] | None = None,
    force: bool = False,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    progress: Progress | None = None,
) -> Path:
    """Write a ModelOpt HF checkpoint directory: ``config.json`` (``config`` plus ModelOpt's
    ``quantization_config``), ``hf_quant_config.json`` (``NVFP4`` when every layer has an
    input scale, ``W4A16_NVFP4`` when none has, else ``MIXED_PRECISION``) and the
    safetensors: ``<prefix>.weight`` U8, ``.weight_scale`` F8_E4M3, ``.weight_scale_2`` F32
    scalar, ``.input_scale`` F32 scalar (DECODE, from ``input_scales``), other tensors as
    they are. Sharded with an index above ``max_shard_bytes``. Atomic."""
    return _from_mappings(
        "modelopt", dst, planes, tensors, config, input_scales, force, max_shard_bytes, progress
    )


def write_compressed_tensors(
    dst: str | os.PathLike[str],
    planes: Mapping[str, NVFP4Planes],
    tensors: Mapping[str, npt.ArrayLike],
    config: Mapping[str, Any],
    *,
    input_scales: Mapping[str, float] | None = None,
    force: bool = False,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    progress: Progress | None = None,
) -> Path:
    """Write a compressed-tensors ``nvfp4-pack-quantized`` checkpoint directory:
    ``<prefix>.weight_packed`` U8, ``.weight_scale`` F8_E4M3, ``.weight_global_scale`` F32
    ``[1]`` (ENCODE = 1/decode), ``.input_global_scale`` F32 ``[1]`` (ENCODE, from the
    DECODE ``input_scales``), and a ``quantization_config`` with the NVFP4 / NVFP4A16
    schemes. Atomic."""
    return _from_mappings(
        "compressed-tensors",
        dst,
        planes,
        tensors,
        config,
        input_scales,
        force,
        max_shard_bytes,
        progress,
    )


def write_mlx(
    dst: str | os.PathLike[str],
    planes: Mapping[str, NVFP4Planes],
    tensors: Mapping[str, npt.ArrayLike],
    config: Mapping[str, Any],
    *,
    input_scales: Mapping[str, float] | None = None,
    force: bool = False,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    progress: Progress | None = None,
) -> Path:
    """Write the MLX-native directory described in the module docstring. Atomic."""
    return _from_mappings(
        "mlx", dst, planes, tensors, config, input_scales, force, max_shard_bytes, progress
    )


def write_gguf(
    dst: str | os.PathLike[str],
    planes: Mapping[str, NVFP4Planes],
    tensors: Mapping[str, npt.ArrayLike],
    config: Mapping[str, Any],
    *,
    input_scales: Mapping[str, float] | None = None,
    force: bool = False,
    progress: Progress | None = None,
    tokenizer: str | os.PathLike[str] | None = None,
) -> Path:
    """Write a GGUF file (see the module docstring). ``tokenizer``: a Hugging Face
    directory with a ``tokenizer.json`` whose tokenizer the GGUF gets
    (:mod:`nvfp4_checkpoints.gguf_vocab`; ``config["vocab_size"]`` tokens). K % 64 != 0 is
    refused with a :class:`~nvfp4.PlaneError` before anything is written. Atomic."""
    src = _mapping_source(planes, tensors, config, input_scales)
    if tokenizer is not None:
        tok_dir = Path(tokenizer)
        if not has_hf_tokenizer(tok_dir):
            raise CheckpointError(f"{tok_dir}: no {TOKENIZER_FILE} (a Hugging Face tokenizer)")
        src.tokenizer = lambda w: add_hf_tokenizer(w, tok_dir, config) is not None
    return _write(
        dst, "gguf", src, force=force, progress=progress, max_shard_bytes=DEFAULT_MAX_SHARD_BYTES
    )
