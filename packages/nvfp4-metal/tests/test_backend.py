"""The backend as users reach it: entry point, cheap import, availability, capabilities,
the implementation switch, refusals."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import numpy as np
import nvfp4_metal
import pytest
from nvfp4.planes import PlaneError
from nvfp4.registry import discover
from nvfp4.testing import random_planes
from nvfp4_metal.backend import NATIVE_CAPABILITIES, PRIORITY_APPLE, PRIORITY_OTHER, MetalBackend


def test_entry_point_registered() -> None:
    entries = discover()
    assert "metal" in entries, f"installed backends: {sorted(entries)}"


def test_import_is_cheap_and_does_not_import_mlx() -> None:
    code = (
        "import sys, json, nvfp4_metal; b = nvfp4_metal.backend(); "
        "print(json.dumps({'mlx': any(m == 'mlx' or m.startswith('mlx.') for m in sys.modules), "
        "'name': b.info.name, 'priority': b.info.priority}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    facts = json.loads(out.stdout)
    assert facts == {"mlx": False, "name": "metal", "priority": facts["priority"]}
    assert facts["priority"] in (PRIORITY_APPLE, PRIORITY_OTHER)


def test_priority_and_device_named_honestly(backend: Any) -> None:
    import mlx.core as mx

    avail = backend.availability()
    assert avail.ok, avail.reason
    on_apple = sys.platform == "darwin" and mx.metal.is_available()
    if on_apple:
        assert backend.info.priority == PRIORITY_APPLE
        assert avail.device.startswith("Apple Metal GPU")
    else:
        # below the cpu backend (50), above reference (0)
        assert backend.info.priority == PRIORITY_OTHER
        assert 0 < backend.info.priority < 50
        if mx.default_device().type == mx.cpu:
            assert avail.device.startswith("MLX CPU device")
            assert "GPU" not in avail.device
            assert "Metal" not in avail.device
    assert f"MLX {mx.__version__}" in avail.device


def test_capabilities_native(backend: Any) -> None:
    import mlx.core as mx

    assert backend.info.capabilities >= NATIVE_CAPABILITIES
    if mx.default_device().type == mx.cpu:
        # MLX's CPU qqmm ignores global scales: W4A4 is never declared there
        assert "w4a4" not in backend.info.capabilities
    assert "w4a8" not in backend.info.capabilities


def test_w4a4_not_faked_on_cpu(backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import mlx.core as mx

    monkeypatch.setenv("NVFP4_METAL_W4A4", "1")
    b = MetalBackend()
    if mx.default_device().type == mx.cpu:
        assert "w4a4" not in b.info.capabilities
        w = b.prepare(random_planes(np.random.default_rng(0), 8, 32))
        with pytest.raises(NotImplementedError, match="w4a4"):
            b.qmm_w4a4(np.ones((2, 32), np.float32), w)


def test_affine_rollback_declares_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVFP4_METAL_IMPL", "affine")
    b = MetalBackend()
    assert b.impl == "affine"
    assert b.info.capabilities == frozenset()
    assert any("affine" in n for n in b.info.notes)
    assert b.availability().ok
    assert "affine rollback" in b.availability().device


def test_invalid_impl_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVFP4_METAL_IMPL", "fast")
    b = nvfp4_metal.backend()  # the factory never raises
    avail = b.availability()
    assert not avail.ok
    assert "NVFP4_METAL_IMPL" in avail.reason
    assert "native" in avail.reason
    with pytest.raises(RuntimeError, match="cannot run here: NVFP4_METAL_IMPL"):
        b.prepare(random_planes(np.random.default_rng(0), 4, 32))


def test_verbs_refuse_malformed_planes(backend: Any) -> None:
    from nvfp4.planes import NVFP4Planes

    bad = object.__new__(NVFP4Planes)
    for field, value in (
        ("codes", np.zeros((4, 16), np.uint8)),
        ("scales", np.zeros((4, 3), np.uint8)),  # K/16 = 2 expected
        ("global_scale", np.float32(1.0)),
        ("partitions", None),
        ("name", "bad_scales"),
    ):
        object.__setattr__(bad, field, value)
    x = np.ones((2, 32), np.float32)
    for call in (
        lambda: backend.prepare(bad),
        lambda: backend.qmm(x, bad),
        lambda: backend.dequantize(bad),
    ):
        with pytest.raises(PlaneError, match="bad_scales"):
            call()


def test_prepare_refuses_bad_content(backend: Any) -> None:
    p = random_planes(np.random.default_rng(1), 8, 32, name="bad_byte")
    scales = p.scales.copy()
    scales[3, 1] = 0x80
    with pytest.raises(PlaneError, match="bad_byte"):
        backend.prepare(p.replace(scales=scales))
    with pytest.raises(PlaneError, match="bad_global"):
        backend.prepare(p.replace(global_scale=np.float32(np.nan), name="bad_global"))


def test_to_numpy_round_trips_dtypes(backend: Any) -> None:
    import ml_dtypes

    for dt in (np.float32, np.float16, ml_dtypes.bfloat16):
        a = np.arange(6, dtype=np.float32).reshape(2, 3).astype(dt)
        back = backend.to_numpy(backend.from_numpy(a))
        assert back.dtype == np.dtype(dt)
        assert np.array_equal(back.astype(np.float32), a.astype(np.float32))
