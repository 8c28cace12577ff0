"""Availability: the interpreter with an AMD configuration (never named as a GPU), CPU and
CUDA builds of torch, a ROCm build without a GPU, and what each AMD architecture would get
(device queries monkeypatched)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from nvfp4 import get_backend, reference
from nvfp4_rocm import backend, device
from nvfp4_rocm.device import ARCH_ENV, DEFAULT_INTERPRETER_ARCH
from nvfp4_triton import INTERPRETER_DEVICE
from nvfp4_triton.testing import (
    assert_import_is_light,
    assert_w4a8_declared,
    driver_without_gpu_torch_reason,
    fake_gpu,
    registered_entry_point,
)

BASE_CAPS = {"qmm", "gather_qmm", "dequantize", "quantize_activations", "fused_partitions"}


def test_import_needs_neither_torch_nor_triton() -> None:
    assert_import_is_light("nvfp4_rocm")


def test_entry_point_is_registered() -> None:
    assert registered_entry_point("rocm") == "nvfp4_rocm:backend"


def test_interpreter_mode_on_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ARCH_ENV, raising=False)
    b = get_backend("rocm")
    a = b.availability()
    assert a.ok, a.reason
    assert DEFAULT_INTERPRETER_ARCH == "gfx942"
    assert a.device == (
        "Triton interpreter on CPU (AMD configuration gfx942: CDNA3, 64-lane wavefronts)"
    )
    assert a.device.startswith(INTERPRETER_DEVICE)
    info = b.info
    assert (info.name, info.priority, info.package) == ("rocm", 100, "nvfp4-rocm")
    assert BASE_CAPS | {"w4a4", "w4a8", "w4a8_fp8"} == set(info.capabilities)
    assert any(n.startswith("W4A8 int8:") for n in info.notes), info.notes
    assert any(n.startswith("W4A8 FP8:") for n in info.notes), info.notes
    assert any(n.startswith("W4A4 emulated") for n in info.notes), info.notes
    assert any("interpreter" in n for n in info.notes)
    assert any("nothing measured on AMD hardware" in n for n in info.notes)
    p = b.platform()
    assert p.interpreter
    assert (p.torch_device, p.arch) == ("cpu", "gfx942")
    assert p.config is not None
    assert p.config.lanes == 64
    assert p.config.dot_in_float32


def test_interpreter_with_an_rdna_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ARCH_ENV, "gfx1100")
    a = backend().availability()
    assert a.ok
    assert a.device == (
        "Triton interpreter on CPU (AMD configuration gfx1100: RDNA3, 32-lane wavefronts)"
    )
    # the interpreter runs every kernel, whichever architecture's tiles it imitates
    assert {"w4a8", "w4a8_fp8"} <= backend().info.capabilities


def test_interpreter_with_an_unknown_arch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ARCH_ENV, "sm_90")
    a = backend().availability()
    assert not a.ok
    assert a.reason.startswith(f"${ARCH_ENV}='sm_90'")
    assert "gfx942" in a.reason


def test_interpreter_never_names_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_gpu(monkeypatch, "gfx942:sramecc+:xnack-", "AMD Instinct MI300X", 304)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    a = backend().availability()
    assert a.device.startswith(INTERPRETER_DEVICE)
    assert "MI300X" not in a.device


def test_cpu_build_of_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(device, "driver_evidence", lambda vendor: "")
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.setattr(torch.version, "cuda", None, raising=False)
    b = backend()
    a = b.availability()
    assert not a.ok
    assert "CPU-only build" in a.reason
    assert "TRITON_INTERPRET=1" in a.reason
    with pytest.raises(RuntimeError, match="CPU-only build"):
        b.prepare(reference.quantize(np.ones((4, 32), np.float32)))


def test_cuda_build_of_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.setattr(torch.version, "cuda", "12.8", raising=False)
    a = backend().availability()
    assert not a.ok
    assert a.reason.startswith("this torch is a CUDA build (CUDA 12.8); install nvfp4-cuda")


def test_rocm_build_without_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "")
    monkeypatch.setattr(torch.version, "hip", "6.4.1", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    a = backend().availability()
    assert not a.ok
    assert "no AMD GPU visible to torch (ROCm 6.4.1 build; HIP_VISIBLE_DEVICES=''" in a.reason


def _fake_gpu(monkeypatch: pytest.MonkeyPatch, gcn: str, name: str, cus: int) -> None:
    fake_gpu(monkeypatch, hip="6.4.1", gcnArchName=gcn, multi_processor_count=cus, name=name)


@pytest.mark.parametrize(
    ("gcn", "name", "cus", "family", "lanes", "w4a8"),
    [
        ("gfx942:sramecc+:xnack-", "AMD Instinct MI300X", 304, "CDNA3", 64, True),
        ("gfx950:sramecc+:xnack-", "AMD Instinct MI355X", 256, "CDNA4", 64, True),
        ("gfx1100", "AMD Radeon RX 7900 XTX", 96, "RDNA3", 32, False),
        ("gfx1151", "AMD Radeon 8060S", 40, "RDNA3", 32, False),
        ("gfx1201", "AMD Radeon RX 9070 XT", 64, "RDNA4", 32, False),
    ],
)
def test_amd_gpus(
    monkeypatch: pytest.MonkeyPatch,
    gcn: str,
    name: str,
    cus: int,
    family: str,
    lanes: int,
    w4a8: bool,
) -> None:
    _fake_gpu(monkeypatch, gcn, name, cus)
    b = backend()
    a = b.availability()
    assert a.ok, a.reason
    arch = gcn.split(":")[0]
    assert a.device == f"{name} ({arch}, {family}, {cus} CUs, ROCm 6.4.1)"
    p = b.platform()
    assert not p.interpreter
    assert (p.torch_device, p.arch, p.multiprocessors) == ("cuda:0", arch, cus)
    assert p.config is not None
    assert (p.config.name, p.config.lanes) == (arch, lanes)
    assert p.config.gemv.split_k_programs == 2 * cus
    assert not p.config.dot_in_float32  # the interpreter's workaround stays off on a GPU
    assert "w4a4" in b.info.capabilities
    # W4A8: int8 and FP8 MFMA on CDNA3 (gfx942) and CDNA4 (gfx950) only; elsewhere the
    # capabilities are absent and the notes say why (never emulated)
    assert_w4a8_declared(b.info, arch, w4a8, w4a8)
    assert not any("not one of the considered" in n for n in b.info.notes)


def test_unlisted_gfx9_borrows_cdna3_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_gpu(monkeypatch, "gfx90a:sramecc+:xnack-", "AMD Instinct MI250X", 110)
    b = backend()
    assert b.availability().ok
    assert "CDNA3" in b.availability().device
    assert any("gfx90a is not one of the considered architectures" in n for n in b.info.notes)


def test_old_gpu_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_gpu(monkeypatch, "gfx803", "Radeon RX 580", 36)
    a = backend().availability()
    assert not a.ok
    assert a.reason.startswith("Radeon RX 580: GPU architecture gfx803")
    assert "need gfx9 (CDNA) or gfx10 and later" in a.reason


def test_missing_arch_name(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_gpu(monkeypatch, "", "Mystery GPU", 8)
    a = backend().availability()
    assert not a.ok
    assert "gcnArchName" in a.reason


def test_detection_errors_never_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_: Any) -> Any:
        raise RuntimeError("HIP error: no ROCm-capable device is detected")

    _fake_gpu(monkeypatch, "gfx942", "x", 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", boom)
    a = backend().availability()
    assert not a.ok
    assert "no ROCm-capable device" in a.reason


def test_driver_with_cpu_only_torch_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """An AMD driver (/dev/kfd) but a torch without ROCm: one line naming both and the two
    ways out, never a silent fall-back to the interpreter."""
    reason = driver_without_gpu_torch_reason(monkeypatch, device, backend, "/dev/kfd")
    assert "an AMD GPU driver is loaded (/dev/kfd)" in reason
    assert f"torch {torch.__version__} is not a ROCm build" in reason
