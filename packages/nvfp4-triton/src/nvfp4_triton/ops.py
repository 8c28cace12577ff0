"""Launch wrappers: torch tensors in, torch tensors out, tiles from a :class:`KernelConfig`.

These functions trust their arguments' *semantics* only as far as they check them: x is a
2-D floating tensor with K columns on the weight's device, ids are integers, and the weight
is a :class:`~nvfp4_triton.weights.DeviceWeight` (made by :func:`~nvfp4_triton.weights.upload`,
which validated the planes). The backend classes add the user-facing checks and dtype
defaults.

* :func:`dequantize` - planes -> dense ``[E?, N, K]``;
* :func:`gemv` (decode), :func:`gemm` (prefill), :func:`dequant_matmul` (dequantize, then
  ``torch.matmul``) - the three W4A16 paths, :func:`qmm` picks one by name;
* :func:`gather` - MoE, ``"rows"`` or ``"grouped"``;
* :func:`activation_global`, :func:`quantize_activations` - the W4A4 input side;
* :func:`quantize_q8`, :func:`w4a8`, :func:`gather_w4a8` - W4A8 with int8 activations;
* :func:`fp8_input_scale`, :func:`quantize_fp8`, :func:`w4a8_fp8` - W4A8 with FP8
  activations (spec 1.1, "W4A8").
"""

from __future__ import annotations

from typing import Any

import numpy as np
from nvfp4.spec import (
    BLOCK_SIZE,
    E4M3_MAX,
    GLOBAL_AMAX_DIVISOR,
    Q8_BLOCK_SIZE,
    SWIZZLE_ROW_TILE,
    swizzle_128x4_band,
)

from .config import KernelConfig
from .weights import DeviceWeight

__all__ = [
    "GATHER_PATHS",
    "QMM_PATHS",
    "activation_global",
    "dequant_matmul",
    "dequantize",
    "fp8_input_scale",
    "gather",
    "gather_w4a8",
    "gemm",
    "gemv",
    "qmm",
    "quantize_activations",
    "quantize_fp8",
    "quantize_q8",
    "swizzle_band",
    "w4a8",
    "w4a8_fp8",
]

#: The W4A16 paths :func:`qmm` knows.
QMM_PATHS = ("gemv", "gemm", "dequant_matmul")
#: The MoE paths :func:`gather` knows.
GATHER_PATHS = ("rows", "grouped")
#: The most rows of x one GEMV launch multiplies (``BLOCK_M``); more are done in slices.
GEMV_MAX_ROWS = 16


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2_at_least(v: int) -> int:
    return 1 << max(0, (v - 1).bit_length())


def _dot_dtype_name(x_dtype: str, cfg: KernelConfig) -> str:
    """The ``tl.dot`` operand dtype for activations of dtype ``x_dtype`` (a name)."""
    return "float32" if cfg.dot_in_float32 else x_dtype


def _dot_dtype(x: Any, cfg: KernelConfig) -> Any:
    import triton.language as tl

    return getattr(tl, _dot_dtype_name(str(x.dtype).removeprefix("torch."), cfg))


def _check_x(x: Any, w: DeviceWeight) -> None:
    """The launch glue's preconditions (core's verbs establish them; these asserts document
    them for direct callers of this module and cost nothing with ``python -O``)."""
    assert x.ndim == 2, tuple(x.shape)
    assert x.shape[1] == w.k, (tuple(x.shape), w.k)
    assert x.stride(1) == 1, x.stride()
    assert x.device == w.device, (x.device, w.device)


def _dense_out(x: Any, w: DeviceWeight, out_dtype: Any, stack_note: str) -> Any:
    """The (unwritten) output ``[M, N]`` of a matmul by a 2-D weight, after the launch glue's
    preconditions on x (:func:`_check_x`) and on the weight: no expert stack (``stack_note``
    says where one goes)."""
    import torch

    _check_x(x, w)
    assert w.num_experts is None, stack_note
    return torch.empty((x.shape[0], w.n), dtype=out_dtype, device=x.device)


def _routed_ids(
    x: Any, w: DeviceWeight, ids: Any, sorted_indices: bool, verb: str
) -> tuple[Any, bool]:
    """The MoE launch glue's preconditions (x as :func:`_check_x` wants it, an expert stack,
    one id per row of x) and the ids on x's device, contiguous, in ``int32`` or ``int64``;
    with the ``sorted_indices`` hint, dropped when the ids do not honour it (the result never
    depends on it)."""
    import torch

    _check_x(x, w)
    assert w.num_experts is not None, f"{verb} needs an expert stack [E, N, K]"
    m = x.shape[0]
    assert tuple(ids.shape) == (m,), (tuple(ids.shape), m)
    if ids.dtype not in (torch.int32, torch.int64):
        ids = ids.to(torch.int64)
    ids = ids.to(x.device).contiguous()
    if sorted_indices and m > 1 and bool((ids[1:] < ids[:-1]).any()):
        sorted_indices = False  # a false hint is dropped: the result never depends on it
    return ids, sorted_indices


# ------------------------------------------------------------------------- dequantize
def dequantize(w: DeviceWeight, out_dtype: Any, cfg: KernelConfig) -> Any:
    """Dense ``[E?, N, K]`` in ``out_dtype`` (torch float32 / float16 / bfloat16), exact."""
    import torch

    from .kernels.dequantize import dequantize_kernel

    out = torch.empty((w.rows, w.k), dtype=out_dtype, device=w.device)
    t = cfg.dequant
    grid = (_cdiv(w.rows, t.block_n), _cdiv(w.k, t.block_k))
    # Under TRITON_INTERPRET=1 numpy performs the kernel's casts: a float16 output that
    # overflows to +-inf is the spec's defined result, not an error (no effect on a GPU)
    with np.errstate(over="ignore"):
        dequantize_kernel[grid](
            w.codes,
            w.scales,
            w.row_g,
            out,
            w.rows,
            w.k,
            BLOCK_N=t.block_n,
            BLOCK_K=t.block_k,
            num_warps=t.num_warps,
        )
    return out.reshape(w.shape)


# ---------------------------------------------------------------------------- W4A16
def gemv_block_k(block_k: int, block_m: int) -> int:
    """The GEMV's K chunk for ``block_m`` rows of x: the config's (for M = 1) up to 4 rows,
    then halved as the rows double, so the per-thread product tile (and the registers) stay
    about the same size. Larger chunks spend fewer instructions per weight byte (fixed
    per-iteration costs); see ``benchmarks/triton_sass.py``."""
    return max(32, block_k * 4 // max(4, block_m))


def gemv(x: Any, w: DeviceWeight, out_dtype: Any, cfg: KernelConfig) -> Any:
    """W4A16 decode kernel (split-K when the output columns alone cannot fill the device).
    More than :data:`GEMV_MAX_ROWS` rows are done in slices (the weight is then read once
    per slice: use :func:`gemm` for that)."""
    import torch

    from .kernels.gemv import gemv_kernel, splitk_reduce_kernel

    out = _dense_out(x, w, out_dtype, "an expert stack goes through gather()")
    m, k, n = x.shape[0], w.k, w.n
    if m == 0:
        return out
    t = cfg.gemv
    for lo in range(0, m, GEMV_MAX_ROWS):
        xs, os = x[lo : lo + GEMV_MAX_ROWS], out[lo : lo + GEMV_MAX_ROWS]
        rows = xs.shape[0]
        block_m = _pow2_at_least(rows)
        block_k = gemv_block_k(t.block_k, block_m)
        programs = _cdiv(n, t.block_n)
        chunks = _cdiv(k, block_k)
        split = 1
        if t.split_k_programs and programs < t.split_k_programs:
            split = min(t.max_split_k, _cdiv(t.split_k_programs, programs), chunks)
        k_split = _cdiv(chunks, split) * block_k
        split = _cdiv(k, k_split)  # no empty slice
        target = (
            os
            if split == 1
            else torch.empty((split, rows, n), dtype=torch.float32, device=x.device)
        )
        gemv_kernel[(programs, split)](
            xs,
            w.codes,
            w.scales,
            w.row_g,
            target,
            rows,
            n,
            k,
            xs.stride(0),
            os.stride(0),
            k_split,
            BLOCK_M=block_m,
            BLOCK_N=t.block_n,
            BLOCK_K=block_k,
            PARTIAL=split > 1,
            num_warps=t.num_warps,
            num_stages=t.num_stages,
        )
        if split > 1:
            reduce_n = min(1024, _pow2_at_least(n))
            splitk_reduce_kernel[(rows, _cdiv(n, reduce_n))](
                target,
                w.row_g,
                os,
                rows,
                n,
                os.stride(0),
                SPLIT_K=split,
                BLOCK_N=reduce_n,
                num_warps=t.num_warps,
            )
    return out


def gemm(x: Any, w: DeviceWeight, out_dtype: Any, cfg: KernelConfig) -> Any:
    """W4A16 prefill kernel: tiled GEMM, weight tiles dequantized in the K loop."""
    from .kernels.gemm import gemm_kernel

    out = _dense_out(x, w, out_dtype, "an expert stack goes through gather()")
    m, n = x.shape[0], w.n
    if m == 0:
        return out
    t = cfg.gemm_tiles(m)
    grid = (_cdiv(m, t.block_m) * _cdiv(n, t.block_n),)
    gemm_kernel[grid](
        x,
        w.codes,
        w.scales,
        w.row_g,
        out,
        m,
        n,
        w.k,
        x.stride(0),
        out.stride(0),
        BLOCK_M=t.block_m,
        BLOCK_N=t.block_n,
        BLOCK_K=t.block_k,
        GROUP_M=t.group_m,
        DOT_DTYPE=_dot_dtype(x, cfg),
        FP32_PRECISION=cfg.fp32_dot_precision,
        num_warps=t.num_warps,
        num_stages=t.num_stages,
    )
    return out


def dequant_matmul(x: Any, w: DeviceWeight, out_dtype: Any, cfg: KernelConfig) -> Any:
    """Dequantize the weight to x's dtype (the spec's exact decode, global included), then
    ``torch.matmul`` (cuBLAS / hipBLASLt): the dense weight exists for the call's duration.
    The global is folded into the decoded weight because an unscaled float16 product sum
    can overflow; the decoded weight carries the spec's one rounding per element."""
    _check_x(x, w)
    assert w.num_experts is None, "an expert stack goes through gather()"
    dense = dequantize(w, x.dtype, cfg)
    y = x @ dense.t()
    return y if y.dtype == out_dtype else y.to(out_dtype)


def qmm(x: Any, w: DeviceWeight, out_dtype: Any, cfg: KernelConfig, path: str) -> Any:
    """W4A16 ``x @ decode(w).T`` through ``path`` (one of :data:`QMM_PATHS`)."""
    if path == "gemv":
        return gemv(x, w, out_dtype, cfg)
    if path == "gemm":
        return gemm(x, w, out_dtype, cfg)
    if path == "dequant_matmul":
        return dequant_matmul(x, w, out_dtype, cfg)
    raise ValueError(f"unknown qmm path {path!r}; expected one of {', '.join(QMM_PATHS)}")


# ------------------------------------------------------------------------------ MoE
def _grouped_tiles(
    ids: Any, num_experts: int, block_m: int, sorted_indices: bool
) -> tuple[Any, Any, Any, Any, int]:
    """Tile table of the grouped kernel, built on the device without a host copy.

    Returns ``(perm, tiles, T)``: ``perm`` maps sorted positions to rows of x (``None`` when
    the ids are already sorted); ``tiles`` is int64 ``[T, 3]``, row ``t`` = ``(expert, start,
    end)``: tile ``t`` covers sorted positions ``start .. min(start + block_m, end) - 1`` of
    ``expert`` (``E`` for the unused tail of the table).
    """
    import torch

    m, e = ids.shape[0], num_experts
    dev = ids.device
    key = ids.to(torch.int64)
    perm = None
    if not sorted_indices:
        # invalid ids sort after every expert, so no segment contains them
        key = torch.where((key >= 0) & (key < e), key, torch.full_like(key, e))
        perm = torch.argsort(key, stable=True)
        key = key[perm]
    experts = torch.arange(e, dtype=torch.int64, device=dev)
    seg_start = torch.searchsorted(key, experts)
    seg_end = torch.searchsorted(key, experts, right=True)
    tiles = (seg_end - seg_start + block_m - 1) // block_m
    cum = torch.cumsum(tiles, 0)
    total = _cdiv(m, block_m) + min(e, m)  # sum over experts of ceil(count / block_m)
    t = torch.arange(total, dtype=torch.int64, device=dev)
    owner = torch.searchsorted(cum, t, right=True)  # expert of tile t, E past the last tile
    c = owner.clamp(max=e - 1)
    first_tile = cum[c] - tiles[c]
    start = seg_start[c] + (t - first_tile) * block_m
    used = owner < e
    tile_start = torch.where(used, start, torch.zeros_like(start))
    tile_end = torch.where(used, seg_end[c], torch.zeros_like(start))
    return perm, torch.stack((owner, tile_start, tile_end), dim=1).contiguous(), total


def _expert_operands(x: Any, w: DeviceWeight, out: Any) -> tuple[Any, ...]:
    """What both gather kernels take after their row operands: the expert stack's codes,
    scales and row globals, the output, ``N``, ``K``, ``E`` and the row strides of x and
    the output."""
    return (w.codes, w.scales, w.row_g, out, w.n, w.k, w.num_experts, x.stride(0), out.stride(0))


def gather(
    x: Any,
    w: DeviceWeight,
    ids: Any,
    out_dtype: Any,
    cfg: KernelConfig,
    *,
    path: str,
    sorted_indices: bool = False,
) -> Any:
    """MoE W4A16: ``out[m] = x[m] @ decode(w[ids[m]]).T``; ids outside ``[0, E)`` give
    zero rows. ``path``: ``"rows"`` (per-row programs) or ``"grouped"`` (rows grouped by
    expert; with ``sorted_indices`` the caller's order is used, after checking it)."""
    import torch

    from .kernels.gather import gather_grouped_kernel, gather_rows_kernel

    ids, sorted_indices = _routed_ids(x, w, ids, sorted_indices, "gather")
    e, m, n = w.num_experts, x.shape[0], w.n
    t = cfg.gather
    if m == 0:
        return torch.zeros((0, n), dtype=out_dtype, device=x.device)
    if path == "rows":
        out = torch.empty((m, n), dtype=out_dtype, device=x.device)
        gather_rows_kernel[(m, _cdiv(n, t.rows_block_n))](
            x,
            ids,
            *_expert_operands(x, w, out),
            BLOCK_N=t.rows_block_n,
            BLOCK_K=t.rows_block_k,
            num_warps=t.num_warps,
        )
        return out
    if path != "grouped":
        raise ValueError(f"unknown gather path {path!r}; expected one of {', '.join(GATHER_PATHS)}")
    perm, tiles, total = _grouped_tiles(ids, e, t.block_m, sorted_indices)
    out = torch.zeros((m, n), dtype=out_dtype, device=x.device)
    gather_grouped_kernel[(total, _cdiv(n, t.block_n))](
        x,
        ids,
        perm if perm is not None else tiles,  # never read without HAS_PERM
        tiles,
        *_expert_operands(x, w, out),
        BLOCK_M=t.block_m,
        BLOCK_N=t.block_n,
        BLOCK_K=t.block_k,
        DOT_DTYPE=_dot_dtype(x, cfg),
        FP32_PRECISION=cfg.fp32_dot_precision,
        HAS_PERM=perm is not None,
        num_warps=t.num_warps,
        num_stages=t.num_stages,
    )
    return out


# ------------------------------------------------------------------------ activations
def activation_global(x: Any, input_scale: Any = None) -> Any:
    """The activation global as a float32 tensor of one element on x's device: the static
    ``input_scale`` (decode convention, finite and > 0) or ``amax / 2688`` over x's finite
    values (1.0 where that quotient is 0: amax 0, or subnormal enough to underflow), computed
    in float32 as :func:`nvfp4.reference.global_from_amax` does."""
    return _static_or_amax_over(x, input_scale, GLOBAL_AMAX_DIVISOR)


def _static_or_amax_over(x: Any, input_scale: Any, divisor: float) -> Any:
    """``input_scale`` (checked by core: finite and > 0) as a float32 tensor of one element
    on x's device, or ``amax / divisor`` over x's finite values in float32 (one division:
    the divisors, 2688 and 448, are exact), 1.0 where that quotient is 0."""
    import torch

    if input_scale is not None:
        return torch.tensor([float(np.float32(input_scale))], dtype=torch.float32, device=x.device)
    xf = x.to(torch.float32)
    if xf.numel() == 0:
        return torch.ones(1, dtype=torch.float32, device=x.device)
    amax = torch.where(torch.isfinite(xf), xf.abs(), torch.zeros_like(xf)).amax().reshape(1)
    s = amax / float(divisor)
    return torch.where(s == 0, torch.ones_like(s), s)


_BANDS: dict[tuple[int, str], tuple[Any, int]] = {}


def swizzle_band(k_blocks: int, device: Any) -> tuple[Any, int]:
    """Byte offsets (int64 ``[128 * k_blocks]``, row-major) of one 128-row band of the 128x4
    swizzled scale layout, from :func:`nvfp4.spec.swizzle_128x4_band`, and the byte
    stride between bands. Cached per (k_blocks, device)."""
    import torch

    key = (k_blocks, str(device))
    if key not in _BANDS:
        band, stride = swizzle_128x4_band(k_blocks)
        _BANDS[key] = (torch.from_numpy(band.copy()).to(device), stride)  # band is read-only
    return _BANDS[key]


def quantize_activations(
    x: Any, g: Any, cfg: KernelConfig, *, swizzled: bool = False
) -> tuple[Any, Any]:
    """Encode ``x`` ``[M, K]`` with the global ``g`` (a float32 tensor of one element, see
    :func:`activation_global`): returns ``(codes uint8 [M, K/2], scales)`` with scales
    uint8 ``[M, K/16]`` (linear) or the flat 128x4-swizzled buffer (zero padding)."""
    import torch

    from .kernels.quantize import quantize_kernel

    m, k = x.shape  # core checked: 2-D, a float dtype, K a positive multiple of 16
    if x.stride(1) != 1:
        x = x.contiguous()
    kb = k // BLOCK_SIZE
    codes = torch.empty((m, k // 2), dtype=torch.uint8, device=x.device)
    if swizzled:
        band, stride = swizzle_band(kb, x.device)
        rows_p = _cdiv(max(m, 1), SWIZZLE_ROW_TILE) * SWIZZLE_ROW_TILE
        scales = torch.zeros(
            rows_p // SWIZZLE_ROW_TILE * stride, dtype=torch.uint8, device=x.device
        )
    else:
        band, stride = codes, 0  # never read without SWIZZLED
        scales = torch.empty((m, kb), dtype=torch.uint8, device=x.device)
    if m == 0:
        return codes, scales
    t = cfg.quant
    quantize_kernel[(_cdiv(m, t.block_m), _cdiv(kb, t.block_kb))](
        x,
        g,
        codes,
        scales,
        band,
        m,
        k,
        x.stride(0),
        stride,
        BLOCK_M=t.block_m,
        BLOCK_KB=t.block_kb,
        SWIZZLED=swizzled,
        num_warps=t.num_warps,
    )
    return codes, scales


# ------------------------------------------------------------------------------ W4A8
def _quiet() -> Any:
    """numpy's floating-point warnings off for a launch: under ``TRITON_INTERPRET=1`` numpy
    performs the kernels' arithmetic, and ``1 / 0`` (masked off by a ``where``), a float16
    ``d`` rounding to inf or a NaN activation are the spec's defined results, not errors
    (no effect on a GPU)."""
    return np.errstate(divide="ignore", over="ignore", invalid="ignore")


def _w4a8_block_m(m: int, cfg: KernelConfig) -> int:
    """The W4A8 row tile: the config's, or fewer rows (at least 16, ``tl.dot``'s smallest
    tile) when x has fewer."""
    return max(16, min(cfg.w4a8.block_m, _pow2_at_least(m)))


def quantize_q8(
    x: Any, cfg: KernelConfig, ids: Any = None, num_experts: int = 0
) -> tuple[Any, Any]:
    """int8 W4A8 activations of ``x [M, K]`` (K a multiple of 32; core checked it): codes
    int8 ``[M, K]`` and ``d`` float16 ``[M, K/32]``, bit-identical to
    :func:`nvfp4.reference.quantize_activations_q8`. With ``ids`` (int64 ``[M]``), rows whose
    id lies outside ``[0, num_experts)`` are not read and encode as zeros."""
    import torch

    from .kernels.w4a8 import quantize_q8_kernel

    m, k = x.shape
    assert k % Q8_BLOCK_SIZE == 0, k
    if x.stride(1) != 1:
        x = x.contiguous()
    kb = k // Q8_BLOCK_SIZE
    codes = torch.empty((m, k), dtype=torch.int8, device=x.device)
    d = torch.empty((m, kb), dtype=torch.float16, device=x.device)
    if m == 0:
        return codes, d
    t = cfg.quant
    block_kb = max(1, t.block_kb // 2)  # the same elements per program as the W4A4 encoder
    with _quiet():
        quantize_q8_kernel[(_cdiv(m, t.block_m), _cdiv(kb, block_kb))](
            x,
            codes,
            d.view(torch.int16),  # written as float16 bits
            ids if ids is not None else codes,  # never read without HAS_IDS
            m,
            k,
            num_experts,
            x.stride(0),
            BLOCK_M=t.block_m,
            BLOCK_KB=block_kb,
            HAS_IDS=ids is not None,
            num_warps=t.num_warps,
        )
    return codes, d


def _w4a8_launch(
    grid: tuple[int, int],
    codes: Any,
    d: Any,
    tables: tuple[Any, Any, Any],
    w: DeviceWeight,
    out: Any,
    m: int,
    block_m: int,
    cfg: KernelConfig,
    *,
    gather: bool,
    has_perm: bool,
) -> None:
    from .kernels.w4a8 import w4a8_kernel

    t = cfg.w4a8
    with _quiet():
        w4a8_kernel[grid](
            codes,
            d,
            *tables,
            w.codes,
            w.scales,
            w.row_g,
            out,
            m,
            w.n,
            w.k,
            w.num_experts or 1,
            out.stride(0),
            BLOCK_M=block_m,
            BLOCK_N=t.block_n,
            SUB=t.sub,
            GATHER=gather,
            HAS_PERM=has_perm,
            num_warps=t.num_warps,
            num_stages=t.num_stages,
        )


def w4a8(x: Any, w: DeviceWeight, out_dtype: Any, cfg: KernelConfig) -> Any:
    """W4A8 int8: ``x`` quantized by :func:`quantize_q8`, then ``(sum_j isum_j * e4m3(s_j) / 2
    * d) * global`` (int8 ``tl.dot``, float32 accumulation, the global after it)."""
    out = _dense_out(x, w, out_dtype, "an expert stack goes through gather_w4a8()")
    m, n = x.shape[0], w.n
    if m == 0:
        return out
    codes, d = quantize_q8(x, cfg)
    block_m = _w4a8_block_m(m, cfg)
    unused = (codes, codes, codes)  # the gather tables, never read
    grid = (_cdiv(m, block_m), _cdiv(n, cfg.w4a8.block_n))
    _w4a8_launch(grid, codes, d, unused, w, out, m, block_m, cfg, gather=False, has_perm=False)
    return out


def gather_w4a8(
    x: Any, w: DeviceWeight, ids: Any, out_dtype: Any, cfg: KernelConfig, *, sorted_indices: bool
) -> Any:
    """MoE W4A8 int8: ``out[m] = w4a8(x[m], w[ids[m]])``; ids outside ``[0, E)`` give zero
    rows whose x is never read (not by the encoder either: only routed rows are
    quantized). Rows are grouped by expert (the W4A16 grouped gather's tile table)."""
    import torch

    ids, sorted_indices = _routed_ids(x, w, ids, sorted_indices, "gather_w4a8")
    ids = ids.to(torch.int64)  # the encoder and the matmul read int64 ids
    e, m, n = w.num_experts, x.shape[0], w.n
    out = torch.zeros((m, n), dtype=out_dtype, device=x.device)
    if m == 0:
        return out
    # Rows of out-of-range ids are not read by the encoder (they encode as zeros) and the
    # matmul never reads their codes (the tile table leaves them out).
    codes, d = quantize_q8(x, cfg, ids, e)
    block_m = _w4a8_block_m(m, cfg)
    perm, tiles, total = _grouped_tiles(ids, e, block_m, sorted_indices)
    tables = (ids, perm if perm is not None else tiles, tiles)
    grid = (total, _cdiv(n, cfg.w4a8.block_n))
    _w4a8_launch(
        grid, codes, d, tables, w, out, m, block_m, cfg, gather=True, has_perm=perm is not None
    )
    return out


def fp8_input_scale(x: Any, input_scale: Any = None) -> Any:
    """The FP8 activation scale as a float32 tensor of one element on x's device: the static
    ``input_scale`` (finite and > 0) or ``amax / 448`` over x's finite values in float32
    (1.0 where that quotient is 0), as :func:`nvfp4.reference.fp8_input_scale`."""
    return _static_or_amax_over(x, input_scale, E4M3_MAX)


def quantize_fp8(x: Any, s: Any, cfg: KernelConfig) -> Any:
    """FP8 E4M3 codes (uint8 ``[M, K]``) of ``x / s`` (``s``: :func:`fp8_input_scale`),
    bit-identical to :func:`nvfp4.reference.quantize_activations_fp8`."""
    import torch

    from .kernels.w4a8 import quantize_fp8_kernel

    m, k = x.shape
    if x.stride(1) != 1:
        x = x.contiguous()
    codes = torch.empty((m, k), dtype=torch.uint8, device=x.device)
    if m == 0:
        return codes
    t = cfg.quant
    block_k = t.block_kb * BLOCK_SIZE
    with _quiet():
        quantize_fp8_kernel[(_cdiv(m, t.block_m), _cdiv(k, block_k))](
            x,
            s,
            codes,
            m,
            k,
            x.stride(0),
            BLOCK_M=t.block_m,
            BLOCK_K=block_k,
            num_warps=t.num_warps,
        )
    return codes


def w4a8_fp8(x: Any, w: DeviceWeight, input_scale: Any, out_dtype: Any, cfg: KernelConfig) -> Any:
    """W4A8 FP8: ``x`` quantized by :func:`quantize_fp8` with the static or dynamic scale,
    then the FP8 ``tl.dot`` product, ``input_scale`` and the global after accumulation. The
    caller launches it only where FP8 tensor cores exist (or under the interpreter)."""

    from .kernels.w4a8 import w4a8_fp8_kernel

    out = _dense_out(x, w, out_dtype, "W4A8 FP8 takes a 2-D weight")
    m, n = x.shape[0], w.n
    if m == 0:
        return out
    s = fp8_input_scale(x, input_scale)
    codes = quantize_fp8(x, s, cfg)
    t = cfg.w4a8
    block_m = _w4a8_block_m(m, cfg)
    with _quiet():
        w4a8_fp8_kernel[(_cdiv(m, block_m), _cdiv(n, t.block_n))](
            codes,
            s,
            w.codes,
            w.scales,
            w.row_g,
            out,
            m,
            n,
            w.k,
            out.stride(0),
            BLOCK_M=block_m,
            BLOCK_N=t.block_n,
            SUB=t.sub,
            num_warps=t.num_warps,
            num_stages=t.num_stages,
        )
    return out
