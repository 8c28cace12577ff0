"""Compiling the kernels for a GPU target on a machine without one.

Triton compiles for any target it has a backend for without touching a device: NVIDIA
(``ptxas`` ships with Triton) and AMD (``ld.lld`` likewise). The interpreter, which runs the
kernels' logic in CI, accepts things a GPU compile refuses (layouts, type mixes, pointer
casts), so the test suite also compiles every kernel, as the backends launch it, for each
architecture they support (:data:`TARGETS`), and ``benchmarks/triton_sass.py`` reads the
compiled NVIDIA code to count instructions per weight byte.

A launch specializes its arguments: every tensor is 16-byte aligned and every integer that is
a multiple of 16 is marked so (``tt.divisibility``); an integer equal to 1 becomes a constant.
:func:`compile_kernel` takes the same facts explicitly. :func:`launches` lists one
representative launch of every kernel for a config, with the arguments ``nvfp4_triton.ops``
passes (signature types, constexprs, warps and stages).
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

from .config import KernelConfig
from .hardware import target_has_fp8

__all__ = ["TARGETS", "Launch", "compile_all", "compile_kernel", "launches", "run_fresh", "source"]

#: (backend, arch, warp size) of every architecture a backend of this repository targets:
#: NVIDIA Ampere, Hopper, Blackwell data-centre and consumer; AMD CDNA3 / CDNA4 (64-lane
#: wavefronts) and RDNA3 / RDNA4 (32-lane).
TARGETS: tuple[tuple[str, int | str, int], ...] = (
    ("cuda", 80, 32),
    ("cuda", 90, 32),
    ("cuda", 100, 32),
    ("cuda", 120, 32),
    ("hip", "gfx942", 64),
    ("hip", "gfx950", 64),
    ("hip", "gfx1100", 32),
    ("hip", "gfx1201", 32),
)

_TORCH_TO_TRITON = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


@dataclass
class Launch:
    """One kernel launch: the kernel, its signature (argument name -> Triton type, or
    ``"constexpr"``), its constexprs, the arguments a launch would mark 16-divisible, and
    its warps and stages."""

    name: str
    fn: Any
    signature: dict[str, str]
    constexprs: dict[str, Any]
    divisible: set[str] = field(default_factory=set)
    num_warps: int = 4
    num_stages: int = 2


def compile_kernel(launch: Launch, target: tuple[str, int | str, int]) -> Any:
    """Compile ``launch`` for ``target`` (no GPU needed); returns Triton's compiled kernel
    (``.asm`` holds ``ttgir``, ``llir`` and ``ptx`` / ``cubin`` or ``amdgcn`` / ``hsaco``)."""
    os.environ.pop("TRITON_INTERPRET", None)
    import triton
    from triton.backends.compiler import GPUTarget

    return triton.compile(
        source(launch),
        target=GPUTarget(*target),
        options={"num_warps": launch.num_warps, "num_stages": launch.num_stages},
    )


def source(launch: Launch) -> Any:
    """Triton's ``ASTSource`` of ``launch``. Its divisibility attributes are listed in argument
    order: Triton's cache key is the text of that dict, and a set's order changes with every
    process's string hashing, so building it from the set would miss the cache (under
    ``~/.triton/cache``) every time and recompile."""
    from triton.compiler import ASTSource

    names = list(launch.signature)
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(names) if a in launch.divisible}
    return ASTSource(
        fn=launch.fn, signature=launch.signature, constexprs=launch.constexprs, attrs=attrs
    )


def _ptrs(sig: dict[str, str]) -> set[str]:
    return {k for k, v in sig.items() if v.startswith("*")}


def launches(
    cfg: KernelConfig, dtype: str = "bfloat16", m: int = 1, *, fp8_dot: bool = True
) -> list[Launch]:
    """A launch of every kernel as ``nvfp4_triton.ops`` makes it for ``cfg``, activations
    and outputs in ``dtype`` (``"float32"``, ``"float16"``, ``"bfloat16"``), ``m`` rows of x
    (the GEMV's and the GEMM's tiles depend on it), a weight with N and K multiples of 16.
    ``fp8_dot``: include the W4A8 FP8 matmul (an FP8 ``tl.dot``: only targets with FP8
    tensor cores, :func:`nvfp4_triton.hardware.target_has_fp8`)."""
    import triton.language as tl

    from .kernels.dequantize import dequantize_kernel
    from .kernels.gather import gather_grouped_kernel, gather_rows_kernel
    from .kernels.gemm import gemm_kernel
    from .kernels.gemv import gemv_kernel, splitk_reduce_kernel
    from .kernels.quantize import quantize_kernel
    from .ops import _dot_dtype_name, _pow2_at_least, gemv_block_k

    t = "*" + _TORCH_TO_TRITON[dtype]
    dot = getattr(tl, _dot_dtype_name(dtype, cfg))
    ints = ("N", "K", "stride_xm", "stride_om")
    out: list[Launch] = []

    def m_arg(sig: dict[str, str], const: dict[str, Any], div: set[str]) -> None:
        if m == 1:  # a launch turns an integer 1 into a constant
            sig["M"] = "constexpr"
            const["M"] = 1
        elif m % 16 == 0:
            div.add("M")

    g = cfg.gemv
    block_m = _pow2_at_least(m)
    sig = {
        "x_ptr": t, "codes_ptr": "*u8", "scales_ptr": "*u8", "row_g_ptr": "*fp32",
        "out_ptr": t, "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32",
        "stride_om": "i32", "K_SPLIT": "i32", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr",
        "BLOCK_K": "constexpr", "PARTIAL": "constexpr",
    }  # fmt: skip
    const: dict[str, Any] = {
        "BLOCK_M": block_m,
        "BLOCK_N": g.block_n,
        "BLOCK_K": gemv_block_k(g.block_k, block_m),
        "PARTIAL": False,
    }
    div = _ptrs(sig) | set(ints) | {"K_SPLIT"}
    m_arg(sig, const, div)
    out.append(Launch("gemv", gemv_kernel, sig, const, div, g.num_warps, g.num_stages))
    sig_p = dict(sig, out_ptr="*fp32")
    out.append(
        Launch(
            "gemv_split_k",
            gemv_kernel,
            sig_p,
            dict(const, PARTIAL=True),
            set(div),
            g.num_warps,
            g.num_stages,
        )
    )
    sig = {
        "ws_ptr": "*fp32", "row_g_ptr": "*fp32", "out_ptr": t, "M": "i32", "N": "i32",
        "stride_om": "i32", "SPLIT_K": "constexpr", "BLOCK_N": "constexpr",
    }  # fmt: skip
    const = {"SPLIT_K": 4, "BLOCK_N": 1024}
    div = _ptrs(sig) | {"N", "stride_om"}
    m_arg(sig, const, div)
    out.append(Launch("splitk_reduce", splitk_reduce_kernel, sig, const, div, g.num_warps))

    mt = cfg.gemm_tiles(m)
    sig = {
        "x_ptr": t, "codes_ptr": "*u8", "scales_ptr": "*u8", "row_g_ptr": "*fp32",
        "out_ptr": t, "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32",
        "stride_om": "i32", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr",
        "BLOCK_K": "constexpr", "GROUP_M": "constexpr", "DOT_DTYPE": "constexpr",
        "FP32_PRECISION": "constexpr",
    }  # fmt: skip
    const = {
        "BLOCK_M": mt.block_m,
        "BLOCK_N": mt.block_n,
        "BLOCK_K": mt.block_k,
        "GROUP_M": mt.group_m,
        "DOT_DTYPE": dot,
        "FP32_PRECISION": cfg.fp32_dot_precision,
    }
    div = _ptrs(sig) | set(ints)
    m_arg(sig, const, div)
    out.append(Launch("gemm", gemm_kernel, sig, const, div, mt.num_warps, mt.num_stages))

    d = cfg.dequant
    sig = {
        "codes_ptr": "*u8", "scales_ptr": "*u8", "row_g_ptr": "*fp32", "out_ptr": t,
        "rows": "i32", "K": "i32", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr",
    }  # fmt: skip
    const = {"BLOCK_N": d.block_n, "BLOCK_K": d.block_k}
    out.append(
        Launch("dequantize", dequantize_kernel, sig, const, _ptrs(sig) | {"rows", "K"}, d.num_warps)
    )

    ga = cfg.gather
    sig = {
        "x_ptr": t, "ids_ptr": "*i32", "codes_ptr": "*u8", "scales_ptr": "*u8",
        "row_g_ptr": "*fp32", "out_ptr": t, "N": "i32", "K": "i32", "E": "i32",
        "stride_xm": "i32", "stride_om": "i32", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr",
    }  # fmt: skip
    const = {"BLOCK_N": ga.rows_block_n, "BLOCK_K": ga.rows_block_k}
    div = _ptrs(sig) | set(ints)
    out.append(Launch("gather_rows", gather_rows_kernel, sig, const, div, ga.num_warps))
    sig = {
        "x_ptr": t, "ids_ptr": "*i32", "perm_ptr": "*i64", "tiles_ptr": "*i64",
        "codes_ptr": "*u8",
        "scales_ptr": "*u8", "row_g_ptr": "*fp32", "out_ptr": t, "N": "i32", "K": "i32",
        "E": "i32", "stride_xm": "i32", "stride_om": "i32", "BLOCK_M": "constexpr",
        "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "DOT_DTYPE": "constexpr",
        "FP32_PRECISION": "constexpr", "HAS_PERM": "constexpr",
    }  # fmt: skip
    const = {
        "BLOCK_M": ga.block_m,
        "BLOCK_N": ga.block_n,
        "BLOCK_K": ga.block_k,
        "DOT_DTYPE": dot,
        "FP32_PRECISION": cfg.fp32_dot_precision,
        "HAS_PERM": True,
    }
    div = _ptrs(sig) | set(ints)
    out.append(
        Launch(
            "gather_grouped", gather_grouped_kernel, sig, const, div, ga.num_warps, ga.num_stages
        )
    )

    q = cfg.quant
    sig = {
        "x_ptr": t, "g_ptr": "*fp32", "codes_ptr": "*u8", "scales_ptr": "*u8",
        "band_ptr": "*i64", "M": "i32", "K": "i32", "stride_xm": "i32", "BAND_STRIDE": "i32",
        "BLOCK_M": "constexpr", "BLOCK_KB": "constexpr", "SWIZZLED": "constexpr",
    }  # fmt: skip
    for swizzled in (False, True):
        const = {"BLOCK_M": q.block_m, "BLOCK_KB": q.block_kb, "SWIZZLED": swizzled}
        div = _ptrs(sig) | {"K", "stride_xm", "BAND_STRIDE"}
        name = "quantize_swizzled" if swizzled else "quantize"
        out.append(Launch(name, quantize_kernel, dict(sig), const, div, q.num_warps))
    out.extend(_w4a8_launches(cfg, t, m, fp8_dot))
    return out


def _w4a8_launches(cfg: KernelConfig, t: str, m: int, fp8_dot: bool) -> list[Launch]:
    """The W4A8 kernels as ``ops.quantize_q8`` / ``w4a8`` / ``gather_w4a8`` /
    ``quantize_fp8`` / ``w4a8_fp8`` launch them (``t``: the activations' pointer type): the
    matmuls with the row tile ``ops`` picks for ``m`` rows and with the config's full tile
    when that differs (Hopper's 64-row tile is another instruction, wgmma)."""
    from .kernels.w4a8 import quantize_fp8_kernel, quantize_q8_kernel, w4a8_fp8_kernel, w4a8_kernel
    from .ops import _w4a8_block_m

    out: list[Launch] = []
    q = cfg.quant
    sig = {
        "x_ptr": t, "codes_ptr": "*i8", "d_ptr": "*i16", "ids_ptr": "*i64", "M": "i32",
        "K": "i32", "E": "i32", "stride_xm": "i32", "BLOCK_M": "constexpr",
        "BLOCK_KB": "constexpr", "HAS_IDS": "constexpr",
    }  # fmt: skip
    for has_ids in (False, True):
        const = {"BLOCK_M": q.block_m, "BLOCK_KB": max(1, q.block_kb // 2), "HAS_IDS": has_ids}
        div = _ptrs(sig) | {"K", "stride_xm"}
        name = "quantize_q8_gather" if has_ids else "quantize_q8"
        out.append(Launch(name, quantize_q8_kernel, dict(sig), const, div, q.num_warps))
    w = cfg.w4a8
    sig = {
        "xq_ptr": "*i8", "d_ptr": "*fp16", "ids_ptr": "*i64", "perm_ptr": "*i64",
        "tiles_ptr": "*i64",
        "codes_ptr": "*u8", "scales_ptr": "*u8", "row_g_ptr": "*fp32", "out_ptr": t,
        "M": "i32", "N": "i32", "K": "i32", "E": "i32", "stride_om": "i32",
        "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "SUB": "constexpr",
        "GATHER": "constexpr", "HAS_PERM": "constexpr",
    }  # fmt: skip
    div = _ptrs(sig) | {"N", "K", "stride_om"}
    tiles = sorted({_w4a8_block_m(m, cfg), w.block_m})
    kinds = (("w4a8", False), ("gather_w4a8", True))
    for block_m, (name, gather) in itertools.product(tiles, kinds):
        const = {
            "BLOCK_M": block_m,
            "BLOCK_N": w.block_n,
            "SUB": w.sub,
            "GATHER": gather,
            "HAS_PERM": gather,
        }
        label = f"{name}_m{block_m}"
        out.append(
            Launch(label, w4a8_kernel, dict(sig), const, set(div), w.num_warps, w.num_stages)
        )
    sig = {
        "x_ptr": t, "scale_ptr": "*fp32", "codes_ptr": "*u8", "M": "i32", "K": "i32",
        "stride_xm": "i32", "BLOCK_M": "constexpr", "BLOCK_K": "constexpr",
    }  # fmt: skip
    const = {"BLOCK_M": q.block_m, "BLOCK_K": q.block_kb * 16}
    div = _ptrs(sig) | {"K", "stride_xm"}
    out.append(Launch("quantize_fp8", quantize_fp8_kernel, sig, const, div, q.num_warps))
    if fp8_dot:
        sig = {
            "xq_ptr": "*u8", "scale_ptr": "*fp32", "codes_ptr": "*u8", "scales_ptr": "*u8",
            "row_g_ptr": "*fp32", "out_ptr": t, "M": "i32", "N": "i32", "K": "i32",
            "stride_om": "i32", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr",
            "SUB": "constexpr",
        }  # fmt: skip
        div = _ptrs(sig) | {"N", "K", "stride_om"}
        for block_m in tiles:
            const = {"BLOCK_M": block_m, "BLOCK_N": w.block_n, "SUB": w.sub}
            label = f"w4a8_fp8_m{block_m}"
            out.append(
                Launch(
                    label, w4a8_fp8_kernel, dict(sig), const, set(div), w.num_warps, w.num_stages
                )
            )
    return out


def compile_all(
    targets: list[tuple[tuple[str, int | str, int], KernelConfig]],
    dtypes: tuple[str, ...] = ("bfloat16",),
    rows: tuple[int, ...] = (1,),
) -> list[str]:
    """Compile every kernel's launch for each (target, config), activation dtype and number of
    rows of x; returns one line per failure (kernel, target, dtype, rows, the compiler's
    message) - empty when everything compiled. Needs ``TRITON_INTERPRET`` unset *before*
    the kernels are imported (under the interpreter they are not compilable objects): run
    it in a fresh process."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("compile_all needs TRITON_INTERPRET unset (run it in a new process)")
    failures = []
    for target, cfg in targets:
        for dtype in dtypes:
            for m in rows:
                for launch in launches(cfg, dtype, m, fp8_dot=target_has_fp8(target)):
                    try:
                        compile_kernel(launch, target)
                    except Exception as e:  # reported, with the compiler's message
                        msg = " ".join(str(e).split())[:400]
                        failures.append(
                            f"{launch.name} for {target[0]}:{target[1]} ({dtype}, M={m}): "
                            f"{type(e).__name__}: {msg}"
                        )
    return failures


def run_fresh(code: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """Run Python ``code`` in a new interpreter without ``TRITON_INTERPRET`` (so the kernels
    it imports are compilable), for test suites whose own process runs the interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, made explicit
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout
    )
