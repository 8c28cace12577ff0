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
  header first and then tensor by tensor, then the index, the configs, the source
  directory's other files, the flavour's generated files (the MLX model file) and the
  tokenizer (:mod:`.tokenizer`). Outputs are ``model.safetensors``, or
  ``model-0000i-of-0000n.safetensors`` shards plus ``model.safetensors.index.json`` when
  larger than ``max_shard_bytes``.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt
from nvfp4.planes import NVFP4Planes, PlaneError
from nvfp4.spec import BLOCK_SIZE, WEIGHT_FORMAT_VERSION

from ._version import __version__
from .checkpoint import Checkpoint, PlaneShape, scalar
from .config_dims import check_config_dims
from .flavour_io import FlavourIO, WriteOptions
from .flavours import CheckpointError, Flavour
from .folder import CheckpointFolder, Fields, short
from .safetensors_io import (
    DTYPES,
    MAX_HEADER_TENSORS,
    SafetensorsFile,
    SafetensorsWriter,
    TensorInfo,
    safetensors_dtype,
)
from .source import Plan, PlaneItem, Progress, Source, TensorItem, fetch, natural, plan, slow
from .tokenizer import check_tokenizer_source, output_tokenizer

__all__ = [
    "DEFAULT_MAX_SHARD_BYTES",
    "INDEX_FILE",
    "MLX_LM_MODEL_FILE",
    "PRODUCER",
    "Entry",
    "HFCheckpoint",
    "HFFormat",
    "PackedFormat",
    "SafetensorsStore",
    "base_config",
    "exclude_modules",
    "leading_dims",
    "one_global",
    "packed_plane_entries",
    "refuse_partitions",
    "write_hf",
]

INDEX_FILE: Final = "model.safetensors.index.json"
#: Shard size above which Hugging Face outputs are split (bytes).
DEFAULT_MAX_SHARD_BYTES: Final = 5_000_000_000
#: The ``producer`` block of the configs written.
PRODUCER: Final = {"name": "nvfp4", "version": __version__}


def spec_record() -> dict[str, Any]:
    """What our writers record of the weight format, under an ``nvfp4`` key of the
    flavour's quantization config (``nvfp4 inspect`` reads it back): the spec version the
    planes follow and the producer. Readers of each flavour ignore keys they do not know."""
    return {"spec_version": WEIGHT_FORMAT_VERSION, "producer": dict(PRODUCER)}


_HF_CONFIG_FILES: Final = frozenset({"config.json", "hf_quant_config.json", INDEX_FILE})
#: The mlx-lm model file of our MLX folders (:mod:`.mlx_lm_model`): written by the MLX
#: writer, never copied from a source directory.
MLX_LM_MODEL_FILE: Final = "nvfp4_mlx_lm.py"

Entry = tuple[str, str, tuple[int, ...]]  # (name, safetensors dtype, shape)


# =========================================================================== reading
class SafetensorsStore:
    """The tensors of a Hugging Face directory, single file or sharded with an index; every
    file it opens is a regular file inside the folder (:class:`~.folder.CheckpointFolder`)."""

    def __init__(self, folder: CheckpointFolder) -> None:
        self.root = root = folder.root
        self.files: list[SafetensorsFile] = []
        self.where: dict[str, SafetensorsFile] = {}
        index = folder.fields(INDEX_FILE)
        if index is not None:
            weight_map = index.obj("weight_map", required=True)
            assert weight_map is not None
            by_file: dict[str, list[str]] = {}
            for name, fname in weight_map.items():
                if not isinstance(fname, str):
                    weight_map.fail(name, "a shard file name", fname)
                by_file.setdefault(fname, []).append(name)
            if not by_file:
                raise CheckpointError(f"{root / INDEX_FILE}: 'weight_map' is empty")
            for fname, names in by_file.items():
                where = f"{INDEX_FILE}: key {short('weight_map.' + names[0])}: shard"
                sf = _open_shard(folder, fname, where)
                self.files.append(sf)
                for name in names:
                    if name not in sf:
                        raise CheckpointError(
                            f"{root / INDEX_FILE}: tensor {short(name)} is mapped to "
                            f"{short(fname)}, which does not hold it"
                        )
                    self.where[name] = sf
            for (fname, names), sf in zip(by_file.items(), self.files, strict=True):
                _refuse_unmapped(root / INDEX_FILE, fname, sf, frozenset(names), weight_map)
        else:
            paths = [n for n in folder.listing() if n.endswith(".safetensors")]
            if not paths:
                raise CheckpointError(f"{root}: no *.safetensors files")
            for fname in paths:
                sf = _open_shard(folder, fname, "file")
                self.files.append(sf)
                for name in sf.names():
                    if name in self.where:
                        raise CheckpointError(
                            f"{root}: tensor {short(name)} is in both "
                            f"{self.where[name].path.name} and {fname}"
                        )
                    self.where[name] = sf
        if not self.where:
            raise CheckpointError(f"{root}: the checkpoint holds no tensors")

    def names(self) -> list[str]:
        return list(self.where)

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def info(self, name: str) -> TensorInfo:
        return self.where[name].info(name)

    def get(self, name: str) -> npt.NDArray[Any]:
        return self.where[name].get(name)

    def read(
        self, name: str, *, axis: int | None = None, start: int = 0, stop: int | None = None
    ) -> npt.NDArray[Any]:
        """``name`` (or a range of one axis) read into memory, nothing mapped
        (:meth:`~.safetensors_io.SafetensorsFile.read`)."""
        return self.where[name].read(name, axis=axis, start=start, stop=stop)


#: The file ``nvfp4 shard`` writes beside its rank folders (its one source: :mod:`.shard`
#: imports it from here, as it reads checkpoints through this module).
SHARD_MANIFEST: Final = "shard-manifest.json"


def _rank_of_sharded(path: Path) -> bool:
    """Whether ``path`` is a rank folder of ``nvfp4 shard``'s output: it keeps the whole
    model's ``config.json`` while the manifest beside it gives its shapes."""
    return (path.parent / SHARD_MANIFEST).is_file()


def _open_shard(folder: CheckpointFolder, fname: str, what: str) -> SafetensorsFile:
    """The safetensors member ``fname``, opened (now and for every tensor read) through
    :meth:`~.folder.CheckpointFolder.open_member`: never followed if swapped for a symlink."""
    return SafetensorsFile(
        folder.member(fname, what=what), lambda: folder.open_member(fname, what=what)
    )


def _refuse_unmapped(
    index: Path, fname: str, sf: SafetensorsFile, mapped: frozenset[str], weight_map: Fields
) -> None:
    """Index and shard agree both ways: every tensor of a shard the index names is mapped
    to that shard (a tensor left out would otherwise be silently dropped)."""
    for name in sf.names():
        if name not in mapped:
            other = weight_map.raw(name)
            found = "no entry" if other is None else f"an entry naming {short(other)}"
            raise CheckpointError(
                f"{index}: shard {short(fname)} holds tensor {short(name)}: expected "
                f"'weight_map' to map it to {short(fname)}, found {found}"
            )


class HFCheckpoint(Checkpoint):
    """Shared machinery of the safetensors flavours.

    A prefix is claimed NVFP4 by any of its ``CLAIMS`` tensors (its block scales, its
    global...) when the quantization config does not say otherwise (:meth:`_accept`); a
    claimed prefix must then be complete and well typed (:meth:`_require_nvfp4`), or the
    checkpoint is refused naming it: nothing the config calls NVFP4 is passed through as a
    plain tensor. The prefix's own tensors (``OWNED``) are hidden from
    :meth:`tensor_names`; its input scale (``INPUT``) is validated like a global."""

    CODES: str
    SCALES: str
    OWNED: tuple[str, ...]
    #: Suffixes whose presence makes a prefix NVFP4.
    CLAIMS: tuple[str, ...]
    #: The codes' dtype and how many codes one element holds.
    CODES_DTYPE: str = "U8"
    CODES_PER_ELEMENT: int = 2
    SCALES_DTYPES: tuple[str, ...] = ("F8_E4M3", "U8")
    #: The global's suffix when it is required (``None``: optional).
    GLOBAL: str | None = None
    #: The input scale's suffix.
    INPUT: str = "input_scale"
    #: The global's suffix, required or not.
    GLOBAL_TENSOR: str = "global_scale"

    def __init__(self, path: Path, flavour: Flavour) -> None:
        self.path = path
        self.flavour = flavour
        self.folder = CheckpointFolder(path)
        fields = self.folder.fields("config.json")
        self.config = dict(fields.data) if fields is not None else {}
        self._read_quant_config(fields if fields is not None else Fields({}, path / "config.json"))
        self.store = SafetensorsStore(self.folder)
        self._quantized = self._claimed()
        self._qset = frozenset(self._quantized)
        owned = {f"{p}.{s}" for p in self._qset for s in self.OWNED}
        self._plain = [n for n in self.store.names() if n not in owned]
        self._pset = frozenset(self._plain)
        if not _rank_of_sharded(self.path):
            check_config_dims(self.path, self.config, self._shapes())

    def _shapes(self) -> dict[str, Callable[[], tuple[int, ...]]]:
        """Header shapes by name for :func:`~.config_dims.check_config_dims`: each NVFP4
        prefix's logical ``[E?, N, K]``, each plain tensor's, and a plain ``<x>.weight``'s
        also under ``<x>`` (a linear layer left unquantized)."""
        shapes: dict[str, Callable[[], tuple[int, ...]]] = {}
        for p in self._quantized:
            shapes[p] = lambda p=p: self.plane_shape(p).shape  # type: ignore[misc]
        for n in self._plain:
            shapes[n] = lambda n=n: self.store.info(n).shape  # type: ignore[misc]
            if n.endswith(".weight"):
                shapes.setdefault(n[: -len(".weight")], shapes[n])
        return shapes

    def _read_quant_config(self, config: Fields) -> None:
        """Read and check the flavour's quantization config (sets :attr:`quant_config`)."""
        raise NotImplementedError

    def _claimed(self) -> list[str]:
        out: dict[str, None] = {}
        for name in self.store.names():
            prefix, _, suffix = name.rpartition(".")
            if suffix in self.CLAIMS and prefix and prefix not in out and self._accept(prefix):
                self._require_nvfp4(prefix)
                out[prefix] = None
        return list(out)

    def _require_nvfp4(self, prefix: str) -> None:
        """Refuse a claimed prefix whose tensors are missing or of the wrong kind."""

        def bad(suffix: str, expected: str, found: object) -> CheckpointError:
            return CheckpointError(
                f"{self.path}: NVFP4 tensor {short(prefix)}: {suffix}: expected {expected}, "
                f"found {found}"
            )

        need = [self.CODES, self.SCALES] + ([self.GLOBAL] if self.GLOBAL else [])
        for suffix in need:
            if f"{prefix}.{suffix}" not in self.store:
                raise bad(suffix, "a tensor (the quantization config makes it NVFP4)", "none")
        codes = self.store.info(f"{prefix}.{self.CODES}")
        scales = self.store.info(f"{prefix}.{self.SCALES}")
        if codes.dtype != self.CODES_DTYPE:
            raise bad(self.CODES, self.CODES_DTYPE, codes.dtype)
        if len(codes.shape) not in (2, 3):
            raise bad(self.CODES, "rank 2 or 3", f"shape {list(codes.shape)}")
        if scales.dtype not in self.SCALES_DTYPES:
            raise bad(self.SCALES, " or ".join(self.SCALES_DTYPES), scales.dtype)
        if scales.shape[:-1] != codes.shape[:-1] or len(scales.shape) != len(codes.shape):
            raise bad(
                self.SCALES,
                f"leading shape {list(codes.shape[:-1])} (the codes')",
                f"shape {list(scales.shape)}",
            )
        if self._k_of(codes) != scales.shape[-1] * BLOCK_SIZE or not codes.shape[-1]:
            raise bad(
                self.SCALES,
                f"K/16 = {self._k_of(codes) // BLOCK_SIZE} blocks per row",
                f"shape {list(scales.shape)}",
            )

    def _accept(self, prefix: str) -> bool:
        return True

    def input_scale(self, prefix: str) -> float | None:
        self._check_prefix(prefix)
        name = f"{prefix}.{self.INPUT}"
        if name not in self.store:
            return None
        info = self.store.info(name)
        if info.dtype not in ("F32", "F16", "BF16"):
            raise CheckpointError(
                f"{self.path}: tensor {short(name)}: expected a float input scale, found {info.dtype}"
            )
        return scalar(self._decode_input(self.store.get(name), name), name)

    def _decode_input(self, a: npt.NDArray[Any], name: str) -> npt.NDArray[Any]:
        """The stored input scale in the DECODE convention."""
        return a

    def quantized_names(self) -> list[str]:
        return list(self._quantized)

    def _check_prefix(self, prefix: str) -> None:
        if prefix not in self._qset:
            raise CheckpointError(f"{self.path}: {prefix!r} is not an NVFP4 tensor")

    def planes(self, prefix: str) -> NVFP4Planes:
        return self.planes_from_parts(prefix, self._parts(prefix))

    def planes_from_parts(self, prefix: str, parts: Mapping[str, Any]) -> NVFP4Planes:
        """The canonical planes of ``prefix`` from its stored tensors (``parts``: suffix ->
        array, those of :attr:`OWNED` the checkpoint holds), validated with content: the
        flavour's lossless transcode. :meth:`planes` passes the whole tensors; a rank
        loader (:mod:`.rank_loading`) passes the rank's rows or columns of the codes and
        scales, as a transcode of a range is the range of the transcode."""
        raise NotImplementedError

    def part_names(self, prefix: str) -> dict[str, str]:
        """``prefix``'s stored tensors: suffix -> tensor name, those of :attr:`OWNED` the
        checkpoint holds."""
        self._check_prefix(prefix)
        return {s: f"{prefix}.{s}" for s in self.OWNED if f"{prefix}.{s}" in self.store}

    def _parts(self, prefix: str) -> dict[str, npt.NDArray[Any]]:
        return {s: self.store.get(name) for s, name in self.part_names(prefix).items()}

    def plane_shape(self, prefix: str) -> PlaneShape:
        self._check_prefix(prefix)
        codes = self.store.info(f"{prefix}.{self.CODES}")
        return PlaneShape(
            (*codes.shape[:-1], self._k_of(codes)),
            shared_global=len(codes.shape) == 3 and self._global_size(prefix) == 1,
        )

    def _global_size(self, prefix: str) -> int:
        """Values in the prefix's global tensor (1 when it has none: a global of 1)."""
        name = f"{prefix}.{self.GLOBAL_TENSOR}"
        return math.prod(self.store.info(name).shape) if name in self.store else 1

    def _k_of(self, codes: TensorInfo) -> int:
        return codes.shape[-1] * self.CODES_PER_ELEMENT

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

    def generated_files(self) -> dict[str, str]:
        """Text files of the flavour itself (name -> content), written beside the configs."""
        return {}

    def flavour_io(self, read: Callable[[Path], Checkpoint]) -> FlavourIO:
        """The flavour's row of the reader/writer table: ``read`` opens it, :func:`write_hf`
        writes it in this format."""
        return FlavourIO(
            flavour=self.flavour,
            read=read,
            write=lambda tmp, src, options: write_hf(self, tmp, src, options),
        )


def leading_dims(item: PlaneItem) -> tuple[int, ...]:
    return item.shape.shape[:-2]


def one_global(item: PlaneItem, a: npt.NDArray[Any], shape: tuple[int, ...]) -> npt.NDArray[Any]:
    """A layout's global array ``a`` as written for ``item``: its one value in ``shape`` for
    a stack of experts sharing one global (:attr:`PlaneShape.shared_global`; the layouts
    broadcast it to ``(E,)``), else as it is."""
    if not item.shape.shared_global:
        return a
    return np.array(np.asarray(a, dtype=np.float32).reshape(-1)[:1].reshape(shape))


def refuse_partitions(item: PlaneItem, flavour: str) -> None:
    if item.shape.partitions is not None:
        raise PlaneError(
            item.key,
            f"partitions (fused tensor) for {flavour}",
            "an unfused tensor (one per projection); call nvfp4.fusion.unfuse first",
            f"{item.shape.partitions} partitions",
        )


def packed_plane_entries(
    item: PlaneItem, flavour: str, codes: str, global_scale: str, global_shape: tuple[int, ...]
) -> list[Entry]:
    """The plane entries of a flavour storing ModelOpt's planes (two codes a byte, E4M3 block
    scale bytes in ``weight_scale``) under its own names for the codes and the float32 global;
    refuses a fused tensor."""
    refuse_partitions(item, flavour)
    lead, (n, k) = leading_dims(item), item.shape.shape[-2:]
    return [
        (f"{item.key}.{codes}", "U8", (*lead, n, k // 2)),
        (f"{item.key}.weight_scale", "F8_E4M3", (*lead, n, k // BLOCK_SIZE)),
        (f"{item.key}.{global_scale}", "F32", global_shape),
    ]


class PackedFormat(HFFormat):
    """A flavour storing ModelOpt's planes under names of its own (ModelOpt,
    compressed-tensors): the codes two a byte (``codes_name``), the E4M3 block scale bytes
    (``weight_scale``), the float32 global (``global_name``) and, for W4A4, the activations'
    float32 input scale (``input_name``, as :meth:`input_array` writes it). A scalar is stored
    in ``scalar_shape``: ``()`` or ``(1,)``; a stack of experts keeps its leading
    dimensions."""

    label: str  # the flavour as refusals name it
    codes_name: str
    global_name: str
    input_name: str
    scalar_shape: tuple[int, ...]

    def layout(self, planes: NVFP4Planes) -> Mapping[str, npt.NDArray[Any]]:
        """The flavour's arrays of ``planes`` (by their names in the file)."""
        raise NotImplementedError

    def input_array(self, item: PlaneItem) -> npt.NDArray[Any]:
        """The input scale as the flavour stores it (by default the DECODE scale as it is)."""
        assert item.input_scale is not None
        return item.input_scale

    def plane_entries(self, item: PlaneItem) -> list[Entry]:
        lead = leading_dims(item)
        global_shape = self.scalar_shape if item.shape.shared_global else lead or self.scalar_shape
        out = packed_plane_entries(
            item, self.label, self.codes_name, self.global_name, global_shape
        )
        if item.input_scale is not None:
            shape = tuple(item.input_scale.shape) or self.scalar_shape
            out.append((f"{item.key}.{self.input_name}", "F32", shape))
        return out

    def plane_arrays(self, item: PlaneItem, planes: NVFP4Planes) -> list[npt.NDArray[Any]]:
        t = self.layout(planes)
        out = [
            t[self.codes_name],
            t["weight_scale"],
            one_global(item, t[self.global_name], self.scalar_shape),
        ]
        if item.input_scale is not None:
            out.append(self.input_array(item))
        return out


def base_config(config: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(config))
    for key in ("quantization_config", "quantization", "nvfp4"):
        out.pop(key, None)
    if out.get("model_file") == MLX_LM_MODEL_FILE:
        del out["model_file"]  # ours: only MLX folders carry it (the MLX writer adds it)
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
        return (item.name, safetensors_dtype(item.dtype), item.shape)
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
    acc = count = 0
    for i, size in enumerate(sizes):
        n_entries = len(units[i][1])
        # a shard this package's reader reads: at most MAX_HEADER_TENSORS tensors
        if shards[-1] and (acc + size > max_shard_bytes or count + n_entries > MAX_HEADER_TENSORS):
            shards.append([])
            acc = count = 0
        shards[-1].append(i)
        acc += size
        count += n_entries
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
    for extra in extra_files:  # read through the checked file, never its path again
        CheckpointFolder(extra.parent).copy_member(extra.name, dst_tmp / extra.name)
    for name, text in fmt.generated_files().items():
        (dst_tmp / name).write_text(text, encoding="utf-8")


def _write_json(path: Path, content: Mapping[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(content, f, indent=2)
        f.write("\n")


def _extra_files(origin: Checkpoint | None) -> list[Path]:
    """The source directory's other files (tokenizer, generation config...), copied into
    the output: regular files inside it only (a symlink is refused, naming it)."""
    if not isinstance(origin, HFCheckpoint):
        return []
    return origin.folder.present(
        name
        for name in origin.folder.listing()
        if name not in _HF_CONFIG_FILES
        and name != MLX_LM_MODEL_FILE
        and not name.endswith(".safetensors")
    )


def write_hf(fmt: HFFormat, dst_tmp: Path, src: Source, options: WriteOptions) -> list[str]:
    """Write ``src`` as a Hugging Face directory of flavour ``fmt`` at ``dst_tmp``."""
    extra_files = _extra_files(src.origin)  # refused before anything is written
    if src.tokenizer_dir is not None:
        check_tokenizer_source(src.tokenizer_dir)
    _write_hf(
        dst_tmp,
        fmt,
        src,
        max_shard_bytes=options.max_shard_bytes,
        progress=options.progress,
        extra_files=extra_files,
    )
    return output_tokenizer(src, dst_tmp)
