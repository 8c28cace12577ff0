"""Read NVFP4 checkpoints lazily: one :class:`Checkpoint` interface over every flavour.

:func:`open_checkpoint` detects the flavour (:mod:`.flavours`) and returns a reader whose
tensors are memory-mapped and handed out one at a time, so a checkpoint of any size is read
with the memory of the tensor in use. Every reader speaks the canonical language:

* :meth:`Checkpoint.quantized_names`: the NVFP4 linear layers, by module prefix
  (``"model.layers.0.self_attn.q_proj"``), one tensor per prefix as the checkpoint stores
  it (a GGUF's merged experts are presented per expert, under their Hugging Face names when
  the file records them);
* :meth:`Checkpoint.planes`: the canonical :class:`~nvfp4.NVFP4Planes` of a prefix, built by
  the lossless transcoders of :mod:`nvfp4.layouts` and validated with ``content=True``;
* :meth:`Checkpoint.input_scale`: the activations' static global in the DECODE convention
  (ModelOpt's ``input_scale``) whatever the flavour, or ``None``;
* :meth:`Checkpoint.tensor_names` / :meth:`Checkpoint.tensor`: every other tensor as it is
  stored (bf16 as ``ml_dtypes.bfloat16``);
* :meth:`Checkpoint.expert_groups` and :meth:`Checkpoint.fused_groups`: MoE experts that stack
  (:func:`nvfp4.fusion.stack_experts`) and q/k/v, gate/up groups, detected from the names.

A Hugging Face checkpoint is a directory of ``*.safetensors`` files, single or sharded with
``model.safetensors.index.json``.
"""

from __future__ import annotations

import json
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import ml_dtypes
import numpy as np
import numpy.typing as npt
from nvfp4.layouts import (
    MLXPlanes,
    from_compressed_tensors,
    from_gguf,
    from_mlx,
    from_modelopt,
    input_scale_from_input_global_scale,
)
from nvfp4.planes import NVFP4Planes, PlaneError, validate
from nvfp4.spec import BLOCK_SIZE, GGUF_TYPE_NVFP4

from .flavours import (
    MODELOPT_NVFP4_ALGOS,
    CheckpointError,
    Flavour,
    detect_flavour,
    read_json,
)
from .gguf_file import GGML_BF16, PLAIN_TYPES, GGUFFile, ggml_type_name
from .safetensors_io import DTYPES, SafetensorsError, SafetensorsFile, TensorInfo

__all__ = ["Checkpoint", "PlaneShape", "open_checkpoint"]

INDEX_FILE: Final = "model.safetensors.index.json"
_EXPERT_RE: Final = re.compile(r"^(?P<head>.*\.experts)\.(?P<idx>\d+)\.(?P<tail>.+)$")
#: Fused groups: (member leaf names in order, the fused leaf name).
FUSED_PATTERNS: Final = (
    (("q_proj", "k_proj", "v_proj"), "qkv_proj"),
    (("gate_proj", "up_proj"), "gate_up_proj"),
    (("w1", "w3"), "w13"),
)


@dataclass(frozen=True)
class PlaneShape:
    """Shape facts of a quantized tensor, read from headers only.

    ``shape`` is the logical ``(E?, N, K)``; ``partitions`` the number of fused partitions
    (``None`` when unfused)."""

    shape: tuple[int, ...]
    partitions: int | None = None

    @property
    def num_experts(self) -> int | None:
        return self.shape[0] if len(self.shape) == 3 else None

    @property
    def n(self) -> int:
        return self.shape[-2]

    @property
    def k(self) -> int:
        return self.shape[-1]

    @property
    def nbytes(self) -> int:
        """Bytes of the canonical codes and scales."""
        rows = int(np.prod(self.shape[:-1]))
        return rows * (self.k // 2 + self.k // BLOCK_SIZE)


def group_experts(
    names: Sequence[str], shape_of: Callable[[str], PlaneShape]
) -> dict[str, list[str]]:
    """Group ``<head>.experts.<i>.<tail>`` prefixes by ``<head>.experts.{}.<tail>``, in
    expert order; only complete runs ``0..E-1`` of equally shaped 2-D tensors."""
    found: dict[str, dict[int, str]] = {}
    for name in names:
        m = _EXPERT_RE.match(name)
        if m:
            key = f"{m['head']}.{{}}.{m['tail']}"
            found.setdefault(key, {})[int(m["idx"])] = name
    groups: dict[str, list[str]] = {}
    for key, by_idx in found.items():
        if sorted(by_idx) != list(range(len(by_idx))):
            continue
        members = [by_idx[i] for i in range(len(by_idx))]
        shapes = {(shape_of(m).shape, shape_of(m).partitions) for m in members}
        if len(shapes) == 1 and len(next(iter(shapes))[0]) == 2:
            groups[key] = members
    return groups


class Checkpoint(ABC):
    """An opened NVFP4 checkpoint (see the module docstring). Use :func:`open_checkpoint`;
    close it (or use it as a context manager) when done."""

    flavour: Flavour
    path: Path
    config: dict[str, Any]
    quant_config: dict[str, Any]

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:  # noqa: B027 - optional hook, most readers hold nothing
        """Release the reader (arrays already handed out stay valid)."""

    # --------------------------------------------------------------- quantized tensors
    @abstractmethod
    def quantized_names(self) -> list[str]:
        """Module prefixes of the NVFP4 tensors, in file order."""

    @abstractmethod
    def planes(self, prefix: str) -> NVFP4Planes:
        """Canonical planes of ``prefix`` (named ``prefix``), validated with content."""

    @abstractmethod
    def input_scale(self, prefix: str) -> float | None:
        """The activations' static DECODE global of ``prefix`` (ModelOpt ``input_scale``),
        or ``None`` when the checkpoint has none."""

    @abstractmethod
    def plane_shape(self, prefix: str) -> PlaneShape:
        """Shape of ``prefix``'s planes from the headers alone (no data read)."""

    # ----------------------------------------------------------------- other tensors
    @abstractmethod
    def tensor_names(self) -> list[str]:
        """Names of the non-quantized tensors, in file order."""

    @abstractmethod
    def tensor(self, name: str) -> npt.NDArray[Any]:
        """A non-quantized tensor as stored (memory-mapped where possible)."""

    @abstractmethod
    def tensor_info(self, name: str) -> tuple[np.dtype[Any], tuple[int, ...]]:
        """``(dtype, shape)`` of a non-quantized tensor from the headers alone."""

    # ---------------------------------------------------------------------- groups
    def expert_groups(self) -> dict[str, list[str]]:
        """MoE experts that stack: ``"<...>.experts.{}.<proj>"`` -> the per-expert prefixes
        in expert order (0, 1, ..., E-1; only complete runs of equally shaped experts)."""
        return group_experts(self.quantized_names(), self.plane_shape)

    def fused_groups(self) -> dict[str, list[str]]:
        """Projections that engines fuse: ``"<parent>.qkv_proj"`` -> ``[q, k, v]`` prefixes,
        ``"<parent>.gate_up_proj"`` -> ``[gate, up]`` (``"<parent>.w13"`` for Mixtral's
        w1/w3), when every member is quantized."""
        names = set(self.quantized_names())
        parents: dict[str, None] = {}
        for name in self.quantized_names():
            parents.setdefault(name.rpartition(".")[0], None)
        groups: dict[str, list[str]] = {}
        for parent in parents:
            for leaves, fused in FUSED_PATTERNS:
                members = [f"{parent}.{leaf}" for leaf in leaves]
                if all(m in names for m in members):
                    groups[f"{parent}.{fused}"] = members
        return groups

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.flavour} {self.path}: "
            f"{len(self.quantized_names())} NVFP4 tensors, {len(self.tensor_names())} others>"
        )


# =========================================================================== HF dirs
class _SafetensorsStore:
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


def _scalar(a: npt.NDArray[Any], name: str) -> float:
    if a.size != 1:
        raise PlaneError(name, "input scale", "one value (shape () or (1,))", tuple(a.shape))
    return float(np.asarray(a, dtype=np.float32).reshape(()))


class _HFCheckpoint(Checkpoint):
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
        self.store = _SafetensorsStore(path)
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


class ModelOptCheckpoint(_HFCheckpoint):
    """A ModelOpt HF export: ``weight`` U8, ``weight_scale`` F8_E4M3, ``weight_scale_2``
    F32, ``input_scale`` F32 per quantized prefix. With ``MIXED_PRECISION`` only the
    layers whose ``quant_algo`` is an NVFP4 algorithm count as NVFP4 (the others' tensors
    are passed through as non-quantized tensors)."""

    CODES = "weight"
    SCALES = "weight_scale"
    OWNED = ("weight", "weight_scale", "weight_scale_2", "input_scale")

    def __init__(self, path: Path) -> None:
        hq = path / "hf_quant_config.json"
        cfg = read_json(path / "config.json") if (path / "config.json").is_file() else {}
        if hq.is_file():
            self.quant_config = read_json(hq)
            q = self.quant_config.get("quantization", {})
        else:
            qc = cfg.get("quantization_config", {})
            self.quant_config = {"quantization": qc} if isinstance(qc, dict) else {}
            q = qc if isinstance(qc, dict) else {}
        self.quant_algo = str(q.get("quant_algo") or "")
        layers = q.get("quantized_layers") or {}
        self.layer_algos: dict[str, str] = {
            str(k): str(v.get("quant_algo", "")) for k, v in layers.items() if isinstance(v, dict)
        }
        super().__init__(path, "modelopt")

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

    def planes(self, prefix: str) -> NVFP4Planes:
        return from_modelopt(self._parts(prefix), name=prefix)

    def input_scale(self, prefix: str) -> float | None:
        self._check_prefix(prefix)
        name = f"{prefix}.input_scale"
        return _scalar(self.store.get(name), name) if name in self.store else None


class CompressedTensorsCheckpoint(_HFCheckpoint):
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

    def __init__(self, path: Path) -> None:
        cfg = read_json(path / "config.json")
        qc = cfg.get("quantization_config")
        self.quant_config = qc if isinstance(qc, dict) else {}
        super().__init__(path, "compressed-tensors")

    def planes(self, prefix: str) -> NVFP4Planes:
        return from_compressed_tensors(self._parts(prefix), name=prefix)

    def input_scale(self, prefix: str) -> float | None:
        self._check_prefix(prefix)
        name = f"{prefix}.input_global_scale"
        if name not in self.store:
            return None
        return _scalar(input_scale_from_input_global_scale(self.store.get(name), name), name)


class MLXCheckpoint(_HFCheckpoint):
    """Our MLX-native directory (see :mod:`nvfp4_checkpoints.writers`): ``weight`` uint32
    ``[E?, N, K/8]``, ``scales`` uint8, sidecars ``global_scale`` (DECODE), optionally
    ``input_scale`` (DECODE) and ``partitions`` (int64 row boundaries of fused planes).
    An ``mlx_lm`` nvfp4 model (no sidecar) reads with a global of 1.0, which is how MLX
    decodes it."""

    CODES = "weight"
    SCALES = "scales"
    OWNED = ("weight", "scales", "global_scale", "input_scale", "partitions")

    def __init__(self, path: Path) -> None:
        cfg = read_json(path / "config.json")
        self.quant_config = {
            "quantization": cfg.get("quantization", {}),
            "nvfp4": cfg.get("nvfp4", {}),
        }
        super().__init__(path, "mlx")

    def _looks_nvfp4(self, prefix: str) -> bool:
        codes = self.store.info(f"{prefix}.weight")
        scales = self.store.info(f"{prefix}.scales")
        return (
            codes.dtype == "U32"
            and scales.dtype == "U8"
            and len(codes.shape) in (2, 3)
            and f"{prefix}.biases" not in self.store  # affine modes carry biases
        )

    def _k_of(self, codes: TensorInfo) -> int:
        return codes.shape[-1] * 8

    def plane_shape(self, prefix: str) -> PlaneShape:
        base = super().plane_shape(prefix)
        parts = f"{prefix}.partitions"
        if parts in self.store:
            return PlaneShape(base.shape, self.store.info(parts).shape[0] - 1)
        return base

    def planes(self, prefix: str) -> NVFP4Planes:
        parts = self._parts(prefix)
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

    def input_scale(self, prefix: str) -> float | None:
        self._check_prefix(prefix)
        name = f"{prefix}.input_scale"
        return _scalar(self.store.get(name), name) if name in self.store else None


# ============================================================================= GGUF
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


@dataclass
class _GGUFEntry:
    gguf_base: str  # "blk.0.attn_q" (without ".weight")
    hf_key: str  # HF prefix, or "...experts.{}.proj" for merged experts
    index: int | None  # expert index within a merged tensor
    permute_heads: int | None  # RoPE permutation to undo (number of heads)


class GGUFCheckpoint(Checkpoint):
    """A GGUF file: ``NVFP4`` (type 40) tensors ``<base>.weight`` with their ``<base>.scale``
    (DECODE global, ``[1]`` or ``[E]``; absent means 1.0) and optional ``<base>.input_scale``.

    Names: when the file carries this package's ``nvfp4.gguf_names`` / ``nvfp4.hf_names``
    map, tensors are presented under their Hugging Face names and merged experts per
    expert; otherwise under their GGUF names (``blk.0.attn_q``). For the ``llama``
    architecture the q/k rows are un-permuted (llama.cpp permutes them for its RoPE)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.flavour = "gguf"
        self.file = GGUFFile(path)
        fields = self.file.fields
        kv: dict[str, Any] = {}
        for key in (KV_SPEC, KV_HF_CONFIG, KV_GGUF_NAMES, KV_HF_NAMES, KV_HF_DTYPES):
            if key in fields:
                kv[key] = fields[key].value()
        self.arch = str(self.file.value("general.architecture", ""))
        try:
            self.config = json.loads(kv[KV_HF_CONFIG]) if KV_HF_CONFIG in kv else {}
        except (json.JSONDecodeError, TypeError) as e:
            raise CheckpointError(f"{path}: {KV_HF_CONFIG} is not a JSON object ({e})") from None
        self.quant_config = {
            "nvfp4": {k.removeprefix("nvfp4."): v for k, v in kv.items() if k != KV_HF_CONFIG},
            "general.architecture": self.arch,
        }
        self.tensors = self.file.tensors
        names_map: dict[str, str] = {}
        if KV_GGUF_NAMES in kv and KV_HF_NAMES in kv:
            names_map = dict(zip(kv[KV_GGUF_NAMES], kv[KV_HF_NAMES], strict=False))
        self._hf_dtypes: dict[str, str] = {}
        if KV_HF_DTYPES in kv and KV_HF_NAMES in kv:
            self._hf_dtypes = dict(zip(kv[KV_HF_NAMES], kv[KV_HF_DTYPES], strict=False))
        heads = self._heads()
        self._q: dict[str, _GGUFEntry] = {}
        owned: set[str] = set()
        for t in self.tensors.values():
            if t.ggml_type != GGUF_TYPE_NVFP4:
                continue
            if not t.name.endswith(".weight"):
                raise CheckpointError(f"{path}: NVFP4 tensor {t.name!r} is not named <x>.weight")
            base = t.name[: -len(".weight")]
            owned.update({t.name, f"{base}.scale", f"{base}.input_scale"})
            hf = names_map.get(base, base)
            perm = heads.get(base.rpartition(".")[2]) if self.arch == "llama" else None
            if len(t.shape) == 3:
                experts = t.shape[0]
                fmt = hf if "{}" in hf else f"{hf}.{{}}"
                for i in range(experts):
                    self._q[fmt.format(i)] = _GGUFEntry(base, hf, i, perm)
            else:
                self._q[hf] = _GGUFEntry(base, hf, None, perm)
        self._plain: dict[str, tuple[str, int | None]] = {}
        for t in self.tensors.values():
            if t.name in owned:
                continue
            stem = t.name[: -len(".weight")] if t.name.endswith(".weight") else ""
            hf_name = names_map.get(t.name, t.name)
            perm = (
                heads.get(stem.rpartition(".")[2])
                if (stem and self.arch == "llama" and len(t.shape) == 2)
                else None
            )
            self._plain[hf_name] = (t.name, perm)

    def _heads(self) -> dict[str, int]:
        key_h, key_kv = f"{self.arch}.attention.head_count", f"{self.arch}.attention.head_count_kv"
        n_head = self.file.value(key_h)
        if not isinstance(n_head, int) or n_head <= 0:
            return {}
        n_kv = self.file.value(key_kv, n_head)
        if not isinstance(n_kv, int) or n_kv <= 0:
            raise CheckpointError(
                f"{self.path}: {key_kv} must be a positive integer, found {n_kv!r}"
            )
        return {"attn_q": n_head, "attn_k": n_kv}

    def quantized_names(self) -> list[str]:
        return list(self._q)

    def _entry(self, prefix: str) -> _GGUFEntry:
        try:
            return self._q[prefix]
        except KeyError:
            raise CheckpointError(f"{self.path}: {prefix!r} is not an NVFP4 tensor") from None

    def _side(self, base: str, suffix: str, index: int | None) -> npt.NDArray[Any] | None:
        t = self.tensors.get(f"{base}.{suffix}")
        if t is None:
            return None
        a = self.file.array(t)
        if index is not None and a.size > 1:
            return a.reshape(-1)[index : index + 1]
        return a

    def plane_shape(self, prefix: str) -> PlaneShape:
        entry = self._entry(prefix)
        n, k = self.tensors[f"{entry.gguf_base}.weight"].shape[-2:]
        return PlaneShape((n, k))

    def planes(self, prefix: str) -> NVFP4Planes:
        entry = self._entry(prefix)
        data = self.file.array(self.tensors[f"{entry.gguf_base}.weight"])
        if entry.index is not None:
            data = data[entry.index]
        scale = self._side(entry.gguf_base, "scale", entry.index)
        planes = from_gguf(data, scale, name=prefix)
        if entry.permute_heads is not None:
            planes = planes.replace(
                codes=rope_permute_rows(planes.codes, entry.permute_heads, inverse=True),
                scales=rope_permute_rows(planes.scales, entry.permute_heads, inverse=True),
            )
            validate(planes, content=True)
        return planes

    def input_scale(self, prefix: str) -> float | None:
        entry = self._entry(prefix)
        a = self._side(entry.gguf_base, "input_scale", entry.index)
        return None if a is None else _scalar(a, f"{entry.gguf_base}.input_scale")

    def tensor_names(self) -> list[str]:
        return list(self._plain)

    def _plain_entry(self, name: str) -> tuple[str, int | None]:
        try:
            return self._plain[name]
        except KeyError:
            raise CheckpointError(f"{self.path}: no non-quantized tensor {name!r}") from None

    def tensor(self, name: str) -> npt.NDArray[Any]:
        gname, perm = self._plain_entry(name)
        t = self.tensors[gname]
        if t.ggml_type not in PLAIN_TYPES:
            raise CheckpointError(
                f"{self.path}: tensor {gname!r} has GGUF type {ggml_type_name(t.ggml_type)}, "
                "which this reader does not decode"
            )
        a: npt.NDArray[Any] = self.file.array(t)
        if t.ggml_type == GGML_BF16:
            a = a.view(ml_dtypes.bfloat16)
        if perm is not None:
            a = rope_permute_rows(a, perm, inverse=True)
        want = self._hf_dtypes.get(name)
        if want and want in DTYPES and DTYPES[want] != a.dtype:
            a = a.astype(DTYPES[want])
        return a

    def tensor_info(self, name: str) -> tuple[np.dtype[Any], tuple[int, ...]]:
        gname, _ = self._plain_entry(name)
        t = self.tensors[gname]
        want = self._hf_dtypes.get(name)
        if want and want in DTYPES:
            return DTYPES[want], t.shape
        if t.ggml_type == GGML_BF16:
            return np.dtype(ml_dtypes.bfloat16), t.shape
        return self.file.array(t).dtype, t.shape

    def close(self) -> None:
        self.tensors = {}
        self.file.close()


# ========================================================================= entry point
_READERS: Final[Mapping[str, type[Checkpoint]]] = {
    "modelopt": ModelOptCheckpoint,
    "compressed-tensors": CompressedTensorsCheckpoint,
    "mlx": MLXCheckpoint,
    "gguf": GGUFCheckpoint,
}


def open_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Open the NVFP4 checkpoint at ``path`` (a Hugging Face directory or a GGUF file),
    detecting its flavour. Reads headers and configs only.

    Raises :class:`~nvfp4_checkpoints.CheckpointError` for a missing path, an unknown
    flavour, an unreadable or lying file header, or an index naming missing shards.
    """
    p = Path(path)
    flavour = detect_flavour(p)
    reader: Any = _READERS[flavour]
    ckpt: Checkpoint = reader(p)
    return ckpt
