"""Tile configurations: what a backend passes to the shared kernels.

The kernels in :mod:`nvfp4_triton.kernels` take every tile size as a ``tl.constexpr`` and
know nothing about the GPU they run on. A backend (``nvfp4-cuda``, ``nvfp4-rocm``) picks a
:class:`KernelConfig` for its device - per compute capability, per AMD architecture, or the
interpreter's - and hands it to :mod:`nvfp4_triton.ops`.

Nothing here, and nothing in the kernels, assumes 32-wide warps. :attr:`KernelConfig.lanes`
is the width of the device's SIMD group (32 for an NVIDIA warp, 64 for an AMD CDNA
wavefront, 32 or 64 on RDNA); it is used only to check that ``num_warps * lanes`` threads fit
in one program (at most 1024 on both vendors) and to describe the config. Triton maps
each tile onto ``num_warps`` groups of ``lanes`` threads itself.

This module imports neither torch nor triton: configs can be built and printed anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

__all__ = [
    "DequantTiles",
    "GatherTiles",
    "GemmTiles",
    "GemvTiles",
    "KernelConfig",
    "QuantTiles",
    "W4A8Tiles",
]

#: Most threads one program (CUDA block / HIP workgroup) may have, on both vendors.
MAX_THREADS_PER_PROGRAM = 1024


def _pow2(name: str, value: int, lo: int = 1, hi: int = 1 << 16) -> None:
    if not isinstance(value, int) or value < lo or value > hi or value & (value - 1):
        raise ValueError(f"{name}: expected a power of two in [{lo}, {hi}], found {value!r}")


def _warps(where: str, num_warps: int, num_stages: int) -> None:
    _pow2(f"{where}.num_warps", num_warps, 1, 32)
    if not isinstance(num_stages, int) or not 1 <= num_stages <= 8:
        raise ValueError(f"{where}.num_stages: expected 1..8, found {num_stages!r}")


@dataclass(frozen=True)
class GemvTiles:
    """W4A16 decode (few rows of x): a program streams ``block_n`` weight rows over a
    ``block_k`` chunk of K at a time and multiplies them by every row of x.

    Attributes:
        block_n: weight rows per program.
        block_k: elements of K per loop iteration at one row of x (a multiple of 32). With
            ``m`` rows of x the launch uses ``block_k // m`` (at least 32) so the product
            tile ``m x block_n x block_k/2`` stays the same size.
        split_k_programs: when the ``N / block_n`` programs are fewer than this, K is split
            across more programs (partial sums reduced in a fixed order, so results are
            deterministic); 0 disables split-K.
        max_split_k: the most pieces K is cut into.
    """

    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 1
    split_k_programs: int = 0
    max_split_k: int = 16

    def __post_init__(self) -> None:
        _pow2("gemv.block_n", self.block_n)
        _pow2("gemv.block_k", self.block_k, 32)
        _warps("gemv", self.num_warps, self.num_stages)
        if self.split_k_programs < 0 or self.max_split_k < 1:
            raise ValueError("gemv: split_k_programs >= 0 and max_split_k >= 1 required")


@dataclass(frozen=True)
class GemmTiles:
    """W4A16 prefill: an output tile ``block_m x block_n`` accumulated over K in chunks of
    ``block_k`` (each weight chunk decoded in registers, then ``tl.dot``); programs ordered
    in groups of ``group_m`` row tiles so a weight tile is reused from L2."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self) -> None:
        _pow2("gemm.block_m", self.block_m, 16)
        _pow2("gemm.block_n", self.block_n, 16)
        _pow2("gemm.block_k", self.block_k, 128)  # 16 code words: a 16-bit tl.dot's inner size
        _pow2("gemm.group_m", self.group_m)
        _warps("gemm", self.num_warps, self.num_stages)


@dataclass(frozen=True)
class DequantTiles:
    """Dequantize: one program writes a ``block_n x block_k`` tile of the dense output."""

    block_n: int
    block_k: int
    num_warps: int = 4

    def __post_init__(self) -> None:
        _pow2("dequant.block_n", self.block_n)
        _pow2("dequant.block_k", self.block_k, 16)
        _warps("dequant", self.num_warps, 1)


@dataclass(frozen=True)
class QuantTiles:
    """Activation quantization: one program encodes ``block_m`` rows x ``block_kb`` blocks
    of 16 elements."""

    block_m: int
    block_kb: int
    num_warps: int = 4

    def __post_init__(self) -> None:
        _pow2("quant.block_m", self.block_m)
        _pow2("quant.block_kb", self.block_kb)
        _warps("quant", self.num_warps, 1)


@dataclass(frozen=True)
class GatherTiles:
    """MoE ``gather_qmm``.

    ``rows`` (unsorted, few rows): one program per row of x and ``block_n`` output columns,
    the expert's weight streamed like the GEMV. ``grouped`` (sorted): rows grouped by
    expert into tiles of ``block_m``; each program reads its expert's ``block_n`` weight
    rows once for the whole tile (``tl.dot``)."""

    block_m: int
    block_n: int
    block_k: int
    rows_block_n: int
    rows_block_k: int
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self) -> None:
        _pow2("gather.block_m", self.block_m, 16)
        _pow2("gather.block_n", self.block_n, 16)
        _pow2("gather.block_k", self.block_k, 32)
        _pow2("gather.rows_block_n", self.rows_block_n)
        _pow2("gather.rows_block_k", self.rows_block_k, 32)
        _warps("gather", self.num_warps, self.num_stages)


@dataclass(frozen=True)
class W4A8Tiles:
    """W4A8 matmuls (int8 and FP8 activations, spec 1.1): an output tile ``block_m x
    block_n`` accumulated over K in steps of one 32-element activation block, ``sub`` of
    them per loop iteration (a chunk of ``32 * sub`` elements); each step is two 8-bit
    ``tl.dot`` s (one per 16-element weight block). The MoE form groups the rows by expert
    into tiles of ``block_m``, as the W4A16 grouped gather does."""

    block_m: int = 16
    block_n: int = 64
    sub: int = 4
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self) -> None:
        _pow2("w4a8.block_m", self.block_m, 16)
        _pow2("w4a8.block_n", self.block_n, 16)
        _pow2("w4a8.sub", self.sub, 1, 64)
        _warps("w4a8", self.num_warps, self.num_stages)


@dataclass(frozen=True)
class KernelConfig:
    """Every tile choice for one device.

    Attributes:
        name: what the config is for (``"sm_90"``, ``"gfx942"``, ``"interpreter"``...).
        lanes: SIMD-group width of the device: 32 (NVIDIA warp), 64 (AMD CDNA wavefront).
        gemv, gemm, dequant, quant, gather: the tiles of each kernel (``quant`` also sizes
            the W4A8 activation encoders: ``block_m`` rows and ``16 * block_kb`` elements
            per program).
        w4a8: the W4A8 matmuls' tiles (the defaults suit a GPU; the interpreter's configs
            take larger ones).
        gemm_small, small_m: tiles the prefill GEMM uses instead of ``gemm`` when x has at
            most ``small_m`` rows (``None``: always ``gemm``).
        fp32_dot_precision: ``input_precision`` of ``tl.dot`` when x is float32: ``"ieee"``
            (exact products; the default), or ``"tf32x3"`` where the backend measured it
            accurate enough. Never ``"tf32"``: its 10-bit mantissa breaks the float32
            tolerance.
        dot_in_float32: feed ``tl.dot`` float32 operands whatever x's dtype (the decoded
            weights are exact in bfloat16 and float16, so the products are the same; only
            the speed differs). The Triton interpreter needs it: its ``tl.dot`` multiplies
            bfloat16 operands as raw integers.
        notes: free-form provenance ("provisional, not measured on hardware"...).
    """

    name: str
    lanes: int
    gemv: GemvTiles
    gemm: GemmTiles
    dequant: DequantTiles
    quant: QuantTiles
    gather: GatherTiles
    w4a8: W4A8Tiles = field(default_factory=W4A8Tiles)
    gemm_small: GemmTiles | None = None
    small_m: int = 64
    fp32_dot_precision: str = "ieee"
    dot_in_float32: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.lanes not in (32, 64):
            raise ValueError(f"{self.name}: lanes must be 32 or 64, found {self.lanes!r}")
        if self.fp32_dot_precision not in ("ieee", "tf32x3"):
            raise ValueError(
                f"{self.name}: fp32_dot_precision must be 'ieee' or 'tf32x3' (tf32 alone "
                f"breaks the float32 tolerance), found {self.fp32_dot_precision!r}"
            )
        for kernel, warps in (
            ("gemv", self.gemv.num_warps),
            ("gemm", self.gemm.num_warps),
            ("dequant", self.dequant.num_warps),
            ("quant", self.quant.num_warps),
            ("gather", self.gather.num_warps),
            ("w4a8", self.w4a8.num_warps),
            ("gemm_small", self.gemm_small.num_warps if self.gemm_small else 1),
        ):
            if warps * self.lanes > MAX_THREADS_PER_PROGRAM:
                raise ValueError(
                    f"{self.name}: {kernel}.num_warps = {warps} groups of {self.lanes} lanes "
                    f"is {warps * self.lanes} threads, more than {MAX_THREADS_PER_PROGRAM}"
                )

    def gemm_tiles(self, m: int) -> GemmTiles:
        """The prefill tiles for ``m`` rows of x."""
        if self.gemm_small is not None and m <= self.small_m:
            return self.gemm_small
        return self.gemm

    def with_(self, **changes: object) -> KernelConfig:
        """A copy with some fields replaced (validated again)."""
        return replace(self, **changes)  # type: ignore[arg-type]

    def describe(self) -> str:
        """One line for logs and certificates."""
        g, m = self.gemv, self.gemm
        return (
            f"{self.name} ({self.lanes}-lane SIMD groups): gemv {g.block_n}x{g.block_k} "
            f"w{g.num_warps}, gemm {m.block_m}x{m.block_n}x{m.block_k} w{m.num_warps} "
            f"s{m.num_stages}"
        )
