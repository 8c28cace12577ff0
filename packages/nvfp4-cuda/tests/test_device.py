"""Availability: the interpreter (never named as a GPU), missing GPUs, ROCm builds, old
GPUs, and what a Hopper or Blackwell GPU would get (device queries monkeypatched)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from nvfp4 import reference
from nvfp4_cuda import backend, configs, device
from nvfp4_triton import INTERPRETER_DEVICE
from nvfp4_triton.testing import (
    assert_import_is_light,
    assert_w4a8_declared,
    driver_without_gpu_torch_reason,
    fake_gpu,
    registered_entry_point,
)


def test_import_needs_neither_torch_nor_triton() -> None:
    assert_import_is_light("nvfp4_cuda")


def test_entry_point_is_registered() -> None:
    assert registered_entry_point("cuda") == "nvfp4_cuda:backend"


def test_interpreter_mode_is_available_and_says_so() -> None:
    b = backend()
    a = b.availability()
    assert a.ok
    assert a.device == INTERPRETER_DEVICE == "Triton interpreter on CPU"
    assert b.info.priority == 100
    assert b.info.name == "cuda"
    assert "w4a4" not in b.info.capabilities
    assert {"w4a8", "w4a8_fp8"} <= b.info.capabilities  # the interpreter runs both
    assert {
        "qmm",
        "gather_qmm",
        "dequantize",
        "quantize_activations",
        "fused_partitions",
    } <= b.info.capabilities
    assert any("interpreter" in n for n in b.info.notes)
    assert b.platform().config is configs.INTERPRETER


def test_interpreter_never_names_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H100")
    assert backend().availability().device == INTERPRETER_DEVICE


def test_no_gpu_without_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(device, "driver_evidence", lambda vendor: "")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    a = backend().availability()
    assert not a.ok
    assert "no CUDA GPU" in a.reason
    assert "TRITON_INTERPRET=1" in a.reason
    planes = reference.quantize(np.ones((4, 32), np.float32))
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        backend().prepare(planes)


def test_rocm_build_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(torch.version, "hip", "6.2.0", raising=False)
    a = backend().availability()
    assert not a.ok
    assert "ROCm" in a.reason
    assert "nvfp4-rocm" in a.reason


def _fake_gpu(monkeypatch: pytest.MonkeyPatch, cap: tuple[int, int], name: str, sms: int) -> None:
    fake_gpu(monkeypatch, hip=None, multi_processor_count=sms)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: cap)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: name)


@pytest.mark.parametrize(
    ("cap", "w4a4", "tiles", "w4a8", "fp8"),
    [
        ((8, 0), False, "sm_80", True, False),
        ((8, 9), False, "sm_89", True, True),
        ((9, 0), False, "sm_90", True, True),
        ((10, 0), True, "sm_100", False, True),
        ((12, 0), True, "sm_120", False, True),
    ],
)
def test_gpu_generations(
    monkeypatch: pytest.MonkeyPatch,
    cap: tuple[int, int],
    w4a4: bool,
    tiles: str,
    w4a8: bool,
    fp8: bool,
) -> None:
    _fake_gpu(monkeypatch, cap, "NVIDIA Test GPU", 132)
    b = backend()
    a = b.availability()
    assert a.ok
    assert a.device == f"NVIDIA Test GPU, compute capability {cap[0]}.{cap[1]}, 132 SMs"
    p = b.platform()
    assert p.torch_device == "cuda:0"
    assert p.config is not None
    assert p.config.name == tiles
    assert p.config.gemv.split_k_programs == 264
    assert p.config.lanes == 32
    assert ("w4a4" in b.info.capabilities) is w4a4
    assert any(
        ("W4A4: torch._scaled_mm" if w4a4 else "W4A4 not declared") in n for n in b.info.notes
    )
    # W4A8: int8 tensor cores declared on 8.x / 9.x, FP8 from 8.9 on; never emulated
    assert_w4a8_declared(b.info, f"sm_{cap[0]}{cap[1]}", w4a8, fp8)


def test_old_gpu_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_gpu(monkeypatch, (7, 5), "Tesla T4", 40)
    a = backend().availability()
    assert not a.ok
    assert "7.5" in a.reason
    assert "8.0" in a.reason


def test_detection_errors_never_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_: Any) -> Any:
        raise RuntimeError("CUDA driver initialization failed")

    _fake_gpu(monkeypatch, (9, 0), "x", 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", boom)
    a = backend().availability()
    assert not a.ok
    assert "driver initialization failed" in a.reason


def test_configs_cover_the_generations() -> None:
    for major in (8, 9, 10, 12):
        assert configs.config_for((major, 0)).name == f"sm_{major}0"
    assert configs.config_for((11, 0)).gemm == configs.AMPERE.gemm  # unknown major: safe tiles
    assert device.MIN_CAPABILITY == (8, 0)


def test_driver_with_cpu_only_torch_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """An NVIDIA driver but a CPU build of torch: one line naming both and the two ways out,
    never a silent fall-back to the interpreter."""
    reason = driver_without_gpu_torch_reason(monkeypatch, device, backend, "/dev/nvidiactl")
    assert "an NVIDIA driver is loaded (/dev/nvidiactl)" in reason
    assert f"torch {torch.__version__} is a CPU-only build" in reason
