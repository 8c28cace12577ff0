"""Tile configurations per NVIDIA compute capability, and the interpreter's.

**Provisional and unmeasured.** No GPU was available when these were written: the GPU
tiles are starting points chosen from the shapes of the problem (GEMV: 16-32 weight rows of
256-512 elements per program so each warp issues 16-byte loads; GEMM: the usual
128x128x64 / 64x64x64 tensor-core tiles) and must be tuned with
``benchmarks/cuda_kernels.py`` on each generation. Only the interpreter config is
exercised (by the tests and the conformance suite, for correctness).

Every config uses 32-lane warps (``lanes=32``); the kernels themselves take the tiles as
constexprs and assume no warp width (``nvfp4-rocm`` runs the same kernels with 64-lane
wavefronts).

The interpreter config is the opposite of a GPU config: the interpreter runs one program
after another with numpy, so its cost is (programs x loop iterations x operations), not
bytes. It uses large tiles so a call is a handful of programs, and float32 ``tl.dot``
operands (the interpreter's own ``tl.dot`` mishandles bfloat16).
"""

from __future__ import annotations

from dataclasses import replace

from nvfp4_triton import (
    DequantTiles,
    GatherTiles,
    GemmTiles,
    GemvTiles,
    KernelConfig,
    QuantTiles,
    W4A8Tiles,
)

__all__ = ["CONFIGS", "INTERPRETER", "config_for"]

_PROVISIONAL = ("provisional tiles: not yet measured on this GPU generation",)

#: Ampere and Ada (sm_80, sm_86, sm_89): ~100 KB shared memory per SM, 2-3 stages.
AMPERE = KernelConfig(
    name="sm_80",
    lanes=32,
    gemv=GemvTiles(block_n=16, block_k=512, num_warps=4, num_stages=2),
    gemm=GemmTiles(block_m=128, block_n=128, block_k=128, group_m=8, num_warps=8, num_stages=3),
    gemm_small=GemmTiles(block_m=16, block_n=64, block_k=128, group_m=8, num_warps=4, num_stages=3),
    dequant=DequantTiles(block_n=16, block_k=256, num_warps=4),
    quant=QuantTiles(block_m=16, block_kb=8, num_warps=4),
    gather=GatherTiles(
        block_m=16, block_n=64, block_k=128, rows_block_n=16, rows_block_k=512, num_warps=4
    ),
    notes=_PROVISIONAL,
)

#: Hopper (sm_90): 228 KB shared memory per SM, 4 stages; no FP4 tensor cores, so W4A16
#: (bfloat16 tensor cores on the decoded tiles) is the fast path. W4A8 tiles of 64 rows:
#: the compiled code then uses wgmma (s8 and e4m3); 16-row tiles (decode) use mma.sync.
HOPPER = replace(
    AMPERE,
    name="sm_90",
    gemv=GemvTiles(block_n=16, block_k=512, num_warps=4, num_stages=3),
    gemm=GemmTiles(block_m=128, block_n=128, block_k=128, group_m=8, num_warps=8, num_stages=4),
    w4a8=W4A8Tiles(block_m=64, block_n=64, sub=4, num_warps=4, num_stages=3),
)

#: Blackwell data centre (sm_100, sm_103): W4A16 as on Hopper; W4A4 through torch's FP4
#: scaled matmul (see :mod:`nvfp4_cuda.w4a4`); the default W4A8 tiles.
BLACKWELL = replace(HOPPER, name="sm_100", w4a8=W4A8Tiles())

#: Blackwell consumer / workstation (sm_120, sm_121): ~100 KB shared memory per SM.
BLACKWELL_CONSUMER = replace(AMPERE, name="sm_120")

#: The Triton interpreter on the CPU (``TRITON_INTERPRET=1``): few, large programs.
INTERPRETER = KernelConfig(
    name="interpreter",
    lanes=32,
    gemv=GemvTiles(block_n=256, block_k=1024, num_warps=4, split_k_programs=2),
    gemm=GemmTiles(block_m=64, block_n=64, block_k=512, group_m=8, num_warps=4, num_stages=1),
    dequant=DequantTiles(block_n=64, block_k=1024, num_warps=4),
    quant=QuantTiles(block_m=64, block_kb=64, num_warps=4),
    gather=GatherTiles(
        block_m=32, block_n=64, block_k=512, rows_block_n=256, rows_block_k=1024, num_warps=4
    ),
    w4a8=W4A8Tiles(block_m=64, block_n=64, sub=16, num_warps=4, num_stages=1),
    dot_in_float32=True,
    notes=("Triton interpreter on CPU: tiles chosen for few programs, not for a GPU",),
)

#: Compute capability major version -> config. Majors not listed use :data:`AMPERE`'s
#: tiles (conservative: they fit every GPU from sm_80 on).
CONFIGS: dict[int, KernelConfig] = {
    8: AMPERE,
    9: HOPPER,
    10: BLACKWELL,
    12: BLACKWELL_CONSUMER,
}


def config_for(capability: tuple[int, int], multiprocessors: int | None = None) -> KernelConfig:
    """The config for a compute capability, with the GEMV's split-K target set to two
    programs per SM (so a decode GEMV of a narrow weight still fills the GPU)."""
    major, minor = capability
    base = CONFIGS.get(major, AMPERE)
    cfg = replace(base, name=f"sm_{major}{minor}")
    if multiprocessors:
        cfg = replace(cfg, gemv=replace(cfg.gemv, split_k_programs=2 * multiprocessors))
    return cfg
