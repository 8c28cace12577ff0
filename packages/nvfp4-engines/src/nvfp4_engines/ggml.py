"""``ggml``: ggml-cpu's own NVFP4 code (llama.cpp's tensor library), through ctypes on the
prebuilt ``libggml`` of libggml-python, the one llama-cpp-python bundles, or a source build's
(``NVFP4_GGML_LIB_DIR``; see :mod:`nvfp4_engines._libggml`).

What the engine has, and the kernel each becomes:

* the type traits' ``to_float`` of ``GGML_TYPE_NVFP4`` -> :meth:`dequantize` (float32,
  then the tensor's ``.scale`` multiplied in as llama.cpp does, then one cast);
* ``ggml_mul(ggml_mul_mat(w, x), scale)``, the graph llama.cpp builds for an NVFP4 linear
  -> :meth:`qmm_w4a8`. ggml-cpu quantizes ``x`` to its ``vec_dot_type`` (Q8_0: int8 in
  blocks of 32 with a float16 scale) before the dot products, so this is W4A8 (spec 1.1,
  capability ``w4a8``), not W4A16: there is no ``qmm``;
* the CPU type traits' ``from_float`` of that ``vec_dot_type`` (the quantizer ``mul_mat``
  runs) -> :meth:`quantize_activations_q8`;
* ``ggml_quantize_chunk(GGML_TYPE_NVFP4, ...)``, the quantizer llama.cpp's tools write NVFP4
  tensors with -> :meth:`quantize_activations` (the contract's only NVFP4 encoder: the
  spec's encoder rule is the same for weights and activations). ggml's quantizer takes no
  global (GGUF's ``.scale`` is the converter's business), so it encodes x as it is and the
  planes carry global 1.0, what a GGUF reader takes for a tensor without ``.scale``;
  ``input_scale`` has nowhere to go;
* ``ggml_mul_mat_id(w, x, ids)``, llama.cpp's MoE matmul, then the expert's ``.scale`` ->
  :meth:`gather_qmm_w4a8`. ggml gives no result for an id outside ``[0, E)`` (its CPU
  kernel indexes with it unchecked), so such ids are refused here with a ``ValueError``
  rather than handed to ggml: the spec's zero rows are not what ggml does.

ggml reads the bytes of :func:`nvfp4.layouts.gguf.to_gguf` (lossless): K must be a
multiple of 64, and a fused tensor is one ggml tensor per partition
(:mod:`nvfp4_engines._gguf`). Activations are handed to ggml as float32, as llama.cpp's are
(a float16 / bfloat16 ``x`` widens exactly).
"""

from __future__ import annotations

import ctypes
import os
import weakref
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt
from nvfp4.activations import Q8Activations
from nvfp4.backend import Frontend
from nvfp4.contract import Availability
from nvfp4.dtypes import OUTPUT_DTYPES
from nvfp4.layouts.gguf import from_gguf, gguf_row_bytes
from nvfp4.planes import NVFP4Planes, PlaneError
from nvfp4.spec import GGUF_SUPER_BLOCK, Q8_BLOCK_SIZE

from . import _libggml as lib
from ._common import adapter_info, dist_version, numpy_in, numpy_out
from ._gguf import GgufWeight, to_gguf_weight

__all__ = ["DISTRIBUTION", "NAME", "GgmlKernels", "GgmlWeight", "backend"]

NAME: Final = "ggml"
#: The pinned carrier of libggml (``nox -s engines``); llama-cpp-python's copy serves too.
DISTRIBUTION: Final = "libggml-python"
#: ggml-cpu threads per graph (the conformance shapes are small).
THREADS: Final = max(1, min(4, os.cpu_count() or 1))
#: A Q8_0 block: a float16 d, then 32 int8 codes (ggml's ``block_q8_0``).
Q8_0_BLOCK: Final = np.dtype([("d", "<f2"), ("qs", "i1", (Q8_BLOCK_SIZE,))])


@dataclass
class GgmlWeight:
    """A prepared weight: one ggml context holding an NVFP4 tensor per partition (``[K, N]``
    or ``[K, N, E]`` in ggml's order), and the GGUF form it was made from (``.scale``)."""

    gguf: GgufWeight
    ctx: int
    tensors: list[int] = field(default_factory=list)


def _ggml() -> lib.Ggml:
    try:
        return lib.load()
    except lib.GgmlUnavailable as exc:
        raise RuntimeError(f"NVFP4 backend {NAME!r} cannot run here: {exc}") from None


def _context(g: lib.Ggml, nbytes: int, tensors: int) -> int:
    mem = nbytes + tensors * (g.base.ggml_tensor_overhead() + 64) + g.base.ggml_graph_overhead()
    ctx = g.base.ggml_init(lib.InitParams(mem + (1 << 16), None, False))
    if not ctx:
        raise MemoryError(f"ggml_init({mem} bytes) failed")
    return int(ctx)


def _fill(g: lib.Ggml, tensor: int, a: npt.NDArray[Any]) -> None:
    a = np.ascontiguousarray(a)
    if g.base.ggml_nbytes(tensor) != a.nbytes:
        raise RuntimeError(
            f"ggml tensor of {g.base.ggml_nbytes(tensor)} bytes, {a.nbytes} bytes given"
        )
    ctypes.memmove(g.base.ggml_get_data(tensor), a.ctypes.data, a.nbytes)


def _compute(g: lib.Ggml, ctx: int, out: int, shape: tuple[int, ...]) -> npt.NDArray[np.float32]:
    """Build and run the graph ending at ``out`` (float32) and copy its data out."""
    graph = g.base.ggml_new_graph(ctx)
    g.base.ggml_build_forward_expand(graph, out)
    plan = g.cpu.ggml_graph_plan(graph, THREADS, g.threadpool(THREADS))
    work = np.empty(max(1, plan.work_size), np.uint8)
    plan.work_data = work.ctypes.data
    status = g.cpu.ggml_graph_compute(graph, ctypes.byref(plan))
    if status != 0:
        raise RuntimeError(f"ggml_graph_compute returned status {status}")
    n = int(np.prod(shape))
    buf = (ctypes.c_float * n).from_address(g.base.ggml_get_data(out))
    return np.ctypeslib.as_array(buf).reshape(shape).copy()


def _f32(x: npt.NDArray[Any]) -> npt.NDArray[np.float32]:
    return np.ascontiguousarray(x, dtype=np.float32)


def _cast(y: npt.NDArray[np.float32], dtype: str) -> npt.NDArray[Any]:
    with np.errstate(over="ignore"):  # float16 overflow to +-inf is the cast's result
        return y.astype(OUTPUT_DTYPES[dtype])


class GgmlKernels:
    """The kernel contract over libggml-cpu (numpy arrays in and out)."""

    def __init__(self) -> None:
        # the certificate names the distribution whose libggml is installed
        carrier = next((d for d in lib.DISTRIBUTIONS if dist_version(d)), DISTRIBUTION)
        self.info = adapter_info(
            NAME,
            carrier,
            frozenset({"dequantize", "fused_partitions", "quantize_activations", "w4a8"}),
            (
                f"ggml-cpu from {carrier}'s libggml (or NVFP4_GGML_LIB_DIR's), through ctypes",
                "dequantize: the NVFP4 type traits' to_float, times the tensor's .scale",
                "W4A8: ggml_mul(ggml_mul_mat(w, x), scale), x quantized by ggml to Q8_0; "
                "MoE: ggml_mul_mat_id, then the expert's .scale",
                "quantize_activations: ggml_quantize_chunk(GGML_TYPE_NVFP4), which takes no "
                "global: the planes carry 1.0 and input_scale goes nowhere",
                "absent: ggml-cpu has no W4A16 matmul (mul_mat always quantizes x to Q8_0)",
                "ids outside [0, E) refused before ggml_mul_mat_id, which has no result for them",
            ),
        )

    def availability(self) -> Availability:
        try:
            g = lib.load()
        except lib.GgmlUnavailable as exc:
            return Availability(False, str(exc))
        vdt = g.traits_cpu(lib.GGML_TYPE_NVFP4).vec_dot_type
        if vdt != lib.GGML_TYPE_Q8_0:
            return Availability(
                False,
                f"this libggml's NVFP4 vec_dot_type is {g.base.ggml_type_name(vdt)!r}, not q8_0 "
                f"(the W4A8 int8 rule of spec 1.1): {lib.INSTALL}",
            )
        isa = "/".join(g.features) or "portable"
        return Availability(True, device=f"ggml-cpu ({isa}), {g.source}")

    # ------------------------------------------------------------------- weights
    def prepare(self, planes: NVFP4Planes) -> GgmlWeight:
        g = _ggml()
        gw = to_gguf_weight(planes)
        nbytes = sum(t.data.nbytes for t in gw.tensors)
        w = GgmlWeight(gw, _context(g, nbytes, len(gw.tensors)))
        weakref.finalize(w, g.base.ggml_free, w.ctx)
        for t in gw.tensors:
            e = gw.num_experts
            if e is None:
                wt = g.base.ggml_new_tensor_2d(w.ctx, lib.GGML_TYPE_NVFP4, gw.k, t.rows)
            else:
                wt = g.base.ggml_new_tensor_3d(w.ctx, lib.GGML_TYPE_NVFP4, gw.k, t.rows, e)
            _fill(g, wt, t.data)
            w.tensors.append(wt)
        return w

    def dequantize(self, w: GgmlWeight, *, dtype: str) -> npt.NDArray[Any]:
        g = _ggml()
        to_float = g.traits(lib.GGML_TYPE_NVFP4).to_float
        parts = []
        for t in w.gguf.tensors:
            data = np.ascontiguousarray(t.data)
            v = np.empty((*data.shape[:-1], w.gguf.k), np.float32)
            to_float(data.ctypes.data, v.ctypes.data, v.size)
            scale = t.scale.reshape(-1, 1, 1) if w.gguf.num_experts is not None else t.scale[0]
            parts.append(v * scale)  # llama.cpp multiplies the .scale in, in float32
        return _cast(np.concatenate(parts, axis=-2), dtype)

    # ------------------------------------------------------------------- encoder
    def quantize_activations(self, x: npt.NDArray[Any], *, input_scale: float | None) -> Any:
        g = _ggml()
        x32 = _f32(x)
        m, k = x32.shape
        if k % GGUF_SUPER_BLOCK:  # ggml asserts (aborts) on a partial super-block
            raise PlaneError(
                "activation", "K for GGUF NVFP4", f"a multiple of {GGUF_SUPER_BLOCK}", f"K = {k}"
            )
        if g.base.ggml_quantize_requires_imatrix(lib.GGML_TYPE_NVFP4):
            raise RuntimeError("this libggml's NVFP4 quantizer needs an importance matrix")
        data = np.empty((m, gguf_row_bytes(k)), np.uint8)
        g.base.ggml_quantize_chunk(
            lib.GGML_TYPE_NVFP4, x32.ctypes.data, data.ctypes.data, 0, m, k, None
        )
        return from_gguf(data, None, name="activation")  # no .scale: global 1.0

    # ------------------------------------------------------------------- W4A8 int8
    def quantize_activations_q8(self, x: npt.NDArray[Any]) -> Q8Activations:
        g = _ggml()
        vdt = g.traits_cpu(lib.GGML_TYPE_NVFP4).vec_dot_type
        from_float = g.traits_cpu(vdt).from_float
        x32 = _f32(x)
        m, k = x32.shape
        blocks = np.empty((m, k // Q8_BLOCK_SIZE), Q8_0_BLOCK)
        from_float(x32.ctypes.data, blocks.ctypes.data, x32.size)
        return Q8Activations(
            codes=np.ascontiguousarray(blocks["qs"].reshape(m, k)),
            d=np.ascontiguousarray(blocks["d"]),
        )

    def qmm_w4a8(self, x: npt.NDArray[Any], w: GgmlWeight, *, out_dtype: str) -> Any:
        g = _ggml()
        x32 = _f32(x)
        m, k = x32.shape
        outs = []
        for wt, t in zip(w.tensors, w.gguf.tensors, strict=True):
            ctx = _context(g, x32.nbytes + 8 * m * t.rows + 4, 5)
            try:
                xt = g.base.ggml_new_tensor_2d(ctx, lib.GGML_TYPE_F32, k, m)
                _fill(g, xt, x32)
                st = g.base.ggml_new_tensor_1d(ctx, lib.GGML_TYPE_F32, 1)
                _fill(g, st, t.scale)
                yt = g.base.ggml_mul(ctx, g.base.ggml_mul_mat(ctx, wt, xt), st)
                outs.append(_compute(g, ctx, yt, (m, t.rows)))
            finally:
                g.base.ggml_free(ctx)
        return _cast(np.concatenate(outs, axis=-1), out_dtype)

    def gather_qmm_w4a8(
        self,
        x: npt.NDArray[Any],
        w: GgmlWeight,
        expert_ids: npt.NDArray[Any],
        *,
        sorted_indices: bool,
        out_dtype: str,
    ) -> Any:
        g = _ggml()
        e = int(w.gguf.num_experts or 0)
        ids = np.asarray(expert_ids).astype(np.int64)
        bad = (ids < 0) | (ids >= e)
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(
                f"gather_qmm_w4a8({w.gguf.name!r}): expert id {int(ids[i])} at row {i} is "
                f"outside [0, {e}): ggml_mul_mat_id has no result for it (unchecked index)"
            )
        x32 = _f32(x)
        m, k = x32.shape
        ids32 = ids.astype(np.int32)
        outs = []
        for wt, t in zip(w.tensors, w.gguf.tensors, strict=True):
            ctx = _context(g, x32.nbytes + 4 * m + 4 * m * t.rows, 5)
            try:
                xt = g.base.ggml_new_tensor_3d(ctx, lib.GGML_TYPE_F32, k, 1, m)
                _fill(g, xt, x32)
                it = g.base.ggml_new_tensor_2d(ctx, lib.GGML_TYPE_I32, 1, m)
                _fill(g, it, ids32)
                yt = g.base.ggml_mul_mat_id(ctx, wt, xt, it)
                y = _compute(g, ctx, yt, (m, t.rows))
            finally:
                g.base.ggml_free(ctx)
            outs.append(y * t.scale[ids][:, None])  # the expert's .scale, as llama.cpp
        return _cast(np.concatenate(outs, axis=-1), out_dtype)

    def from_numpy(self, a: npt.NDArray[Any]) -> npt.NDArray[Any]:
        return numpy_in(a)

    def to_numpy(self, a: Any) -> npt.NDArray[Any]:
        return numpy_out(a)


def backend() -> Frontend:
    """Entry-point factory (``ggml = "nvfp4_engines.ggml:backend"``): cheap, never raises."""
    return Frontend(GgmlKernels())
