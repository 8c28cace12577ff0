"""The one reading interface every flavour implements: :class:`Checkpoint`.

A reader's tensors are memory-mapped and handed out one at a time, so a checkpoint of any
size is read with the memory of the tensor in use. Every reader speaks the canonical
language:

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

The readers live with their flavour (:mod:`.modelopt`, :mod:`.compressed_tensors`,
:mod:`.mlx`, :mod:`.gguf`); :func:`nvfp4_checkpoints.open_checkpoint` picks one.
"""

from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import ml_dtypes
import numpy as np
import numpy.typing as npt
from nvfp4.planes import NVFP4Planes, PlaneError
from nvfp4.shapes import WeightShape
from nvfp4.spec import BLOCK_SIZE

from .closing import Closing
from .flavours import Flavour

__all__ = ["FUSED_PATTERNS", "Checkpoint", "PlaneShape", "group_experts", "scalar"]

_EXPERT_RE: Final = re.compile(r"^(?P<head>.*\.experts)\.(?P<idx>\d+)\.(?P<tail>.+)$")
#: llama.cpp's merged experts as a GGUF reader presents them per expert (``blk.0.ffn_up_exps.3``).
_GGUF_EXPERT_RE: Final = re.compile(r"^(?P<head>.*_exps)\.(?P<idx>\d+)$")
#: Fused groups: (member leaf names in order, the fused leaf name).
FUSED_PATTERNS: Final = (
    (("q_proj", "k_proj", "v_proj"), "qkv_proj"),
    (("gate_proj", "up_proj"), "gate_up_proj"),
    (("w1", "w3"), "w13"),
)


@dataclass(frozen=True)
class PlaneShape(WeightShape):
    """Shape facts of a quantized tensor, read from headers only.

    ``shape`` is the logical ``(E?, N, K)``; ``partitions`` the number of fused partitions
    (``None`` when unfused); ``shared_global``: a stacked ``[E, N, K]`` tensor whose one
    global serves every expert (stored with shape ``()`` or ``(1,)``, not ``(E,)``), which
    a writer keeps as one value."""

    shape: tuple[int, ...]
    partitions: int | None = None
    shared_global: bool = False

    @property
    def nbytes(self) -> int:
        """Bytes of the canonical codes and scales."""
        rows = int(np.prod(self.shape[:-1]))
        return rows * (self.k // 2 + self.k // BLOCK_SIZE)


def group_experts(
    names: Sequence[str], shape_of: Callable[[str], PlaneShape]
) -> dict[str, list[str]]:
    """Group ``<head>.experts.<i>.<tail>`` prefixes by ``<head>.experts.{}.<tail>`` (and
    llama.cpp's ``<head>_exps.<i>`` by ``<head>_exps.{}``), in expert order; only complete
    runs ``0..E-1`` of equally shaped 2-D tensors."""
    found: dict[str, dict[int, str]] = {}
    for name in names:
        m = _EXPERT_RE.match(name)
        g = None if m else _GGUF_EXPERT_RE.match(name)
        if m:
            key = f"{m['head']}.{{}}.{m['tail']}"
            found.setdefault(key, {})[int(m["idx"])] = name
        elif g:
            found.setdefault(f"{g['head']}.{{}}", {})[int(g["idx"])] = name
    groups: dict[str, list[str]] = {}
    for key, by_idx in found.items():
        if sorted(by_idx) != list(range(len(by_idx))):
            continue
        members = [by_idx[i] for i in range(len(by_idx))]
        shapes = {(shape_of(m).shape, shape_of(m).partitions) for m in members}
        if len(shapes) == 1 and len(next(iter(shapes))[0]) == 2:
            groups[key] = members
    return groups


class Checkpoint(Closing, ABC):
    """An opened NVFP4 checkpoint (see the module docstring). Use :func:`open_checkpoint`;
    close it (or use it as a context manager) when done."""

    flavour: Flavour
    path: Path
    config: dict[str, Any]
    quant_config: dict[str, Any]

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


def scalar(a: npt.NDArray[Any], name: str) -> float:
    """The one value of an input-scale tensor ``name`` (shape ``()`` or ``(1,)``, a float
    dtype), validated like a global: finite and > 0."""
    if a.size != 1:
        raise PlaneError(name, "input scale", "one value (shape () or (1,))", tuple(a.shape))
    if a.dtype.kind != "f" and a.dtype != np.dtype(ml_dtypes.bfloat16):
        raise PlaneError(name, "input scale dtype", "a float dtype", str(a.dtype))
    v = float(np.asarray(a, dtype=np.float32).reshape(()))
    if not math.isfinite(v) or v <= 0:
        raise PlaneError(name, "input scale", "finite and > 0", v)
    return v
