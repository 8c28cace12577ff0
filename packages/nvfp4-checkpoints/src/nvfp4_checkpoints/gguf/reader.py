"""Reading a GGUF file as a :class:`~nvfp4_checkpoints.Checkpoint`: :class:`GGUFCheckpoint`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import ml_dtypes
import numpy as np
import numpy.typing as npt
from nvfp4.layouts import from_gguf
from nvfp4.planes import NVFP4Planes, validate
from nvfp4.spec import GGUF_TYPE_NVFP4

from ..checkpoint import Checkpoint, PlaneShape, scalar
from ..flavours import CheckpointError
from ..folder import parse_json, short
from ..safetensors_io import DTYPES
from .file import GGML_BF16, PLAIN_TYPES, GGUFFile, GGUFTensorInfo, ggml_type_name
from .metadata import (
    KV_GGUF_NAMES,
    KV_HF_CONFIG,
    KV_HF_DTYPES,
    KV_HF_NAMES,
    KV_SPEC,
    rope_permute_rows,
)

__all__ = ["GGUFCheckpoint"]

_UINT32_MAX = 2**32 - 1
#: The GGUF tensors that hold one row per vocabulary entry and one column per hidden unit.
_VOCAB_ROWS = ("token_embd.weight", "output.weight")
#: The plain GGUF types that hold real numbers: an embedding is stored in one of them.
_FLOAT_TYPES = ("F32", "F16", "BF16", "F64")


@dataclass
class _GGUFEntry:
    gguf_base: str  # "blk.0.attn_q" (without ".weight")
    hf_key: str  # HF prefix, or "...experts.{}.proj" for merged experts
    index: int | None  # expert index within a merged tensor
    permute_heads: int | None  # RoPE permutation to undo (number of heads)
    stacked: bool = False  # an [E, N, K] tensor presented whole (not per expert)


class GGUFCheckpoint(Checkpoint):
    """A GGUF file: ``NVFP4`` (type 40) tensors ``<base>.weight`` with their ``<base>.scale``
    (DECODE global, ``[1]`` or ``[E]``; absent means 1.0, as llama.cpp's converter writes it,
    except in a file recording ``nvfp4.spec_version``, whose writer writes every global) and
    optional ``<base>.input_scale``.

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
        arch = self.file.value("general.architecture", "")
        if not isinstance(arch, str):
            self._bad("general.architecture", "a string", arch)
        self.arch = arch
        self.config = {}
        if KV_HF_CONFIG in kv:
            if not isinstance(kv[KV_HF_CONFIG], str):
                self._bad(KV_HF_CONFIG, "a JSON string", kv[KV_HF_CONFIG])
            config = parse_json(kv[KV_HF_CONFIG].encode("utf-8"), f"{path}: {KV_HF_CONFIG}")
            if not isinstance(config, dict):
                self._bad(KV_HF_CONFIG, "a JSON object", config)
            self.config = config
        self.quant_config = {
            "nvfp4": {k.removeprefix("nvfp4."): v for k, v in kv.items() if k != KV_HF_CONFIG},
            "general.architecture": self.arch,
        }
        self.tensors = self.file.tensors
        gguf_names = self._names(kv, KV_GGUF_NAMES)
        hf_names = self._names(kv, KV_HF_NAMES)
        hf_dtypes = self._names(kv, KV_HF_DTYPES, unique=False)
        names_map: dict[str, str] = {}
        self._hf_dtypes: dict[str, str] = {}
        if gguf_names is not None and hf_names is not None:
            if len(gguf_names) != len(hf_names):
                self._bad(KV_HF_NAMES, f"{len(gguf_names)} names (as {KV_GGUF_NAMES})", hf_names)
            names_map = dict(zip(gguf_names, hf_names, strict=True))
            if hf_dtypes is not None:
                if len(hf_dtypes) != len(hf_names):
                    self._bad(KV_HF_DTYPES, f"{len(hf_names)} dtypes", hf_dtypes)
                for name, dt in zip(hf_names, hf_dtypes, strict=True):
                    if dt and dt not in DTYPES:
                        self._bad(KV_HF_DTYPES, "safetensors dtype names", dt)
                    self._hf_dtypes[name] = dt
        heads = self._heads()
        self._q: dict[str, _GGUFEntry] = {}
        owned: set[str] = set()
        for t in self.tensors.values():
            if t.ggml_type != GGUF_TYPE_NVFP4:
                continue
            if not t.name.endswith(".weight"):
                raise CheckpointError(f"{path}: NVFP4 tensor {t.name!r} is not named <x>.weight")
            base = t.name[: -len(".weight")]
            if len(t.shape) not in (2, 3) or 0 in t.shape:
                raise CheckpointError(
                    f"{path}: NVFP4 tensor {short(t.name)}: expected rank 2 or 3 with no empty "
                    f"axis, found shape {list(t.shape)}"
                )
            owned.update({t.name, f"{base}.scale", f"{base}.input_scale"})
            hf = names_map.get(base, base)
            perm = heads.get(base.rpartition(".")[2]) if self.arch == "llama" else None
            self._check_permutable(t, perm, t.shape[-2])
            if len(t.shape) == 3 and base in names_map and "{}" not in hf:
                # our writer's record of a stack the source stored as one [E, N, K] tensor
                self._add_q(hf, _GGUFEntry(base, hf, None, perm, stacked=True))
            elif len(t.shape) == 3:
                fmt = hf if "{}" in hf else f"{hf}.{{}}"
                if fmt.count("{}") != 1 or fmt.replace("{}", "").count("{") + fmt.count("}") > 1:
                    self._bad(KV_HF_NAMES, "one '{}' in a merged-expert name", hf)
                members = [fmt.replace("{}", str(i)) for i in range(t.shape[0])]
                for i, member in enumerate(members):
                    self._add_q(member, _GGUFEntry(base, hf, i, perm))
            else:
                self._add_q(hf, _GGUFEntry(base, hf, None, perm))
        if KV_SPEC in kv:
            self._require_globals()
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
            self._check_permutable(t, perm, t.shape[0] if perm is not None else 0)
            if hf_name in self._plain or hf_name in self._q:
                self._bad(KV_HF_NAMES, "unique names", hf_name)
            self._plain[hf_name] = (t.name, perm)
            want = self._hf_dtypes.get(hf_name)
            if want:
                self._check_dtype(hf_name, t, want)
        self._check_vocab_tensors()

    def _require_globals(self) -> None:
        """A file of this package's writer (it records ``nvfp4.spec_version``) holds every
        NVFP4 tensor's global: a missing ``<base>.scale`` is a lie, not the 1.0 that a
        foreign file (llama.cpp's converter omits a global of 1.0) means by it."""
        for entry in self._q.values():
            if f"{entry.gguf_base}.scale" not in self.tensors:
                raise CheckpointError(
                    f"{self.path}: NVFP4 tensor {short(entry.gguf_base + '.weight')}: expected "
                    f"its global {short(entry.gguf_base + '.scale')} (a file recording "
                    f"{KV_SPEC} holds every global), found none"
                )

    def _bad(self, key: str, expected: str, found: object) -> NoReturn:
        raise CheckpointError(
            f"{self.path}: metadata {key}: expected {expected}, found {short(found)}"
        )

    def _names(self, kv: dict[str, Any], key: str, *, unique: bool = True) -> list[str] | None:
        v = kv.get(key)
        if v is None:
            return None
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            self._bad(key, "an array of strings", v)
        if unique and len(set(v)) != len(v):
            dup = next(x for x in v if v.count(x) > 1) if len(v) < 4096 else "(a repeated name)"
            self._bad(key, "unique names", dup)
        return v

    def _add_q(self, name: str, entry: _GGUFEntry) -> None:
        if name in self._q:
            self._bad(KV_HF_NAMES, "unique names", name)
        self._q[name] = entry

    def _check_dtype(self, name: str, t: GGUFTensorInfo, want: str) -> None:
        """The converter never changes a tensor's dtype except where a layout says so: the
        writer widens 1-D BF16 / F16 to F32, nothing else."""
        stored = PLAIN_TYPES.get(t.ggml_type, (ggml_type_name(t.ggml_type), ""))[0]
        if want == stored or (stored == "F32" and want in ("BF16", "F16") and len(t.shape) <= 1):
            return
        self._bad(KV_HF_DTYPES, f"{stored} for {short(name)} (stored as {stored})", want)

    def _count(self, key: str, config_key: str, at_most: int = _UINT32_MAX) -> int | None:
        """A count of the metadata (``None`` when the file has no ``key``), checked where it
        is read: an integer in ``[1, at_most]`` (a bool, a string, 0 or a negative is
        refused), and equal to ``config_key`` of the recorded ``config.json``
        (``nvfp4.hf_config``) where that has it."""
        value = self.file.value(key)
        want = self.config.get(config_key)
        if value is None:
            return None
        if type(value) is not int or not 1 <= value <= at_most:
            self._bad(key, f"an integer in [1, {at_most}]", value)
        if type(want) is int and want != value:
            self._bad(key, f"{want} (config.json's {config_key}, {KV_HF_CONFIG})", value)
        return value

    def _heads(self) -> dict[str, int]:
        """The head counts by which the llama architecture's q / k rows are RoPE-permuted
        (llama.cpp's converter permutes them; this reader undoes it). A head count that is
        not a positive integer, disagrees with the recorded config or (for the kv heads) does
        not divide the head count is refused: read as absent, it would leave the rows
        permuted, silently wrong weights."""
        if self.arch != "llama":
            return {}
        key_h, key_kv = f"{self.arch}.attention.head_count", f"{self.arch}.attention.head_count_kv"
        n_head = self._count(key_h, "num_attention_heads")
        if n_head is None:
            want = self.config.get("num_attention_heads")
            if type(want) is int:  # our writer permuted by it, and recorded it
                self._bad(key_h, f"{want} (config.json's num_attention_heads)", None)
            return {}
        n_kv = self._count(key_kv, "num_key_value_heads", n_head) or n_head
        if n_head % n_kv:
            self._bad(key_kv, f"a divisor of {key_h} = {n_head}", n_kv)
        return {"attn_q": n_head, "attn_k": n_kv}

    def _check_permutable(self, t: GGUFTensorInfo, heads: int | None, rows: int) -> None:
        """The rows of a q / k tensor split into ``2 x heads`` equal halves (the RoPE
        permutation undone when it is read)."""
        if heads is not None and rows % (2 * heads):
            raise CheckpointError(
                f"{self.path}: tensor {short(t.name)}: expected rows a multiple of 2 x "
                f"{heads} heads ({self.arch}.attention.head_count*), found {rows}"
            )

    def _check_vocab_tensors(self) -> None:
        """The token embedding and the output head: a real-number type (an integer type is
        no embedding; a block type is decoded to numbers), one row per vocabulary entry and one column per hidden unit, as the
        metadata (``<arch>.vocab_size``, ``<arch>.embedding_length``) and the recorded
        config (``vocab_size``, ``hidden_size``) say where they say it."""
        vocab = self._count(f"{self.arch}.vocab_size", "vocab_size") or self._config_int(
            "vocab_size"
        )
        hidden = self._count(f"{self.arch}.embedding_length", "hidden_size") or self._config_int(
            "hidden_size"
        )
        for name in _VOCAB_ROWS:
            t = self.tensors.get(name)
            if t is None:
                continue
            if t.ggml_type in PLAIN_TYPES:  # block types (NVFP4, Q8_0...) are numbers too
                stored = PLAIN_TYPES[t.ggml_type][0]
                if stored not in _FLOAT_TYPES:
                    raise CheckpointError(
                        f"{self.path}: tensor {name!r}: expected a float type "
                        f"({', '.join(_FLOAT_TYPES)}), found {stored}"
                    )
            want = (vocab, hidden)
            if len(t.shape) != 2 or any(
                w is not None and d != w for d, w in zip(t.shape, want, strict=True)
            ):
                said = " x ".join("?" if w is None else str(w) for w in want)
                raise CheckpointError(
                    f"{self.path}: tensor {name!r}: expected shape [{said}] (vocab size x "
                    f"hidden size), found {list(t.shape)}"
                )

    def _config_int(self, key: str) -> int | None:
        v = self.config.get(key)
        return v if type(v) is int and v > 0 else None

    def quantized_names(self) -> list[str]:
        return list(self._q)

    def _entry(self, prefix: str) -> _GGUFEntry:
        try:
            return self._q[prefix]
        except KeyError:
            raise CheckpointError(f"{self.path}: {prefix!r} is not an NVFP4 tensor") from None

    def _side(
        self, base: str, suffix: str, index: int | None, stacked: bool = False
    ) -> npt.NDArray[Any] | None:
        """``<base>.<suffix>``: ``[E]`` for merged experts (one value per expert), ``[1]``
        else; a whole stack's input scale is its one value ``[1]``."""
        t = self.tensors.get(f"{base}.{suffix}")
        if t is None:
            return None
        per_expert = index is not None or (stacked and suffix == "scale")
        experts = self.tensors[f"{base}.weight"].shape[0] if per_expert else 1
        if t.ggml_type != 0 or t.shape != (experts,):
            raise CheckpointError(
                f"{self.path}: tensor {short(t.name)}: expected F32 of shape [{experts}], "
                f"found {ggml_type_name(t.ggml_type)} {list(t.shape)}"
            )
        a = self.file.array(t)
        return a[index : index + 1] if index is not None else a

    def plane_shape(self, prefix: str) -> PlaneShape:
        entry = self._entry(prefix)
        shape = self.tensors[f"{entry.gguf_base}.weight"].shape
        return PlaneShape(tuple(shape) if entry.stacked else tuple(shape[-2:]))

    def planes(self, prefix: str) -> NVFP4Planes:
        entry = self._entry(prefix)
        data = self.file.array(self.tensors[f"{entry.gguf_base}.weight"])
        if entry.index is not None:
            data = data[entry.index]
        scale = self._side(entry.gguf_base, "scale", entry.index, entry.stacked)
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
