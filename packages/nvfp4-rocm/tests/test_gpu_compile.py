"""Every Triton kernel, launched as the rocm backend launches it, compiles for CDNA3 / CDNA4
(64-lane wavefronts) and RDNA3 / RDNA4 (32-lane) - without a GPU (Triton ships the AMD
backend and its linker). The interpreter runs the kernels' logic in the other tests but
accepts things a GPU compile refuses; this closes that gap. It runs in a fresh process:
the conftest's TRITON_INTERPRET=1 makes the kernels interpreter objects."""

from __future__ import annotations

from nvfp4_triton.aot import run_fresh

SCRIPT = """
from nvfp4_rocm.configs import config_for
from nvfp4_triton.aot import TARGETS, compile_all

targets = [(t, config_for(t[1])) for t in TARGETS if t[0] == "hip"]
assert len(targets) == 4, targets
assert [t[2] for t, cfg in targets] == [cfg.lanes for t, cfg in targets], "warp sizes"
failures = compile_all(targets, dtypes=("bfloat16",), rows=(1,))
# the GEMV's several-rows path and float32 / float16 operands, on CDNA3
failures += compile_all(targets[:1], dtypes=("float32", "float16"), rows=(4,))
print("\\n".join(failures) or "all compiled")
raise SystemExit(1 if failures else 0)
"""


def test_every_kernel_compiles_for_every_amd_architecture() -> None:
    r = run_fresh(SCRIPT)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "all compiled" in r.stdout
