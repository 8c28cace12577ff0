"""AMD architecture families and their tile configurations.

**Provisional and unmeasured.** No AMD GPU was available when these were written: every
tile below is a starting point reasoned from the hardware's published facts (wavefront
width, LDS size, matrix-instruction shapes) and must be tuned on each family with a
benchmark before anyone quotes a figure. Only their *logic* is exercised, under the Triton
interpreter (tests and conformance).

Four families were considered:

===========  ===================  ======  =========================================
family       architectures        lanes   products (examples)
===========  ===================  ======  =========================================
CDNA3        gfx940, gfx941,      64      Instinct MI300A, MI300X, MI325X
             gfx942
CDNA4        gfx950               64      Instinct MI350X, MI355X
RDNA3        gfx1100..gfx1103,    32      Radeon RX 7000, Radeon PRO W7000;
             gfx1150..gfx1153             Ryzen AI (RDNA3.5, e.g. gfx1151)
RDNA4        gfx1200, gfx1201     32      Radeon RX 9000
===========  ===================  ======  =========================================

``lanes`` is the wavefront Triton compiles for: 64 on gfx9 (CDNA), 32 on gfx10 and later
(Triton's AMD backend derives it the same way). Triton's ``num_warps`` counts wavefronts,
so a CDNA program of ``num_warps = 4`` has 256 threads and an RDNA one 128; the configs
size ``num_warps`` for that, and :class:`~nvfp4_triton.config.KernelConfig` checks
``num_warps * lanes <= 1024``. The shared kernels themselves know nothing about the width.

Architectures outside the table are matched by ISA major version (gfx9 -> CDNA3 tiles,
gfx10 / gfx11 -> RDNA3 tiles, gfx12 -> RDNA4 tiles, e.g. gfx90a or gfx1250) and flagged as
not considered; gfx8 and older are refused (Triton does not target them).

Why the tiles look like this (to be confirmed by measurement):

* GEMV (decode, bandwidth-bound): 16 weight rows x 512 elements per program, so every
  lane issues 16-byte loads of packed codes; split-K fills the GPU when N is narrow
  (two programs per compute unit, from the device's CU count).
* GEMM (only reached by the ``gemm`` override or float32 x under a reduced float32 matmul
  precision; prefill normally goes to hipBLASLt): as many pipeline stages of the bfloat16
  operand tiles as the LDS holds - CDNA3 (64 KB per CU) two stages of 128 x 128 x 64,
  CDNA4 (160 KB) three of 128 x 256 x 64; RDNA's WMMA works on 16 x 16 x 16 tiles with
  wave32: 64 x 64 x 64, three stages in 64 KB.
* Every streaming kernel (GEMV, dequantize, quantize, gather) uses 256 threads per
  program on either width: 4 wavefronts on CDNA, 8 on RDNA.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from nvfp4_triton import DequantTiles, GatherTiles, GemmTiles, GemvTiles, KernelConfig, QuantTiles

__all__ = [
    "CDNA3",
    "CDNA4",
    "FAMILIES",
    "RDNA3",
    "RDNA4",
    "ArchMatch",
    "Family",
    "base_arch",
    "config_for",
    "match_arch",
]

_PROVISIONAL = ("provisional tiles: not measured on AMD hardware",)


@dataclass(frozen=True)
class Family:
    """One AMD architecture family.

    Attributes:
        key: the dispatch-table key (``"cdna3"``...).
        title: its public name (``"CDNA3"``).
        archs: the ``gfx`` targets the family's tiles were written for.
        products: example products, for messages.
        typical_cus: compute units of its largest part; sizes split-K when the real count
            is unknown (the interpreter).
        config: the tiles (``lanes`` = the family's wavefront width).
    """

    key: str
    title: str
    archs: tuple[str, ...]
    products: str
    typical_cus: int
    config: KernelConfig

    @property
    def lanes(self) -> int:
        return self.config.lanes


#: Threads per program of the streaming kernels (GEMV, dequantize, quantize, MoE gather):
#: the same on either wavefront width, so every lane moves the same bytes (16 per GEMV
#: iteration). Triton's ``num_warps`` counts wavefronts, hence ``threads // lanes``.
_STREAM_THREADS = 256
#: The most software-pipeline stages a GEMM gets, whatever the LDS could hold.
_MAX_STAGES = 3


def _tiles(
    name: str, lanes: int, lds_kib: int, gemm: tuple[int, int, int], gemm_threads: int
) -> KernelConfig:
    """A family's tiles from its facts: wavefront width ``lanes``, LDS per program
    ``lds_kib``, the GEMM's ``(block_m, block_n, block_k)`` and threads. The GEMM keeps as
    many stages of its bfloat16 operand tiles as the LDS holds (at most :data:`_MAX_STAGES`)."""
    waves = _STREAM_THREADS // lanes
    bm, bn, bk = gemm
    stages = max(1, min(_MAX_STAGES, lds_kib * 1024 // ((bm + bn) * bk * 2)))
    return KernelConfig(
        name=name,
        lanes=lanes,
        gemv=GemvTiles(block_n=16, block_k=512, num_warps=waves, num_stages=2),
        gemm=GemmTiles(bm, bn, bk, group_m=8, num_warps=gemm_threads // lanes, num_stages=stages),
        gemm_small=GemmTiles(16, 64, 128, group_m=8, num_warps=waves, num_stages=2),
        dequant=DequantTiles(block_n=16, block_k=256, num_warps=waves),
        quant=QuantTiles(block_m=16, block_kb=8, num_warps=waves),
        gather=GatherTiles(16, 64, 128, rows_block_n=16, rows_block_k=512, num_warps=waves),
        notes=_PROVISIONAL,
    )


#: CDNA3: Instinct MI300A / MI300X / MI325X. 64 KB of LDS per CU: two stages of 128 x 128
#: GEMM operand tiles. No FP4 matrix instruction at all.
CDNA3 = Family(
    key="cdna3",
    title="CDNA3",
    archs=("gfx940", "gfx941", "gfx942"),
    products="Instinct MI300A, MI300X, MI325X",
    typical_cus=304,
    config=_tiles("cdna3", 64, 64, (128, 128, 128), 512),
)

#: CDNA4: Instinct MI350X / MI355X. 160 KB of LDS per CU: a wider GEMM tile, three stages.
#: Its FP4 MFMA takes MXFP4 operands (E8M0 scales per 32 elements), which NVFP4 does not
#: map to losslessly, so W4A16 is its path too.
CDNA4 = Family(
    key="cdna4",
    title="CDNA4",
    archs=("gfx950",),
    products="Instinct MI350X, MI355X",
    typical_cus=256,
    config=_tiles("cdna4", 64, 160, (128, 256, 128), 512),
)

#: RDNA3 / RDNA3.5: Radeon RX 7000, Radeon PRO W7000, Ryzen AI APUs (gfx1150/1151).
#: wave32, WMMA on 16 x 16 x 16 tiles, 64 KB of LDS per workgroup: 64 x 64 GEMM tiles.
RDNA3 = Family(
    key="rdna3",
    title="RDNA3",
    archs=("gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150", "gfx1151", "gfx1152", "gfx1153"),
    products="Radeon RX 7000 / PRO W7000, Ryzen AI (RDNA3.5)",
    typical_cus=96,
    config=_tiles("rdna3", 32, 64, (64, 64, 128), 128),
)

#: RDNA4: Radeon RX 9000. wave32; the same tile shapes as RDNA3 until measured.
RDNA4 = Family(
    key="rdna4",
    title="RDNA4",
    archs=("gfx1200", "gfx1201"),
    products="Radeon RX 9000",
    typical_cus=64,
    config=_tiles("rdna4", 32, 64, (64, 64, 128), 128),
)

#: Every considered family, by key.
FAMILIES: dict[str, Family] = {f.key: f for f in (CDNA3, CDNA4, RDNA3, RDNA4)}

#: ISA major version -> the family whose tiles an unlisted architecture borrows.
_BY_MAJOR = {9: CDNA3, 10: RDNA3, 11: RDNA3, 12: RDNA4}

_ARCH_RE = re.compile(r"gfx([0-9]+)([0-9a-f]{2})")


def base_arch(gcn_arch_name: str) -> str:
    """``gcnArchName`` (``"gfx942:sramecc+:xnack-"``) without its feature flags."""
    return gcn_arch_name.split(":", 1)[0].strip().lower()


@dataclass(frozen=True)
class ArchMatch:
    """What an architecture name resolved to.

    Attributes:
        arch: the base ``gfx`` name.
        family: the family whose tiles it runs.
        considered: whether ``arch`` is one the family was written for (else its tiles are
            borrowed by ISA major version, untested).
    """

    arch: str
    family: Family
    considered: bool


def match_arch(gcn_arch_name: str) -> ArchMatch:
    """Resolve a ``gcnArchName`` to a family. Raises ``ValueError`` naming the architecture
    when it is not a ``gfx`` target these kernels can run on (gfx8 and older)."""
    arch = base_arch(gcn_arch_name)
    for family in FAMILIES.values():
        if arch in family.archs:
            return ArchMatch(arch, family, True)
    m = _ARCH_RE.fullmatch(arch)
    if m is None:
        raise ValueError(f"GPU architecture: expected a gfx target such as gfx942, found {arch!r}")
    fallback = _BY_MAJOR.get(int(m.group(1)))
    if fallback is None:
        raise ValueError(
            f"GPU architecture {arch}: the Triton kernels need gfx9 (CDNA) or gfx10 and later "
            f"(RDNA), found ISA major version {m.group(1)}"
        )
    return ArchMatch(arch, fallback, False)


def config_for(
    gcn_arch_name: str, compute_units: int | None = None, *, interpreter: bool = False
) -> KernelConfig:
    """The tiles for an architecture, named after it, with the GEMV's split-K target set to
    two programs per compute unit (the family's largest part when ``compute_units`` is
    unknown). ``interpreter``: the same tiles with float32 ``tl.dot`` operands (Triton's
    interpreter multiplies bfloat16 operands wrongly; the decoded weights are exact in
    every dtype, so only the speed changes)."""
    match = match_arch(gcn_arch_name)
    base = match.family.config
    cus = compute_units or match.family.typical_cus
    notes = base.notes
    if not match.considered:
        notes = (
            *notes,
            f"{match.arch} is not one of the considered architectures: "
            f"{match.family.title} tiles borrowed, untested",
        )
    return replace(
        base,
        name=match.arch,
        gemv=replace(base.gemv, split_k_programs=2 * cus),
        dot_in_float32=base.dot_in_float32 or interpreter,
        notes=notes,
    )
