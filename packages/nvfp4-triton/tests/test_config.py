"""KernelConfig validation, and the import contract (no torch, no triton, no GPU)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from nvfp4_triton.config import DequantTiles, GemmTiles, GemvTiles
from triton_helpers import AMD_LIKE, NVIDIA_LIKE


def test_import_needs_neither_torch_nor_triton() -> None:
    code = (
        "import sys, nvfp4_triton, nvfp4_triton.backend, nvfp4_triton.ops, nvfp4_triton.weights;"
        "print('torch' in sys.modules, 'triton' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"], out.stdout + out.stderr


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: GemvTiles(block_n=24, block_k=128), "gemv.block_n"),
        (lambda: GemvTiles(block_n=16, block_k=16), "gemv.block_k"),
        (lambda: GemmTiles(block_m=8, block_n=32, block_k=64), "gemm.block_m"),
        (lambda: DequantTiles(block_n=16, block_k=64, num_warps=3), "num_warps"),
        (lambda: NVIDIA_LIKE.with_(lanes=48), "lanes"),
        (lambda: NVIDIA_LIKE.with_(fp32_dot_precision="tf32"), "tf32"),
        # 32 wavefronts of 64 lanes = 2048 threads: more than a program may have
        (lambda: AMD_LIKE.with_(gemm=GemmTiles(16, 16, 128, num_warps=32)), "2048 threads"),
        # the GEMM's chunk is 16 code words at least (a 16-bit tl.dot's inner size)
        (lambda: GemmTiles(block_m=16, block_n=16, block_k=64), "gemm.block_k"),
    ],
)
def test_config_refuses(make: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()  # type: ignore[operator]


def test_same_warps_fit_32_lanes() -> None:
    cfg = NVIDIA_LIKE.with_(gemm=GemmTiles(16, 16, 128, num_warps=32))  # 1024 threads: fine
    assert cfg.gemm.num_warps == 32


def test_gemm_tiles_by_rows() -> None:
    assert AMD_LIKE.gemm_tiles(16) is AMD_LIKE.gemm_small
    assert AMD_LIKE.gemm_tiles(17) is AMD_LIKE.gemm
    assert NVIDIA_LIKE.gemm_tiles(1) is NVIDIA_LIKE.gemm


def test_describe_names_lanes() -> None:
    assert "64-lane" in AMD_LIKE.describe()
    assert "32-lane" in NVIDIA_LIKE.describe()


def test_kernel_sources_assume_no_warp_width() -> None:
    """No kernel reads a warp size or issues vendor assembly: tiles are all they get."""
    import inspect

    from nvfp4_triton import codec
    from nvfp4_triton.kernels import common, dequantize, gather, gemm, gemv, quantize

    for mod in (codec, common, dequantize, gather, gemm, gemv, quantize):
        code = "\n".join(line.split("#", 1)[0] for line in inspect.getsource(mod).splitlines())
        for banned in ("warp_size", "WARP", "inline_asm", "num_warps", "32 *", "* 32"):
            assert banned not in code, f"{mod.__name__} uses {banned!r}"
