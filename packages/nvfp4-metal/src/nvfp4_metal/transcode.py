"""Canonical NVFP4 planes -> MLX arrays, three ways.

* :func:`transcode` - **the direct transcode** (the default, ``impl="native"``). The code
  bytes are viewed as little-endian uint32 words (:func:`nvfp4.layouts.to_mlx`, a numpy
  view) and copied once into an ``mx.array``; the E4M3 scale bytes are copied as they are;
  the decode global becomes a float32 **sidecar** multiplied into the matmul output: a
  scalar, a per-row vector for fused partitions (q/k/v, gate/up), ``(E, 1)`` per expert or
  ``(E, N)`` per expert and partition. No dense matrix exists at any point, and nothing is
  re-derived: MLX's ``nvfp4`` kernels decode ``e2m1(code) * e4m3(scale)`` from the very
  bytes of the checkpoint, and the global is applied once, after accumulation (spec 1.0).
* :func:`requantize_dense` - the path engines take today, kept for the load benchmark and
  the parity comparison: decode to float16 (``mx.dequantize`` with MLX's global), then
  ``mx.quantize(mode="nvfp4", global_scale=amax)`` per tensor / expert / partition, the way
  ``mlx_lm`` quantizes experts. It builds dense float16 matrices, re-derives every block
  scale (in float16 on MLX's CPU device, whose encoder also breaks ties toward zero) and
  changes the global to ``amax / 2688`` of the decoded tensor.
* :func:`affine` - the ``NVFP4_METAL_IMPL=affine`` rollback: exact dense decode (global
  included), cast to bfloat16, ``mx.quantize(mode="affine", bits=4)`` with group 64 (32
  when K % 64 != 0); the scales and biases widened to float32 so the matmul computes in
  float32 like the native path. Lossy; for comparison only.

:func:`prepare` picks :func:`transcode` or :func:`affine` by ``impl`` (default
``$NVFP4_METAL_IMPL``). Every path validates the planes' structure and content first.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Literal

import mlx.core as mx
import numpy as np
import numpy.typing as npt
from nvfp4.fusion import partition_globals
from nvfp4.layouts import MLXPlanes, from_mlx, mlx_global_scale_arg, to_mlx
from nvfp4.planes import NVFP4Planes, PlaneError, expand_row_global, validate
from nvfp4.shapes import WeightShape
from nvfp4.spec import BLOCK_SIZE, GLOBAL_AMAX_DIVISOR

from .settings import Impl, resolve_impl

__all__ = [
    "MetalWeight",
    "Source",
    "affine",
    "decode_native",
    "prepare",
    "requantize_dense",
    "row_global_sidecar",
    "to_planes",
    "transcode",
]

Source = Literal["direct", "dense", "affine"]

#: Affine rollback: bits and the group sizes tried in order.
AFFINE_BITS = 4
AFFINE_GROUPS = (64, 32)


@dataclass(frozen=True, eq=False)
class MetalWeight(WeightShape):
    """One NVFP4 weight as MLX arrays (a backend handle; the modules hold the same arrays).

    Attributes:
        name: the tensor's name (for errors).
        shape: logical ``(E?, N, K)``.
        impl: ``"native"`` (MLX ``mode="nvfp4"``) or ``"affine"`` (the rollback).
        source: ``"direct"`` (bytes reinterpreted), ``"dense"`` (re-quantized through a dense
            float16 matrix) or ``"affine"``.
        weight: native: uint32 ``[E?, N, K/8]`` (the canonical code bytes as little-endian
            words); affine: MLX's affine-packed uint32 ``[E?, N, K/8]``.
        scales: native: uint8 E4M3 bytes ``[E?, N, K/16]``; affine: float32 per group
            (bfloat16 values, widened).
        row_global: native: the float32 decode-global sidecar, ``()`` or ``(N,)`` for a 2-D
            weight, ``(E, 1)`` or ``(E, N)`` for experts; ``None`` for affine (folded in).
        biases: affine only: float32 per group (bfloat16 values, widened).
        group_size: 16 (native) or the affine group.
        global_scale: the canonical global (``()``, ``(E,)``, ``(P,)`` or ``(E, P)``).
        partitions: fused-partition row boundaries, or ``None``.
    """

    name: str
    shape: tuple[int, ...]
    impl: Impl
    source: Source
    weight: mx.array
    scales: mx.array
    row_global: mx.array | None
    biases: mx.array | None
    group_size: int
    global_scale: npt.NDArray[np.float32]
    partitions: tuple[int, ...] | None = None

    @property
    def nbytes(self) -> int:
        """Bytes held on the device (weight, scales, biases, sidecar)."""
        arrays = (self.weight, self.scales, self.biases, self.row_global)
        return int(sum(a.nbytes for a in arrays if a is not None))

    def __repr__(self) -> str:
        return (
            f"MetalWeight({self.name!r}, shape={self.shape}, impl={self.impl}, "
            f"source={self.source}, partitions={self.partitions})"
        )


def row_global_sidecar(
    global_scale: npt.NDArray[np.float32],
    partitions: tuple[int, ...] | None,
    experts: int | None,
    n: int,
) -> npt.NDArray[np.float32]:
    """The sidecar's shape: a scalar global stays ``()`` (2-D) or ``(E, 1)`` (per expert);
    per-partition globals are repeated over their rows, ``(N,)`` or ``(E, N)``."""
    g = np.asarray(global_scale, dtype=np.float32)
    if partitions is None:
        if experts is None:
            return g.reshape(())
        return np.ascontiguousarray(np.broadcast_to(g.reshape(-1), (experts,)).reshape(experts, 1))
    return expand_row_global(g, partitions, experts, n)


def transcode(planes: NVFP4Planes) -> MetalWeight:
    """The direct transcode (module docstring): validate (structure and content), view the
    code bytes as uint32 words, copy codes and scales once into MLX, keep the global as a
    sidecar. No dense matrix, no arithmetic on the bytes."""
    mp = to_mlx(planes)  # validates content; a view when the codes are contiguous
    g = np.array(mp.global_scale, dtype=np.float32)
    weight, scales = mlx_ready(mp.weight), mlx_ready(mp.scales)
    return _native_weight(planes, "direct", mx.array(weight), mx.array(scales), g)


def mlx_ready(a: Any) -> npt.NDArray[Any]:
    """``a`` as MLX can take it from numpy: MLX refuses any negative stride (a reversed view;
    numpy calls a reversed axis of length 1 contiguous, so ``np.ascontiguousarray`` may keep
    it), so such an array is copied in C order; any other is passed as it is."""
    a = np.asarray(a)
    if a.flags.c_contiguous and all(st >= 0 for st in a.strides):
        return a
    return np.array(a, order="C", copy=True)


def _native_weight(
    planes: NVFP4Planes,
    source: Source,
    weight: mx.array,
    scales: mx.array,
    global_scale: npt.NDArray[np.float32],
) -> MetalWeight:
    """A native weight of ``planes``' name, shape and partitions, its row-global sidecar
    made from ``global_scale``."""
    sidecar = row_global_sidecar(global_scale, planes.partitions, planes.num_experts, planes.n)
    return MetalWeight(
        name=planes.name,
        shape=planes.shape,
        impl="native",
        source=source,
        weight=weight,
        scales=scales,
        row_global=mx.array(sidecar),
        biases=None,
        group_size=BLOCK_SIZE,
        global_scale=global_scale,
        partitions=planes.partitions,
    )


def to_planes(w: MetalWeight) -> NVFP4Planes:
    """The canonical planes of a native weight, byte for byte (inverse of :func:`transcode`)."""
    if w.impl != "native":
        raise ValueError(
            f"to_planes({w.name!r}): an {w.impl} weight holds no NVFP4 bytes (the rollback "
            "re-quantized them)"
        )
    mp = MLXPlanes(
        weight=np.array(w.weight),
        scales=np.array(w.scales),
        global_scale=w.global_scale,
        partitions=w.partitions,
        name=w.name,
    )
    return from_mlx(mp)


# ------------------------------------------------------------------- the dense path
def _pieces(planes: NVFP4Planes) -> list[tuple[int | None, int, int, float]]:
    """(expert, first row, end row, decode global) for every expert x partition."""
    g = partition_globals(planes)  # (P,) or (E, P)
    bounds = planes.partitions if planes.partitions is not None else (0, planes.n)
    experts: list[int | None] = (
        list(range(planes.num_experts)) if planes.num_experts is not None else [None]
    )
    out = []
    for e in experts:
        row = g if e is None else g[e]
        for p, (a, b) in enumerate(itertools.pairwise(bounds)):
            out.append((e, a, b, float(row[p])))
    return out


def pad_k32(w: mx.array, s: mx.array) -> tuple[mx.array, mx.array, int]:
    """``mx.dequantize(mode="nvfp4")`` on MLX's CPU device needs K % 32 == 0: append zero
    code words and zero scale bytes (they decode to 0) to a K % 32 == 16 weight. Returns
    the arrays and the number of padded columns (0 or 16) to drop after decoding."""
    words = w.shape[-1]
    if (words * 8) % 32 == 0:
        return w, s, 0
    zw = mx.zeros((*w.shape[:-1], 2), dtype=w.dtype)
    zs = mx.zeros((*s.shape[:-1], 1), dtype=s.dtype)
    return mx.concatenate([w, zw], axis=-1), mx.concatenate([s, zs], axis=-1), BLOCK_SIZE


def decode_native(w: MetalWeight) -> mx.array:
    """The exact float32 decode of a native weight: ``mx.dequantize`` without a global gives
    ``e2m1(code) * e4m3(scale)`` exactly; the sidecar global is multiplied once (per row)."""
    wq, s, pad = pad_k32(w.weight, w.scales)
    d = mx.dequantize(wq, s, group_size=BLOCK_SIZE, bits=4, mode="nvfp4", dtype=mx.float32)
    if pad:
        d = d[..., :-pad]
    g = w.row_global
    assert g is not None
    return d * (g if g.ndim == 0 else mx.expand_dims(g, -1))


def requantize_dense(planes: NVFP4Planes) -> MetalWeight:
    """The dense path (module docstring): decode to float16, then ``mx.quantize`` with
    ``mode="nvfp4"`` and ``global_scale = amax`` of the decoded piece, per expert and
    partition. The result's sidecar is MLX's decode global ``amax / 2688`` (float32)."""
    mp = to_mlx(planes)
    w_all = mx.array(mlx_ready(mp.weight))
    s_all = mx.array(mlx_ready(mp.scales))
    out_w, out_s = [], []
    new_g = []
    for e, a, b, g in _pieces(planes):
        w = w_all[a:b] if e is None else w_all[e, a:b]
        s = s_all[a:b] if e is None else s_all[e, a:b]
        w, s, pad = pad_k32(w, s)
        dense = mx.dequantize(
            w,
            s,
            group_size=BLOCK_SIZE,
            bits=4,
            mode="nvfp4",
            global_scale=mx.array(mlx_global_scale_arg(np.float32(g))),
            dtype=mx.float16,
        )
        if pad:
            dense = dense[..., :-pad]
        amax = mx.max(mx.abs(dense)).astype(mx.float32)
        amax = mx.where(amax > 0, amax, mx.array(float(GLOBAL_AMAX_DIVISOR), mx.float32))
        quantized = mx.quantize(
            dense, group_size=BLOCK_SIZE, bits=4, mode="nvfp4", global_scale=amax
        )
        wq, sq = quantized[0], quantized[1]
        mx.eval(wq, sq, amax)
        out_w.append((e, wq))
        out_s.append((e, sq))
        # MLX decodes with global_scale / 2688 in float32
        amax32 = np.asarray(amax, dtype=np.float32)
        new_g.append(np.float32(amax32 / np.float32(GLOBAL_AMAX_DIVISOR)))
        del dense
    weight = _reassemble(out_w, planes.num_experts)
    scales = _reassemble(out_s, planes.num_experts)
    parts_n = 1 if planes.partitions is None else len(planes.partitions) - 1
    garr = np.asarray(new_g, dtype=np.float32)
    if planes.num_experts is not None:
        garr = garr.reshape(planes.num_experts, parts_n)
    if planes.partitions is None:
        garr = garr.reshape(-1) if planes.num_experts is not None else garr.reshape(())
    return _native_weight(planes, "dense", weight, scales, garr)


def _reassemble(pieces: list[tuple[int | None, mx.array]], experts: int | None) -> mx.array:
    """Partitions concatenated along N, experts stacked."""
    if experts is None:
        return mx.concatenate([a for _, a in pieces], axis=0)
    per_expert = [
        mx.concatenate([a for e2, a in pieces if e2 == e], axis=0) for e in range(experts)
    ]
    return mx.stack(per_expert)


# ---------------------------------------------------------------------- the rollback
def affine(planes: NVFP4Planes) -> MetalWeight:
    """``NVFP4_METAL_IMPL=affine``: exact dense decode (global included) to float32, cast
    to bfloat16, then ``mx.quantize(mode="affine", bits=4)`` with group 64, or 32 when
    K % 64 != 0; K % 32 != 0 is refused (MLX's affine groups are 32, 64 or 128)."""
    native = transcode(planes)
    group = next((g for g in AFFINE_GROUPS if planes.k % g == 0), None)
    if group is None:
        raise PlaneError(
            planes.name,
            "K for the affine rollback",
            f"a multiple of {AFFINE_GROUPS[-1]} (MLX affine groups)",
            planes.k,
        )
    dense = decode_native(native).astype(mx.bfloat16)
    wq, sq, bq = mx.quantize(dense, group_size=group, bits=AFFINE_BITS, mode="affine")
    # float32 scales and biases (exact widening): MLX's affine matmul computes in the scales'
    # dtype, and the activations are float32 (see nvfp4_metal.ops, "Compute dtype")
    sq, bq = sq.astype(mx.float32), bq.astype(mx.float32)
    mx.eval(wq, sq, bq)
    del dense
    return MetalWeight(
        name=planes.name,
        shape=planes.shape,
        impl="affine",
        source="affine",
        weight=wq,
        scales=sq,
        row_global=None,
        biases=bq,
        group_size=group,
        global_scale=np.array(planes.global_scale, dtype=np.float32),
        partitions=planes.partitions,
    )


def prepare(planes: NVFP4Planes, *, impl: Impl | str | None = None) -> MetalWeight:
    """Validate ``planes`` (structure and content) and make the weight handle:
    :func:`transcode` for ``impl="native"``, :func:`affine` for ``"affine"``; ``None``
    reads ``$NVFP4_METAL_IMPL``."""
    validate(planes, content=True)
    chosen = resolve_impl(impl) if impl is not None else _env_impl()
    if chosen == "affine":
        return affine(planes)
    return transcode(planes)


def _env_impl() -> Impl:
    from .settings import impl_from_env

    return impl_from_env()
