"""W4A4 glue (padding, swizzled scales, operand layout, globals after accumulation) on the
CPU, with ``torch._scaled_mm`` replaced by an emulation built from the spec tables: a
float64 product of the decoded FP4 operands, scales read back through the 128x4 layout.
Only the GPU GEMM itself is not exercised here (no Blackwell GPU in CI)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from nvfp4 import reference
from nvfp4.layouts import unswizzle_scales
from nvfp4.spec import E2M1_VALUES, E4M3_VALUES, GLOBAL_AMAX_DIVISOR
from nvfp4_cuda import CUDABackend, configs, w4a4
from nvfp4_triton.backend import Platform
from nvfp4_triton.testing import check_close

CALLS: list[dict[str, Any]] = []


def _decode(codes_u8: np.ndarray, scales_u8: np.ndarray) -> np.ndarray:
    c = reference.unpack_codes(codes_u8)
    return E2M1_VALUES[c].astype(np.float64) * np.repeat(
        E4M3_VALUES[scales_u8].astype(np.float64), 16, axis=1
    )


def fake_scaled_mm(
    a: Any, b: Any, scale_a: Any, scale_b: Any, out_dtype: Any = None, **_: Any
) -> Any:
    """What cuBLASLt's NVFP4 GEMM computes, checked against torch's operand rules."""
    assert a.dtype == torch.float4_e2m1fn_x2
    assert b.dtype == torch.float4_e2m1fn_x2
    assert scale_a.dtype == torch.float8_e4m3fn
    assert scale_b.dtype == torch.float8_e4m3fn
    assert a.stride(1) == 1, "A row-major"
    assert b.stride(0) == 1, "B column-major"
    m, kh = a.shape
    n = b.shape[1]
    assert kh % 16 == 0, "K % 32"
    assert n % 16 == 0, "N % 16"
    assert b.shape[0] == kh
    kb = kh * 2 // 16
    sa = unswizzle_scales(scale_a.view(torch.uint8).numpy(), m, kb)
    sb = unswizzle_scales(scale_b.view(torch.uint8).numpy(), n, kb)
    xa = _decode(a.view(torch.uint8).numpy(), sa)
    wb = _decode(b.t().contiguous().view(torch.uint8).numpy(), sb)
    CALLS.append({"m": m, "n": n, "k": kh * 2, "out_dtype": out_dtype})
    return torch.from_numpy(xa @ wb.T).to(out_dtype)


@pytest.fixture
def blackwell(monkeypatch: pytest.MonkeyPatch) -> CUDABackend:
    monkeypatch.setattr(torch, "_scaled_mm", fake_scaled_mm)
    b = CUDABackend()
    b.kernels._platform = Platform(
        True,
        device="emulated sm_100 (CPU)",
        torch_device="cpu",
        arch="sm_100",
        capability=(10, 0),
        config=configs.INTERPRETER,
    )
    CALLS.clear()
    return b


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(
    ("m", "n", "k", "parts", "scale"),
    [
        (3, 24, 64, None, None),
        (5, 45, 80, None, None),
        (33, 40, 96, (0, 16, 24, 40), None),
        (2, 16, 32, None, "static"),
    ],
)
def test_w4a4_matches_reference(
    blackwell: CUDABackend, m: int, n: int, k: int, parts: Any, scale: Any, dtype: str
) -> None:
    assert "w4a4" in blackwell.info.capabilities
    rng = np.random.default_rng(m + n + k)
    w = rng.standard_normal((n, k)).astype(np.float32)
    planes = reference.quantize(w, partitions=parts, name="w4a4")
    x = rng.standard_normal((m, k)).astype(np.float32)
    input_scale = float(np.abs(x).max() / GLOBAL_AMAX_DIVISOR * 1.5) if scale else None
    xt = torch.from_numpy(x).to(getattr(torch, dtype))
    y = blackwell.qmm_w4a4(xt, blackwell.prepare(planes), input_scale=input_scale)
    assert y.dtype == xt.dtype
    assert tuple(y.shape) == (m, n)
    ref = reference.qmm_w4a4(xt.float().numpy(), planes, input_scale=input_scale, out_dtype=None)
    check_close(y, ref, "w4a4", dtype, f"w4a4 {dtype}")
    call = CALLS[-1]
    assert call["out_dtype"] == torch.float32, "the globals multiply a float32 accumulator"
    assert call["k"] % 32 == 0
    assert call["n"] % 16 == 0


def test_weight_padding_is_cached(blackwell: CUDABackend) -> None:
    planes = reference.quantize(np.ones((5, 48), np.float32))
    w = blackwell.prepare(planes).payload
    first = w4a4.prepare_weight(w)
    assert w4a4.prepare_weight(w) is first
    codes, _swz, n_p, k_p = first
    assert (n_p, k_p) == (16, 64)
    assert tuple(codes.shape) == (16, 32)
    assert not codes[5:].any()
    assert not codes[:, 24:].any()


def test_not_supported_off_blackwell() -> None:
    for cap in ((8, 0), (9, 0)):
        p = Platform(
            True,
            device="x",
            torch_device="cuda:0",
            arch="sm",
            capability=cap,
            config=configs.HOPPER,
        )
        assert not w4a4.supported(p)
    assert not w4a4.supported(
        Platform(True, device="i", interpreter=True, config=configs.INTERPRETER)
    )
