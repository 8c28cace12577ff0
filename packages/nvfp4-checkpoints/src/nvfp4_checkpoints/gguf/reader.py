"""Reading a GGUF file as a :class:`~nvfp4_checkpoints.Checkpoint`: :class:`GGUFCheckpoint`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt
from nvfp4.layouts import from_gguf
from nvfp4.planes import NVFP4Planes, validate
from nvfp4.spec import GGUF_TYPE_NVFP4

from ..checkpoint import Checkpoint, PlaneShape, scalar
from ..flavours import CheckpointError
from ..safetensors_io import DTYPES
from .file import GGML_BF16, PLAIN_TYPES, GGUFFile, ggml_type_name
from .metadata import (
    KV_GGUF_NAMES,
    KV_HF_CONFIG,
    KV_HF_DTYPES,
    KV_HF_NAMES,
    KV_SPEC,
    rope_permute_rows,
)

__all__ = ["GGUFCheckpoint"]


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
        return None if a is None else scalar(a, f"{entry.gguf_base}.input_scale")

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
