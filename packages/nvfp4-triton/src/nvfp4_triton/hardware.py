"""Which GPUs have the matrix instructions the W4A8 kernels need (spec 1.1, "W4A8").

One source for the backends' capability decisions (``nvfp4-cuda``, ``nvfp4-rocm``) and
for the ahead-of-time compile check (:mod:`nvfp4_triton.aot`). Pure Python: no torch, no
triton.

* ``w4a8`` (int8 activations) runs an int8 x int8 -> int32 ``tl.dot``: int8 tensor cores
  on NVIDIA compute capability 8.x (Ampere, Ada) and 9.x (Hopper), int8 MFMA on AMD CDNA3
  (gfx940 / gfx941 / gfx942) and CDNA4 (gfx950).
* ``w4a8_fp8`` (FP8 E4M3 activations) runs an FP8 ``tl.dot``: NVIDIA compute capability
  8.9 and later (Ada, Hopper, Blackwell), AMD gfx942 and gfx950. Elsewhere it is not
  declared: nothing emulates an FP8 matmul on a GPU without FP8 tensor cores.

Blackwell (10.x, 12.x) and RDNA compile the int8 kernels too (the compile check builds
every kernel for every target), but ``w4a8`` is declared only where it was asked for and
reasoned about; widening the lists is a one-line change once a GPU has run them.
"""

from __future__ import annotations

__all__ = [
    "CUDA_FP8_MIN_CAPABILITY",
    "CUDA_INT8_MAJORS",
    "HIP_FP8_ARCHS",
    "HIP_INT8_ARCHS",
    "W4A8_FP8_NOTE",
    "W4A8_NOTE",
    "cuda_has_fp8",
    "cuda_has_int8",
    "hip_has_fp8",
    "hip_has_int8",
    "target_has_fp8",
]

#: Compute capability majors whose int8 tensor cores ``w4a8`` is declared on.
CUDA_INT8_MAJORS = (8, 9)
#: The first compute capability with FP8 tensor cores (Ada, sm_89).
CUDA_FP8_MIN_CAPABILITY = (8, 9)
#: AMD architectures with int8 MFMA that ``w4a8`` is declared on (CDNA3, CDNA4).
HIP_INT8_ARCHS = ("gfx940", "gfx941", "gfx942", "gfx950")
#: AMD architectures with FP8 MFMA that ``w4a8_fp8`` is declared on.
HIP_FP8_ARCHS = ("gfx942", "gfx950")

#: What a certificate says about W4A8 where it is declared (both vendors, the interpreter).
W4A8_NOTE = (
    "W4A8 int8: activations quantized per block of 32 (ggml Q8_0, bit-exact), int8 tl.dot "
    "per 16-element weight block into int32, e4m3 / 2 and d applied per block in float32, "
    "global after accumulation"
)
W4A8_FP8_NOTE = (
    "W4A8 FP8: activations e4m3(x / input_scale) (bit-exact; dynamic scale amax / 448), "
    "FP8 tl.dot per 16-element weight block, input_scale and global after accumulation"
)


def cuda_has_int8(capability: tuple[int, int]) -> bool:
    return capability[0] in CUDA_INT8_MAJORS


def cuda_has_fp8(capability: tuple[int, int]) -> bool:
    return tuple(capability) >= CUDA_FP8_MIN_CAPABILITY


def hip_has_int8(arch: str) -> bool:
    return arch in HIP_INT8_ARCHS


def hip_has_fp8(arch: str) -> bool:
    return arch in HIP_FP8_ARCHS


def target_has_fp8(target: tuple[str, int | str, int]) -> bool:
    """Whether an ahead-of-time target (``("cuda", 90, 32)``, ``("hip", "gfx942", 64)``)
    has FP8 tensor cores, so the FP8 matmul is compiled for it."""
    backend, arch, _ = target
    if backend == "cuda":
        assert isinstance(arch, int)
        return cuda_has_fp8((arch // 10, arch % 10))
    return hip_has_fp8(str(arch))
