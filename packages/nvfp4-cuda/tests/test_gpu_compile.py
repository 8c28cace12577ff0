"""Every Triton kernel, launched as the cuda backend launches it, compiles for every NVIDIA
architecture the backend supports - without a GPU (Triton ships ptxas). The interpreter
runs the kernels' logic in the other tests but accepts things a GPU compile refuses; this
closes that gap (in a fresh process: the conftest's TRITON_INTERPRET=1 makes the kernels
interpreter objects, which cannot be compiled). The several-rows GEMV and float32 /
float16 operands are compiled for Hopper."""

from __future__ import annotations

import os
import subprocess
import sys

from nvfp4_triton.testing import assert_every_kernel_compiles


def test_every_kernel_compiles_for_every_nvidia_architecture() -> None:
    assert_every_kernel_compiles(
        "cuda", "nvfp4_cuda.configs", "configs.config_for((t[1] // 10, t[1] % 10))", detailed=1
    )


def test_a_compile_is_keyed_the_same_in_every_process() -> None:
    """Triton caches a compile under a key that includes the text of the divisibility
    attributes; they are listed in argument order, so a second run (another process, another
    string hashing) finds the first one's compile instead of spending a minute again."""
    script = """
import nvfp4_cuda.configs as configs
from nvfp4_triton.aot import TARGETS, launches, source

for t in TARGETS:
    if t[0] == "cuda":
        for launch in launches(configs.config_for((t[1] // 10, t[1] % 10))):
            print(t[1], launch.name, ",".join(launch.divisible), source(launch).hash())
"""
    outs = []
    for seed in ("1", "2"):
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["PYTHONHASHSEED"] = seed
        r = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
        )
        assert r.returncode == 0, r.stderr[-4000:]
        outs.append(r.stdout.splitlines())
    assert len(outs[0]) > 20
    # the sets really were iterated in different orders (else the test proves nothing) ...
    orders = [[line.split()[2] for line in out] for out in outs]
    assert orders[0] != orders[1]
    # ... and every launch has the same key in both processes
    keys = [[(line.split()[0], line.split()[1], line.split()[3]) for line in out] for out in outs]
    assert keys[0] == keys[1]
