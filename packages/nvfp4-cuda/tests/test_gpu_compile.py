"""Every Triton kernel, launched as the cuda backend launches it, compiles for every NVIDIA
architecture the backend supports - without a GPU (Triton ships ptxas). The interpreter
runs the kernels' logic in the other tests but accepts things a GPU compile refuses; this
closes that gap (in a fresh process: the conftest's TRITON_INTERPRET=1 makes the kernels
interpreter objects, which cannot be compiled). The several-rows GEMV and float32 /
float16 operands are compiled for Hopper."""

from __future__ import annotations

from nvfp4_triton.testing import assert_every_kernel_compiles


def test_every_kernel_compiles_for_every_nvidia_architecture() -> None:
    assert_every_kernel_compiles(
        "cuda", "nvfp4_cuda.configs", "configs.config_for((t[1] // 10, t[1] % 10))", detailed=1
    )
