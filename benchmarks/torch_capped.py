"""torch's dense float32 matmul capped at one x86 instruction set, for the CPU benchmark.

Which vector width torch's matmul uses is fixed when its libraries load (MKL reads
``MKL_ENABLE_INSTRUCTIONS``, oneDNN ``DNNL_MAX_CPU_ISA``, ATen ``ATEN_CPU_CAPABILITY``), so
one process cannot run it both at AVX-512 and at AVX2. This module runs a child process with
those caps and asks it for one timed matmul at a time, so that ``cpu_kernels.py`` can hold our
AVX2 level against torch's AVX2 code on an AVX-512 machine, as it holds it against ggml's
``haswell`` variant: an AVX2-only CPU (AMD Zen 2 / 3, older Xeons) runs exactly that.

The child times each call itself (``time.perf_counter`` around ``torch.matmul``), so the pipe
between the two processes costs nothing in the figures. Its weights are random normal
float32 of the shape asked (a dense matmul's speed does not depend on the values).

Run as a script it is that child: one JSON request a line on stdin, one JSON answer a line
on stdout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

#: The environment that caps each library at one instruction set, per level.
CAPS: dict[str, dict[str, str]] = {
    "avx2": {
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "DNNL_MAX_CPU_ISA": "AVX2",
        "ATEN_CPU_CAPABILITY": "avx2",
    },
}


class CappedTorch:
    """A child process running torch's float32 matmul under :data:`CAPS` ``[isa]``."""

    def __init__(self, isa: str, threads: int) -> None:
        env = dict(os.environ)
        env.update(CAPS[isa])
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env[var] = str(threads)
        self.isa = isa
        self.proc = subprocess.Popen(
            [sys.executable, __file__, str(threads)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        hello = self._ask({"op": "hello"})
        #: what torch reports in the child (``torch.backends.cpu.get_cpu_capability()``)
        self.capability = str(hello["capability"])
        if self.capability.lower() != isa:
            self.close()
            raise RuntimeError(
                f"torch in the capped child reports capability {self.capability!r}, not {isa!r}"
            )

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the capped torch child exited ({self.proc.wait()})")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"the capped torch child failed: {answer['error']}")
        return answer

    def weight(self, n: int, k: int) -> None:
        """Make the child's [n, k] float32 weight (replacing the one before)."""
        self._ask({"op": "weight", "n": n, "k": k})

    def matmul(self, m: int) -> float:
        """Seconds of one ``[m, k] @ weight.T`` in the child (its activations made once per m)."""
        return float(self._ask({"op": "run", "m": m})["seconds"])

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


def _child(threads: int) -> None:
    import time

    import torch

    torch.set_num_threads(threads)
    w = None
    xs: dict[int, Any] = {}
    out: dict[int, Any] = {}
    for line in sys.stdin:
        req = json.loads(line)
        try:
            if req["op"] == "hello":
                answer: dict[str, Any] = {"capability": torch.backends.cpu.get_cpu_capability()}
            elif req["op"] == "weight":
                gen = torch.Generator().manual_seed(int(req["n"]) + int(req["k"]))
                w = torch.randn((int(req["n"]), int(req["k"])), generator=gen)
                xs.clear()
                out.clear()
                answer = {"ok": True}
            elif req["op"] == "run" and w is not None:
                m = int(req["m"])
                if m not in xs:
                    gen = torch.Generator().manual_seed(m)
                    xs[m] = torch.randn((m, w.shape[1]), generator=gen)
                    out[m] = torch.empty((m, w.shape[0]))
                t0 = time.perf_counter()
                torch.matmul(xs[m], w.t(), out=out[m])
                answer = {"seconds": time.perf_counter() - t0}
            else:
                answer = {"error": f"bad request {req!r}"}
        except Exception as exc:  # reported to the parent, which raises
            answer = {"error": repr(exc)}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _child(int(sys.argv[1]))
