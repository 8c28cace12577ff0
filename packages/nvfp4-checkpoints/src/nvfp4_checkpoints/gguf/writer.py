"""Writing a GGUF file from a :class:`~nvfp4_checkpoints.source.Source`, streaming.

gguf-py's ``GGUFWriter`` writes the header (metadata and tensor infos, declared from shapes
alone); the tensor data is ours to write (gguf-py's ``write_tensor_data`` wants each tensor
whole): every tensor starts at a multiple of the alignment, in the order of the tensor
infos. NVFP4 data is transcoded a chunk at a time into recycled buffers while a second
thread writes the previous chunk (:class:`~nvfp4_checkpoints.overlapped.OverlappedWriter`).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import IO, Any, Final

import numpy as np
import numpy.typing as npt
from nvfp4.layouts.gguf import gguf_global, iter_gguf_data
from nvfp4.planes import PlaneError
from nvfp4.spec import GGUF_BLOCK_BYTES, GGUF_SUPER_BLOCK, WEIGHT_FORMAT_VERSION

from ..flavours import CheckpointError, import_gguf
from ..folder import Fields
from ..overlapped import OverlappedWriter
from ..safetensors_io import DTYPES, safetensors_dtype
from ..source import Plan, PlaneItem, Progress, Source, TensorItem, fetch, plan, plane_items, slow
from .file import PLAIN_TYPES
from .metadata import (
    KV_GGUF_NAMES,
    KV_HF_CONFIG,
    KV_HF_DTYPES,
    KV_HF_NAMES,
    KV_ROPE_PERMUTED,
    KV_SPEC,
    add_hparams,
    gguf_arch,
    permuted_heads,
    rope_permute_rows,
)

__all__ = ["TokenizerWriter", "write_gguf_file"]

#: Adds tokenizer keys to a GGUFWriter; returns whether it added any.
TokenizerWriter = Callable[[Any], bool]
#: The plain tensor types a GGUF holds besides NVFP4 (their safetensors dtype names).
_PLAIN_TYPE_NAMES: Final = tuple(name for name, _ in PLAIN_TYPES.values())


@dataclass
class _Job:
    """One item of the plan as written: the GGUF tensors it fills, the RoPE permutation of
    its rows (number of heads) and, for a plain tensor, whether it is widened to F32."""

    item: PlaneItem | TensorItem
    names: list[str]
    permute_heads: int | None
    widen: bool


class _Header:
    """The tensor infos declared so far, with the ``nvfp4.*`` name maps that go with them."""

    def __init__(
        self, gguf: ModuleType, writer: Any, arch: str, config: dict[str, Any], layout: Plan
    ) -> None:
        self.gguf = gguf
        self.w = writer
        arch_enum = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}.get(arch)
        n_layers = _layers_present(layout)  # not the config's count: layers must exist
        declared = config.get("num_hidden_layers")
        if n_layers and type(declared) is int and declared != n_layers:
            # GGUF's block_count would promise layers the file does not hold
            raise CheckpointError(
                f"config.json: num_hidden_layers: expected {n_layers} (the layers the "
                f"tensors hold), found {declared}"
            )
        self.tmap = gguf.get_tensor_name_map(arch_enum, n_layers) if arch_enum is not None else None
        self.heads = permuted_heads(arch, config)
        self.gguf_names: list[str] = []
        self.hf_names: list[str] = []
        self.hf_dtypes: list[str] = []
        self.jobs: list[_Job] = []
        self.total_bytes = 0
        self._seen: set[str] = set()

    def _mapped(self, hf: str, suffixes: tuple[str, ...]) -> str | None:
        return self.tmap.get_name(hf, try_suffixes=suffixes) if self.tmap is not None else None

    def _claim(self, name: str, owner: str) -> None:
        if name in self._seen:
            raise CheckpointError(f"GGUF tensor name {name!r} (from {owner!r}) is used twice")
        self._seen.add(name)

    def _record(self, gguf_name: str, hf_name: str, hf_dtype: str, job: _Job) -> None:
        self.gguf_names.append(gguf_name)
        self.hf_names.append(hf_name)
        self.hf_dtypes.append(hf_dtype)
        self.jobs.append(job)

    def add_planes(self, it: PlaneItem) -> None:
        """``<base>.weight`` NVFP4, ``<base>.scale`` F32 and ``<base>.input_scale`` when the
        item has one (``[E]`` for merged experts, else ``[1]``; a stack the source stored
        whole has its ``[E]`` globals and its one input scale ``[1]``)."""
        hf = it.key.replace(".{}", "")
        mapped = self._mapped(hf + ".weight", (".weight",))
        base = mapped[: -len(".weight")] if mapped else hf
        perm = self.heads.get(base.rpartition(".")[2])
        lead, (n, k) = it.shape.shape[:-2], it.shape.shape[-2:]
        data_shape = (*lead, n, k // GGUF_SUPER_BLOCK * GGUF_BLOCK_BYTES)
        names = [f"{base}.weight", f"{base}.scale"]
        for nm in names:
            self._claim(nm, it.key)
        nvfp4_type = self.gguf.GGMLQuantizationType.NVFP4
        self.w.add_tensor_info(
            names[0], data_shape, np.dtype(np.uint8), math.prod(data_shape), nvfp4_type
        )
        scale_n = lead[0] if lead else 1
        self.w.add_tensor_info(names[1], (scale_n,), np.dtype(np.float32), 4 * scale_n)
        self.total_bytes += math.prod(data_shape) + 4 * scale_n
        if it.input_scale is not None:
            names.append(f"{base}.input_scale")
            self._claim(names[-1], it.key)
            input_n = int(it.input_scale.size)
            self.w.add_tensor_info(names[-1], (input_n,), np.dtype(np.float32), 4 * input_n)
            self.total_bytes += 4 * input_n
        self._record(base, it.key, "", _Job(it, names, perm, False))

    def add_tensor(self, it: TensorItem) -> None:
        """A plain tensor as it is (1-D bf16/f16 widened to F32, q/k rows of ``llama``
        RoPE-permuted), under gguf-py's name for it when the map knows one."""
        st = safetensors_dtype(it.dtype) if it.dtype in DTYPES.values() else str(it.dtype)
        if st not in _PLAIN_TYPE_NAMES:
            raise CheckpointError(
                f"tensor {it.name!r}: dtype {st} has no GGUF type "
                f"(GGUF holds {', '.join(_PLAIN_TYPE_NAMES)} besides NVFP4)"
            )
        gname = self._mapped(it.name, (".weight", ".bias")) or it.name
        self._claim(gname, it.name)
        widen = len(it.shape) <= 1 and st in ("BF16", "F16")
        perm = None
        if len(it.shape) == 2 and gname.endswith(".weight"):
            perm = self.heads.get(gname[: -len(".weight")].rpartition(".")[2])
        if widen:
            self.w.add_tensor_info(gname, it.shape, np.dtype(np.float32), 4 * math.prod(it.shape))
            nbytes = 4 * math.prod(it.shape)
        elif st == "BF16":
            nbytes = 2 * math.prod(it.shape)
            bf16_type = self.gguf.GGMLQuantizationType.BF16
            self.w.add_tensor_info(gname, it.shape, np.dtype(np.uint16), nbytes, bf16_type)
        else:
            nbytes = it.dtype.itemsize * math.prod(it.shape)
            self.w.add_tensor_info(gname, it.shape, it.dtype, nbytes)
        self.total_bytes += nbytes
        self._record(gname, it.name, st, _Job(it, [gname], perm, widen))

    def add_name_maps(self) -> None:
        """The GGUF <-> Hugging Face name map and original dtypes, and whether q/k rows are
        RoPE-permuted: what the reader needs to restore the Hugging Face view exactly."""
        self.w.add_array(KV_GGUF_NAMES, self.gguf_names)
        self.w.add_array(KV_HF_NAMES, self.hf_names)
        self.w.add_array(KV_HF_DTYPES, self.hf_dtypes)
        self.w.add_bool(KV_ROPE_PERMUTED, bool(self.heads))


_LAYER_RE: Final = re.compile(r"(?:^|\.)(?:layers|h|blocks|blk)\.(\d{1,9})\.")


def _layers_present(layout: Plan) -> int:
    """One more than the highest layer index among the tensors' names (the name map of
    gguf-py is built for these layers only, whatever ``num_hidden_layers`` says)."""
    top = -1
    for it in layout.items:
        for m in _LAYER_RE.finditer(it.key if isinstance(it, PlaneItem) else it.name):
            top = max(top, int(m.group(1)))
    return min(top + 1, len(layout.items))


def _refuse_k(layout: Plan) -> None:
    """What a GGUF NVFP4 tensor cannot hold: K % 64 (a super-block is 64 elements), one
    global shared by a stack of experts (``<base>.scale`` is one global per expert)."""
    for it in plane_items(layout):
        if it.shape.shared_global:
            e = it.shape.shape[0]
            raise PlaneError(
                it.key,
                "global for a GGUF expert stack",
                f"one global per expert (a .scale of shape [{e}]; GGUF keeps no shared global)",
                "one global for all experts (shape () or (1,))",
            )
        if it.shape.k % GGUF_SUPER_BLOCK:
            raise PlaneError(
                it.key,
                "K for GGUF NVFP4",
                f"a multiple of {GGUF_SUPER_BLOCK}",
                f"K = {it.shape.k}",
            )


def _add_metadata(gguf: ModuleType, w: Any, config: dict[str, Any]) -> None:
    f = Fields(config, "config.json")
    w.add_name(f.text("_name_or_path") or f.text("model_type") or "nvfp4 model")
    add_hparams(w, config)
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_NVFP4))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_string(KV_SPEC, WEIGHT_FORMAT_VERSION)
    w.add_string(KV_HF_CONFIG, json.dumps(config, sort_keys=True))


def _job_arrays(
    src: Source, job: _Job, out: OverlappedWriter, alignment: int
) -> tuple[list[npt.NDArray[Any]], int]:
    """Write an NVFP4 job's data chunk by chunk; return the arrays still to write (its
    scales, or the plain tensor) and the bytes written."""
    if isinstance(job.item, PlaneItem):
        planes = fetch(src, job.item)
        if job.permute_heads is not None:
            planes = planes.replace(
                codes=rope_permute_rows(planes.codes, job.permute_heads),
                scales=rope_permute_rows(planes.scales, job.permute_heads),
            )
        scale = gguf_global(planes)
        done = 0
        for chunk in iter_gguf_data(planes, buffer=out.buffer):
            out.write(chunk, recycle=True)
            done += int(chunk.nbytes)
        out.align(alignment)
        arrays = [scale]
        if job.item.input_scale is not None:
            arrays.append(np.asarray(job.item.input_scale, dtype=np.float32).reshape(-1))
        return arrays, done
    a = np.asarray(src.tensor_of(job.item.name))
    if job.permute_heads is not None:
        a = rope_permute_rows(a, job.permute_heads)
    if job.widen:
        a = a.astype(np.float32)
    elif a.dtype == DTYPES["BF16"]:
        a = a.view(np.uint16)
    return [a], 0


def _write_data(
    fout: IO[bytes], src: Source, header: _Header, alignment: int, progress: Progress | None
) -> None:
    done_bytes = done_items = 0
    total_items = len(header.jobs)
    if progress:
        progress(0, total_items, 0, header.total_bytes)
    with OverlappedWriter(fout) as out:
        out.align(alignment)
        for job in header.jobs:
            arrays, done = _job_arrays(src, job, out, alignment)
            done_bytes += done
            for arr in arrays:
                out.write(np.ascontiguousarray(arr))
                out.align(alignment)
                done_bytes += int(arr.nbytes)
            done_items += 1
            if progress:
                progress(done_items, total_items, done_bytes, header.total_bytes)
            slow()
    fout.flush()
    os.fsync(fout.fileno())


def write_gguf_file(
    dst_tmp: Path, src: Source, tokenizer: TokenizerWriter | None, progress: Progress | None
) -> bool:
    """Write ``src`` as a GGUF file at ``dst_tmp`` (experts merged again); returns whether
    ``tokenizer`` added any tokenizer keys. K % 64 != 0 is refused with a
    :class:`~nvfp4.PlaneError` before anything is written."""
    gguf = import_gguf()
    config = src.config
    arch = gguf_arch(config)
    layout = plan(src, stack=True)
    _refuse_k(layout)
    w = gguf.GGUFWriter(None, arch)
    header = _Header(gguf, w, arch, config, layout)
    _add_metadata(gguf, w, config)
    tokenizer_written = tokenizer(w) if tokenizer is not None else False
    for item in layout.items:
        if isinstance(item, PlaneItem):
            header.add_planes(item)
        else:
            header.add_tensor(item)
    header.add_name_maps()

    w.write_header_to_file(path=dst_tmp)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    assert w.fout is not None
    assert len(w.fout) == 1
    try:
        _write_data(w.fout[0], src, header, w.data_alignment, progress)
    finally:
        w.close()
    return tokenizer_written
