"""Instructions per weight byte of the Triton decode kernels, read from their compiled SASS -
a figure that needs no GPU.

W4A16 decode streams the weight once, so it runs at memory speed only if the instructions
it spends per weight byte fit the GPU's issue rate at that speed. An H100 / H200 SM issues
one warp instruction per clock on each of its 4 schedulers: 132 SMs x 4 x 32 lanes x ~1.98
GHz = ~33 T thread-instructions/s, against 4.8 TB/s (H200) or 3.35 TB/s (H100) of memory:
about **7 (H200) to 10 (H100) thread-instructions per weight byte** at full bandwidth, so
the goal of 80 % of the memory bandwidth leaves ~8.7 on an H200. (Many integer operations issue at half
rate, so this is an upper bound.)

For each kernel and shape this script compiles the kernel with Triton for a target
(``sm_90`` by default; no GPU is involved: Triton's bundled ``ptxas`` does it), disassembles
the cubin with Triton's bundled ``nvdisasm``, finds the K loop (the largest block closed by a
backward branch), counts its instructions by opcode and divides by the weight bytes one
iteration of a program consumes:

    instructions / byte = loop instructions x threads per program / (BLOCK_N x BLOCK_K / 2)

It also reports registers, stack bytes (spills) and shared memory (``cuobjdump
-res-usage``). The tiles are the backend's (``nvfp4_cuda.configs``) for the target, with
BLOCK_K for M > 1 from ``nvfp4_triton.ops.gemv_block_k``, as the launch uses them.

Writes ``benchmarks/results/triton_sass.json`` and ``docs/benchmark_results/triton_sass.md``.

    python benchmarks/triton_sass.py [--arch 90] [--quick]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.pop("TRITON_INTERPRET", None)  # compile for a GPU target, never interpret
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, made explicit

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "triton_sass.json"
DEFAULT_SUMMARY = ROOT / "docs" / "benchmark_results" / "triton_sass.md"
#: The budget of the decode goal: thread-instructions per weight byte that an H200 can issue
#: while streaming at 80 % of its 4.8 TB/s (132 SMs x 4 schedulers x 32 lanes x 1.98 GHz).
H200_BUDGET_AT_80_PERCENT = 132 * 4 * 32 * 1.98e9 / (0.8 * 4.8e12)

_INSTR = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[0-9T]+\s+)?([A-Z][A-Z0-9_]*)")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_BRANCH = re.compile(r"BRA\s+`?\(?(\.L_x_\d+)")


def _tools() -> Path:
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def resources(path: Path) -> dict[str, int]:
    """Registers, stack bytes (spills) and static shared memory, from ``cuobjdump -res-usage``."""
    out = subprocess.run(
        [str(_tools() / "cuobjdump"), "-res-usage", str(path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = dict(re.findall(r"\b(REG|STACK|SHARED):(\d+)", out))
    return {
        "registers": int(found.get("REG", -1)),
        "stack_bytes": int(found.get("STACK", -1)),
        "shared_bytes": int(found.get("SHARED", -1)),
    }


def loop_profile(cubin: bytes, workdir: Path) -> dict[str, Any]:
    """The opcodes of the kernel's K loop and the kernel's resources. The K loop is the first
    loop in program order (a label closed by a backward branch to it) of 32 instructions or
    more: the steady state, where a kernel splits whole chunks from a masked tail."""
    path = workdir / "kernel.cubin"
    path.write_bytes(cubin)
    sass = subprocess.run(
        [str(_tools() / "nvdisasm"), "-c", str(path)], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    labels: dict[str, int] = {}
    loops: list[tuple[int, int]] = []
    for i, line in enumerate(sass):
        m = _LABEL.match(line)
        if m:
            labels[m.group(1)] = i
        b = _BRANCH.search(line)
        if b and b.group(1) in labels:  # a backward branch: a loop
            loops.append((labels[b.group(1)], i))
    bodies = [
        [m.group(1).split(".")[0] for line in sass[a : z + 1] if (m := _INSTR.match(line))]
        for a, z in sorted(loops)
    ]
    body = next((ops for ops in bodies if len(ops) >= 32), None)
    if body is None:
        raise RuntimeError("no loop of 32 instructions or more in the kernel's SASS")
    counts = collections.Counter(body)
    return {
        "loop_instructions": len(body),
        "loops": [len(ops) for ops in bodies],
        "by_opcode": dict(counts.most_common()),
    } | resources(path)


def cases(arch: int, quick: bool) -> list[tuple[int, Any]]:
    """(M, launch) of the GEMV at M = 1, 2, 4, 8, 16, the GEMM at M = 1 and 16 (its small
    tile covers 16 rows) and 2048 (the prefill tile) and the MoE per-row gather, as ``nvfp4_triton.ops`` launches them with
    the backend's tiles."""
    from nvfp4_cuda.configs import config_for
    from nvfp4_triton.aot import launches

    cfg = config_for((arch // 10, arch % 10))
    out = []
    for m in (1,) if quick else (1, 2, 4, 8, 16):
        out.append((m, next(x for x in launches(cfg, "bfloat16", m) if x.name == "gemv")))
    for m in (1,) if quick else (1, 16, 2048):  # the small-M tile, and the prefill tile
        out.append((m, next(x for x in launches(cfg, "bfloat16", m) if x.name == "gemm")))
    # MoE decode: one program per routed row streams that row's expert like the GEMV
    out.append((1, next(x for x in launches(cfg, "bfloat16", 1) if x.name == "gather_rows")))
    return out


def measure(m: int, launch: Any, arch: int, workdir: Path) -> dict[str, Any]:
    from nvfp4_triton.aot import compile_kernel

    t0 = time.perf_counter()
    k = compile_kernel(launch, ("cuda", arch, 32))
    seconds = time.perf_counter() - t0
    prof = loop_profile(k.asm["cubin"], workdir)
    c = launch.constexprs
    threads = launch.num_warps * 32
    weight_bytes = c["BLOCK_N"] * c["BLOCK_K"] // 2
    return {
        "kernel": launch.name,
        "M": m,
        "BLOCK_M": c.get("BLOCK_M", 1),
        "BLOCK_N": c["BLOCK_N"],
        "BLOCK_K": c["BLOCK_K"],
        "num_warps": launch.num_warps,
        "num_stages": launch.num_stages,
        **prof,
        "threads": threads,
        "weight_bytes_per_iteration": weight_bytes,
        "instructions_per_weight_byte": prof["loop_instructions"] * threads / weight_bytes,
        "compile_s": seconds,
    }


def summary(r: dict[str, Any]) -> str:
    lines = [
        "# Triton decode kernels: instructions per weight byte (static, from SASS)",
        "",
        f"Produced by `benchmarks/triton_sass.py` on {r['date']} (Triton {r['triton']}, target "
        f"sm_{r['arch']}, compiled and disassembled with Triton's bundled ptxas / nvdisasm; "
        "no GPU involved). The figure is the K loop's instructions x threads per program / "
        "weight bytes per iteration.",
        "",
        f"Budget (H200 streaming at 80 % of 4.8 TB/s, one warp instruction per scheduler per "
        f"clock): **{r['budget_h200_80']:.1f} thread-instructions per weight byte**. A kernel "
        "above it cannot reach the decode goal whatever its memory access pattern; one below "
        "it may (only a GPU run can say).",
        "",
        "| kernel | M | tiles (M x N x K, warps) | loop instructions | per weight byte | "
        "registers | stack (spills) | top opcodes |",
        "|---|---:|---|---:|---:|---:|---:|---|",
    ]
    for c in r["cases"]:
        top = ", ".join(f"{k} {v}" for k, v in list(c["by_opcode"].items())[:6])
        lines.append(
            f"| {c['kernel']} | {c['M']} | {c['BLOCK_M']} x {c['BLOCK_N']} x {c['BLOCK_K']}, "
            f"{c['num_warps']} | {c['loop_instructions']} | "
            f"**{c['instructions_per_weight_byte']:.1f}** | {c['registers']} | {c['stack_bytes']} | "
            f"{top} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90 = sm_90)")
    ap.add_argument("--quick", action="store_true", help="M = 1 only; prints, writes nothing")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--summary", type=Path, default=DEFAULT_SUMMARY)
    args = ap.parse_args(argv)
    import tempfile

    import triton

    with tempfile.TemporaryDirectory() as tmp:
        results = [measure(m, x, args.arch, Path(tmp)) for m, x in cases(args.arch, args.quick)]
    r = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "triton": triton.__version__,
        "arch": args.arch,
        "host": platform.node(),
        "budget_h200_80": H200_BUDGET_AT_80_PERCENT,
        "cases": results,
    }
    text = summary(r)
    print(text)
    if not args.quick:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(r, indent=2) + "\n")
        args.summary.parent.mkdir(parents=True, exist_ok=True)
        args.summary.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
