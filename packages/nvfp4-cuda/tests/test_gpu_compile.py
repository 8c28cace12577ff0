"""Every Triton kernel, launched as the cuda backend launches it, compiles for every NVIDIA
architecture the backend supports - without a GPU (Triton ships ptxas). The interpreter
runs the kernels' logic in the other tests but accepts things a GPU compile refuses; this
closes that gap. It runs in a fresh process: the conftest's TRITON_INTERPRET=1 makes the
kernels interpreter objects, which cannot be compiled."""

from __future__ import annotations

from nvfp4_triton.aot import run_fresh

SCRIPT = """
from nvfp4_cuda.configs import config_for
from nvfp4_triton.aot import TARGETS, compile_all

targets = [(t, config_for((t[1] // 10, t[1] % 10))) for t in TARGETS if t[0] == "cuda"]
assert len(targets) == 4, targets
failures = compile_all(targets, dtypes=("bfloat16",), rows=(1,))
# the GEMV's several-rows path and float32 / float16 operands, on Hopper
failures += compile_all(targets[1:2], dtypes=("float32", "float16"), rows=(4,))
print("\\n".join(failures) or "all compiled")
raise SystemExit(1 if failures else 0)
"""


def test_every_kernel_compiles_for_every_nvidia_architecture() -> None:
    r = run_fresh(SCRIPT)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "all compiled" in r.stdout
