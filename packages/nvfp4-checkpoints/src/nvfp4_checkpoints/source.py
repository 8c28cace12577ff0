"""What a writer reads, and in which order: :class:`Source` and :func:`plan`.

Every writer streams: the output's layout (names, dtypes, shapes, shards) is planned from
shapes alone, then the tensors are fetched one at a time, each transcoded by
:mod:`nvfp4.layouts` (a byte shuffle, never a decode) and written before the next is read.

* :func:`checkpoint_source` presents an opened :class:`~nvfp4_checkpoints.Checkpoint`;
  :func:`mapping_source` presents mappings ``prefix -> NVFP4Planes`` and ``name -> array``,
  where expert-stacked planes ``[E, N, K]`` under a key containing ``{}`` (``"...experts.{}.
  gate_proj"``) are presented per expert (``experts.0.gate_proj`` ...), as Hugging Face
  checkpoints store them.
* :func:`plan` orders the items naturally by name; with ``stack=True`` complete expert runs
  become one stacked item (GGUF merges experts again).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt
from nvfp4.fusion import stack_experts, unstack_experts
from nvfp4.planes import NVFP4Planes, PlaneError

from .checkpoint import Checkpoint, PlaneShape, group_experts
from .flavours import CheckpointError

__all__ = [
    "SLOW_ENV",
    "Plan",
    "PlaneItem",
    "Progress",
    "Source",
    "TensorItem",
    "checkpoint_source",
    "fetch",
    "mapping_source",
    "natural",
    "plan",
    "plane_items",
    "slow",
]

#: ``progress(tensors_done, tensors_total, bytes_done, bytes_total)``.
Progress = Callable[[int, int, int, int], None]
#: Test hook: seconds to sleep after each tensor (to interrupt a conversion mid-way).
SLOW_ENV: Final = "NVFP4_TEST_SLOW_CONVERT"


class Source:
    """What a writer reads: quantized prefixes (2-D, or stacked without ``{}``) and plain
    tensors, fetched one at a time; ``origin`` is the checkpoint they come from, if any."""

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
        origin: Checkpoint | None = None,
    ) -> None:
        self.prefixes = list(prefixes)
        self.shape_of = shape_of
        self.planes_of = planes_of
        self.input_of = input_of
        self.tensor_names = list(tensor_names)
        self.info_of = info_of
        self.tensor_of = tensor_of
        self.config = dict(config)
        self.origin = origin  # the opened checkpoint being converted, if any
        #: The ``tokenizer=`` given for the output: a Hugging Face tokenizer directory (every
        #: flavour), or a GGUF file holding a tokenizer (Hugging Face / MLX directories).
        self.tokenizer_dir: Path | None = None


def checkpoint_source(src: Checkpoint) -> Source:
    """``src`` as a writer reads it (its tensors fetched from it one at a time)."""
    return Source(
        src.quantized_names(),
        src.plane_shape,
        src.planes,
        src.input_scale,
        src.tensor_names(),
        src.tensor_info,
        src.tensor,
        src.config,
        src,
    )


def mapping_source(
    planes: Mapping[str, NVFP4Planes],
    tensors: Mapping[str, npt.ArrayLike],
    config: Mapping[str, Any],
    input_scales: Mapping[str, float] | None,
) -> Source:
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
        # a stack's one global is shape (); (1,) is the per-expert global of one expert
        shared = i is None and p.num_experts is not None and p.global_scale.ndim == 0
        return PlaneShape(tuple(dims), p.num_partitions, shared)

    def input_of(prefix: str) -> float | None:
        key, _ = members[prefix]
        v = scales.get(prefix, scales.get(key))
        return None if v is None else float(v)

    arrays = {k: np.asarray(v) for k, v in tensors.items()}
    return Source(
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
class PlaneItem:
    key: str  # output prefix ("...experts.{}.proj" for a GGUF expert stack)
    members: list[str]  # source prefixes (several: stack them)
    shape: PlaneShape  # of the output planes
    input_scale: npt.NDArray[np.float32] | None  # () or (E,)


@dataclass
class TensorItem:
    name: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]


@dataclass
class Plan:
    items: list[PlaneItem | TensorItem] = field(default_factory=list)


def _item_key(item: PlaneItem | TensorItem) -> str:
    return item.key if isinstance(item, PlaneItem) else item.name


def natural(s: str) -> list[Any]:
    """Sort key: digit runs compare as numbers (``layers.2`` before ``layers.10``)."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def plan(src: Source, *, stack: bool) -> Plan:
    """Items in natural name order; with ``stack`` complete expert runs become stacks."""
    items: list[PlaneItem | TensorItem] = []
    stacked: set[str] = set()
    if stack:
        for key, members in group_experts(src.prefixes, src.shape_of).items():
            first = src.shape_of(members[0])
            if first.partitions is not None:
                continue
            shape = PlaneShape((len(members), *first.shape), None)
            items.append(PlaneItem(key, members, shape, _stacked_input(src, key, members)))
            stacked.update(members)
    for p in src.prefixes:
        if p in stacked:
            continue
        v = src.input_of(p)
        inp = None if v is None else np.asarray(v, dtype=np.float32)
        items.append(PlaneItem(p, [p], src.shape_of(p), inp))
    for n in src.tensor_names:
        dt, dims = src.info_of(n)
        items.append(TensorItem(n, np.dtype(dt), tuple(dims)))
    items.sort(key=lambda it: natural(_item_key(it)))
    return Plan(items)


def _stacked_input(src: Source, key: str, members: list[str]) -> npt.NDArray[np.float32] | None:
    values = [src.input_of(m) for m in members]
    if all(v is None for v in values):
        return None
    if any(v is None for v in values):
        missing = members[values.index(None)]
        raise CheckpointError(f"{key}: expert {missing!r} has no input_scale but others do")
    return np.asarray(values, dtype=np.float32)


def fetch(src: Source, item: PlaneItem) -> NVFP4Planes:
    """The planes of ``item``: fetched, and stacked when it groups several experts."""
    if len(item.members) == 1 and item.key == item.members[0]:
        return src.planes_of(item.key)
    return stack_experts([src.planes_of(m) for m in item.members], name=item.key)


def slow() -> None:
    """Sleep :data:`SLOW_ENV` seconds when set (the tests interrupt conversions mid-way)."""
    delay = os.environ.get(SLOW_ENV)
    if delay:
        time.sleep(float(delay))


def plane_items(p: Plan) -> list[PlaneItem]:
    """The quantized items of a plan, in its order."""
    return [it for it in p.items if isinstance(it, PlaneItem)]
