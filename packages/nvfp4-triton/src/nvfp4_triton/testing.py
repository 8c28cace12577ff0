"""What the test suites of nvfp4-triton, nvfp4-cuda and nvfp4-rocm share: torch <-> numpy,
seeded activations as torch tensors, the spec's error measure against its tolerance
(:mod:`nvfp4.testing`), and the checks every Triton backend makes of itself (its import
stays light, its entry point is registered, every kernel compiles for its GPUs).

Test code only: it imports torch, so the backends never import it."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import ml_dtypes
import numpy as np
import numpy.typing as npt
import torch
from nvfp4.testing import activations, assert_within
from nvfp4.tolerances import tolerance

from .aot import run_fresh

if TYPE_CHECKING:
    import pytest

__all__ = [
    "DTYPES",
    "NUMPY",
    "TORCH",
    "assert_every_kernel_compiles",
    "assert_import_is_light",
    "assert_w4a8_declared",
    "check_close",
    "fake_gpu",
    "registered_entry_point",
    "to_numpy",
    "torch_activations",
]

TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
NUMPY = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
}
DTYPES = list(TORCH)


def to_numpy(t: Any) -> npt.NDArray[Any]:
    """A tensor as numpy (bfloat16 as ml_dtypes.bfloat16)."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    arr: npt.NDArray[Any] = t.numpy()
    return arr


def torch_activations(
    rng: np.random.Generator, m: int, k: int, dtype: str
) -> tuple[Any, npt.NDArray[np.float32]]:
    """:func:`nvfp4.testing.activations` in ``dtype`` as a torch tensor, and the same values
    as float32 numpy (the reference's input)."""
    xt = torch.from_numpy(activations(rng, m, k, "float32")).to(TORCH[dtype])
    x: npt.NDArray[np.float32] = xt.float().numpy()
    return xt, x


def check_close(y: Any, ref: npt.NDArray[Any], path: str, dtype: str, what: str) -> float:
    """Assert ``max|y - ref| / max|ref| <= tolerance(path, dtype)`` (the measure and its
    rules: :mod:`nvfp4.testing.errors`); return it."""
    figs = assert_within(to_numpy(y), ref, tolerance(path, dtype), what)
    return float(figs["max_rel_err"])


def assert_import_is_light(package: str) -> None:
    """``import <package>`` and making its backend load neither torch nor triton (run in a
    fresh interpreter with a bare environment)."""
    code = (
        f"import sys, {package}; {package}.backend(); "
        "print('torch' in sys.modules, 'triton' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert out.stdout.split() == ["False", "False"], out.stdout + out.stderr


def assert_w4a8_declared(info: Any, arch: str, int8: bool, fp8: bool) -> None:
    """A backend's ``info`` declares ``w4a8`` exactly when ``int8`` and ``w4a8_fp8`` exactly
    when ``fp8``, and its notes say what each kernel does where declared, else that it is
    not declared on ``arch`` (never emulated)."""
    assert ("w4a8" in info.capabilities) is int8
    assert ("w4a8_fp8" in info.capabilities) is fp8
    for declared, note, absent in (
        (int8, "W4A8 int8:", f"W4A8 (int8) not declared on {arch}"),
        (fp8, "W4A8 FP8:", f"W4A8 FP8 not declared on {arch}"),
    ):
        word = note if declared else absent
        assert any(n.startswith(word) for n in info.notes), info.notes


def registered_entry_point(name: str) -> str | None:
    """The value of the ``nvfp4.backends`` entry point ``name``, if one is installed."""
    eps = {ep.name: ep.value for ep in entry_points(group="nvfp4.backends")}
    return eps.get(name)


def assert_every_kernel_compiles(vendor: str, configs: str, config_of: str, detailed: int) -> None:
    """Every kernel, launched as a backend launches it, compiles for each of ``vendor``'s
    four :data:`~nvfp4_triton.aot.TARGETS` (``"cuda"`` or ``"hip"``), with the config
    ``config_of`` gives: an expression of the target ``t`` and the backend's module
    ``configs`` (imported as ``configs``). bfloat16 operands and one row everywhere; target
    number ``detailed`` also float32 / float16 and the GEMV's several-rows path. It runs in
    a fresh process: the interpreter's kernels (``TRITON_INTERPRET=1``) cannot be compiled."""
    script = f"""
import {configs} as configs
from nvfp4_triton.aot import TARGETS, compile_all

targets = [(t, {config_of}) for t in TARGETS if t[0] == {vendor!r}]
assert len(targets) == 4, targets
assert [t[2] for t, cfg in targets] == [cfg.lanes for t, cfg in targets], "warp sizes"
failures = compile_all(targets, dtypes=("bfloat16",), rows=(1,))
failures += compile_all(
    targets[{detailed}:{detailed + 1}], dtypes=("float32", "float16"), rows=(4,)
)
print("\\n".join(failures) or "all compiled")
raise SystemExit(1 if failures else 0)
"""
    r = run_fresh(script)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "all compiled" in r.stdout


def fake_gpu(monkeypatch: pytest.MonkeyPatch, *, hip: str | None, **properties: Any) -> None:
    """Make torch's device queries answer as one GPU (device 0) with these
    ``get_device_properties`` attributes, under a ROCm build ``hip`` (or a CUDA build when
    None), with the interpreter off."""
    props = SimpleNamespace(**properties)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(torch.version, "hip", hip, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i=0: props)


def driver_without_gpu_torch_reason(
    monkeypatch: pytest.MonkeyPatch, device: Any, backend: Any, evidence: str
) -> str:
    """The unavailability reason of ``backend()`` when ``device`` finds a vendor driver at
    ``evidence`` but torch is a CPU-only build, with the interpreter off; checked to be one
    line that names the interpreter as a way out (the caller checks the vendor's words)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(device, "driver_evidence", lambda vendor: evidence)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.setattr(torch.version, "cuda", None, raising=False)
    a = backend().availability()
    assert not a.ok
    assert "\n" not in a.reason
    assert "TRITON_INTERPRET=1" in a.reason
    return str(a.reason)
