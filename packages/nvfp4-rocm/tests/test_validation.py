"""The same planes validation in front of every entry point: malformed planes - above all a
scales plane of the wrong shape, which would make a kernel read or write past it - are
refused with a PlaneError naming the tensor before anything is copied to the device or any
kernel launches."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch
from nvfp4 import reference
from nvfp4.planes import NVFP4Planes, PlaneError
from nvfp4.testing import raw_planes
from nvfp4_rocm import ROCmBackend
from nvfp4_triton import backend as triton_backend
from nvfp4_triton import ops

LAUNCHES = ("qmm", "gemv", "gemm", "dequant_matmul", "gather", "dequantize", "quantize_activations")


def _spy(monkeypatch: pytest.MonkeyPatch, *, upload: bool) -> list[str]:
    """Replace every kernel launcher (and the device upload when ``upload``) by spies that
    record the call and fail."""
    calls: list[str] = []

    def spy(what: str) -> Callable[..., Any]:
        def record(*_: Any, **__: Any) -> Any:
            calls.append(what)
            raise AssertionError(f"{what} ran on malformed planes")

        return record

    for name in LAUNCHES:
        monkeypatch.setattr(ops, name, spy(f"ops.{name}"))
    if upload:
        monkeypatch.setattr(triton_backend, "upload", spy("upload"))
    return calls


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Kernel launches and device uploads, recorded (and failing)."""
    return _spy(monkeypatch, upload=True)


def _dense(n: int = 8, k: int = 64) -> NVFP4Planes:
    return reference.quantize(np.random.default_rng(0).standard_normal((n, k)).astype(np.float32))


def _bad_scales(experts: bool) -> list[tuple[str, NVFP4Planes, str]]:
    lead = (2,) if experts else ()
    codes = np.zeros((*lead, 8, 32), np.uint8)
    g = np.ones(lead, np.float32)
    tag = "moe" if experts else "dense"
    return [
        (
            "one scale column short",
            raw_planes(codes, np.full((*lead, 8, 3), 0x38, np.uint8), g, name=f"{tag}.short"),
            "scales.shape[-1]",
        ),
        (
            "one scale column too many",
            raw_planes(codes, np.full((*lead, 8, 5), 0x38, np.uint8), g, name=f"{tag}.long"),
            "scales.shape[-1]",
        ),
        (
            "one scale row short",
            raw_planes(codes, np.full((*lead, 7, 4), 0x38, np.uint8), g, name=f"{tag}.rows"),
            "scales leading shape",
        ),
        (
            "flat scales",
            raw_planes(codes, np.full(8 * 4 * (2 if experts else 1), 0x38, np.uint8), g, name=tag),
            "scales rank",
        ),
    ]


@pytest.mark.parametrize("case", range(4))
def test_wrong_scales_refused_before_any_kernel(
    amd: ROCmBackend, launches: list[str], case: int
) -> None:
    what, planes, field = _bad_scales(experts=False)[case]
    x = torch.ones(2, 64)
    verbs: list[tuple[str, Callable[[], Any]]] = [
        ("prepare", lambda: amd.prepare(planes)),
        ("qmm", lambda: amd.qmm(x, planes)),
        ("dequantize", lambda: amd.dequantize(planes)),
        ("qmm_w4a4", lambda: amd.qmm_w4a4(x, planes)),
    ]
    for verb, call in verbs:
        with pytest.raises(PlaneError, match=re.escape(field)) as err:
            call()
        assert err.value.tensor == planes.name, (what, verb)
    assert launches == []


@pytest.mark.parametrize("case", range(4))
def test_wrong_expert_scales_refused_before_any_kernel(
    amd: ROCmBackend, launches: list[str], case: int
) -> None:
    what, planes, field = _bad_scales(experts=True)[case]
    with pytest.raises(PlaneError, match=re.escape(field)) as err:
        amd.gather_qmm(torch.ones(3, 64), planes, torch.tensor([0, 1, 5]))
    assert err.value.tensor == planes.name, what
    assert launches == []


def test_content_is_validated_at_prepare(amd: ROCmBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    """Scale bytes and globals are read (O(n)) when the planes are prepared, before any
    kernel sees them."""
    launches = _spy(monkeypatch, upload=False)
    p = _dense()
    scales = p.scales.copy()
    scales[3, 1] = 0x7F  # the E4M3 NaN byte
    with pytest.raises(PlaneError, match="scale"):
        amd.prepare(p.replace(scales=scales))
    with pytest.raises(PlaneError, match="global"):
        amd.qmm(torch.ones(1, 64), p.replace(global_scale=np.asarray(np.inf, np.float32)))
    assert launches == []


def test_hand_built_device_weight_with_wrong_scales(amd: ROCmBackend) -> None:
    """The device-side twin of the check: a DeviceWeight whose scales tensor is not
    [rows, K/16] cannot be built, so no kernel can be handed one."""
    good = amd.prepare(_dense()).payload
    for shape in ((8, 3), (8, 5), (7, 4), (32,)):
        with pytest.raises(PlaneError, match="device scales") as err:
            # the uploaded weight but for its name and scales: __post_init__ checks again
            replace(good, name="handmade", scales=torch.zeros(shape, dtype=torch.uint8))
        assert err.value.tensor == "handmade"


def test_inputs_are_checked(amd: ROCmBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    w = amd.prepare(_dense())
    moe = amd.prepare(reference.quantize(np.ones((2, 8, 64), np.float32)))
    launches = _spy(monkeypatch, upload=True)
    with pytest.raises(ValueError, match="K = 64"):
        amd.qmm(torch.ones(2, 48), w)
    with pytest.raises(ValueError, match="gather_qmm"):
        amd.qmm(torch.ones(2, 64), moe)
    with pytest.raises(ValueError, match="expert_ids must be integer"):
        amd.gather_qmm(torch.ones(2, 64), moe, torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"\[M\] with M = 2"):
        amd.gather_qmm(torch.ones(2, 64), moe, torch.tensor([0, 1, 1]))
    with pytest.raises(ValueError, match="multiple of 16"):
        amd.quantize_activations(torch.ones(2, 40))
    assert launches == []
