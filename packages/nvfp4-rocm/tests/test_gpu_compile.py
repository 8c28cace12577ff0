"""Every Triton kernel, launched as the rocm backend launches it, compiles for CDNA3 / CDNA4
(64-lane wavefronts) and RDNA3 / RDNA4 (32-lane) - without a GPU (Triton ships the AMD
backend and its linker). The interpreter runs the kernels' logic in the other tests but
accepts things a GPU compile refuses; this closes that gap (in a fresh process: the
conftest's TRITON_INTERPRET=1 makes the kernels interpreter objects). The several-rows GEMV
and float32 / float16 operands are compiled for CDNA3."""

from __future__ import annotations

from nvfp4_triton.testing import assert_every_kernel_compiles


def test_every_kernel_compiles_for_every_amd_architecture() -> None:
    assert_every_kernel_compiles(
        "hip", "nvfp4_rocm.configs", "configs.config_for(t[1])", detailed=0
    )
