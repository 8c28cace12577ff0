"""Which kind of NVFP4 checkpoint a path holds.

=================== =========================================================================
flavour             recognised by
=================== =========================================================================
``modelopt``        a directory whose ``hf_quant_config.json`` has ``quantization.quant_algo``
                    an NVFP4 algorithm or ``MIXED_PRECISION`` (with per-layer
                    ``quantized_layers``), or whose ``config.json`` has
                    ``quantization_config.quant_method == "modelopt"``
``compressed-       a directory whose ``config.json`` has ``quantization_config`` with
tensors``           ``quant_method == "compressed-tensors"`` and ``format ==
                    "nvfp4-pack-quantized"`` (or ``"mixed-precision"`` with an
                    ``nvfp4-pack-quantized`` config group)
``mlx``             a directory whose ``config.json`` has a ``quantization`` block with
                    ``mode == "nvfp4"`` (written by :mod:`nvfp4_checkpoints.mlx`)
``gguf``            a file starting with the magic ``GGUF``
=================== =========================================================================

Anything else is refused with :class:`CheckpointError` saying what was found.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType
from typing import Final, Literal

from .folder import CheckpointError, CheckpointFolder, Fields, short

__all__ = [
    "FLAVOURS",
    "MODELOPT_NVFP4_ALGOS",
    "CheckpointError",
    "Flavour",
    "detect_flavour",
    "import_gguf",
]

Flavour = Literal["modelopt", "compressed-tensors", "mlx", "gguf"]
#: Every flavour, in the order the CLI lists them.
FLAVOURS: Final[tuple[Flavour, ...]] = ("modelopt", "compressed-tensors", "mlx", "gguf")
#: ModelOpt ``quant_algo`` values whose weights are NVFP4 planes (the decoder is the same;
#: they differ in activations, pre-quant scales or the encoder's global).
MODELOPT_NVFP4_ALGOS: Final = frozenset(
    {"NVFP4", "W4A16_NVFP4", "NVFP4_AWQ", "W4A8_NVFP4_FP8", "NVFP4_SVD"}
)
CT_NVFP4_FORMAT: Final = "nvfp4-pack-quantized"
GGUF_MAGIC: Final = b"GGUF"


def import_gguf() -> ModuleType:
    """The ``gguf`` package (gguf-py), or :class:`CheckpointError` saying how to get it."""
    try:
        return importlib.import_module("gguf")
    except ImportError:
        raise CheckpointError(
            "GGUF support needs the 'gguf' package (pip install 'gguf>=0.19')"
        ) from None


def _is_gguf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == GGUF_MAGIC


def _modelopt_algo(hf_quant: Fields | None) -> str | None:
    q = hf_quant.obj("quantization") if hf_quant is not None else None
    return q.text("quant_algo") if q is not None else None


def detect_flavour(path: str | os.PathLike[str]) -> Flavour:
    """The flavour of the checkpoint at ``path`` (see the module docstring).

    Raises :class:`CheckpointError` when the path does not exist or holds no NVFP4
    checkpoint this package reads, saying what it found.
    """
    p = Path(path)
    if not p.exists():
        raise CheckpointError(
            f"{p}: no such file or directory (expected a checkpoint folder or a GGUF file)"
        )
    if p.is_file():
        if _is_gguf(p):
            return "gguf"
        raise CheckpointError(
            f"{p}: unknown flavour (expected a GGUF file or a Hugging Face checkpoint folder, "
            "found a file that is not GGUF)"
        )
    folder = CheckpointFolder(p)
    config = folder.fields("config.json")
    hf_quant = folder.fields("hf_quant_config.json")
    has_config = config is not None
    if config is None:
        config = Fields({}, p / "config.json")

    mlx_q = config.obj("quantization")
    if mlx_q is not None and mlx_q.raw("mode") == "nvfp4":
        return "mlx"
    algo = _modelopt_algo(hf_quant)
    if algo is not None and (algo in MODELOPT_NVFP4_ALGOS or algo == "MIXED_PRECISION"):
        return "modelopt"
    qc = config.obj("quantization_config")
    if qc is not None:
        method = qc.raw("quant_method")
        if method == "modelopt":
            return "modelopt"
        if method == "compressed-tensors":
            fmt = qc.raw("format")
            groups = qc.obj("config_groups")
            group_formats = set()
            for key, _ in groups.items() if groups is not None else ():
                # a string or absent, checked where it is read (a list is no set member)
                group_formats.add(groups.obj(key, required=True).text("format"))  # type: ignore[union-attr]
            if fmt == CT_NVFP4_FORMAT or (
                fmt == "mixed-precision" and CT_NVFP4_FORMAT in group_formats
            ):
                return "compressed-tensors"
            raise CheckpointError(
                f"{p}: unknown flavour (compressed-tensors format {short(fmt)}, not "
                f"{CT_NVFP4_FORMAT!r})"
            )
        found = f"quantization_config.quant_method {short(method)}"
    elif algo is not None:
        found = f"hf_quant_config.json quant_algo {short(algo)}"
    elif not has_config and hf_quant is None:
        found = "no config.json"
    elif not config.data:
        found = "config.json is an empty object {}"
    else:
        found = "config.json without an NVFP4 quantization config"
    raise CheckpointError(
        f"{p}: unknown flavour ({found}; expected ModelOpt, compressed-tensors "
        "nvfp4-pack-quantized, nvfp4 MLX or GGUF)"
    )
