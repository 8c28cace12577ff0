"""The dispatch table and its environment overrides."""

from __future__ import annotations

import pytest
import torch
from nvfp4_cuda import dispatch


@pytest.mark.parametrize(
    ("m", "cap", "want"),
    [
        (1, (9, 0), "gemv"),
        (4, (9, 0), "gemv"),
        (5, (9, 0), "gemm"),
        (1023, (9, 0), "gemm"),
        (1024, (9, 0), "dequant_matmul"),
        (4096, (10, 0), "dequant_matmul"),
        (16, (8, 6), "gemm"),
        (16, None, "gemv"),
        (17, None, "gemm"),
        (100000, None, "gemm"),
    ],
)
def test_table(m: int, cap: tuple[int, int] | None, want: str) -> None:
    assert dispatch.qmm_path(m, 4096, 4096, torch.bfloat16, cap) == want


def test_float32_avoids_tf32_dense_matmul() -> None:
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")  # TF32 allowed: not exact enough
        assert dispatch.qmm_path(4096, 64, 64, torch.float32, (9, 0)) == "gemm"
        torch.set_float32_matmul_precision("highest")
        assert dispatch.qmm_path(4096, 64, 64, torch.float32, (9, 0)) == "dequant_matmul"
    finally:
        torch.set_float32_matmul_precision(before)


def test_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(dispatch.PATH_ENV, "dequant_matmul")
    assert dispatch.qmm_path(1, 8, 16, torch.float16, (9, 0)) == "dequant_matmul"
    monkeypatch.setenv(dispatch.PATH_ENV, "w4a4")
    with pytest.raises(ValueError, match="gemv, gemm, dequant_matmul"):
        dispatch.qmm_path(1, 8, 16, torch.float16, (9, 0))
    monkeypatch.setenv(dispatch.GATHER_PATH_ENV, "rows")
    assert dispatch.gather_path(4096, 8, 16, 8, True, (9, 0)) == "rows"


def test_gather_table() -> None:
    assert dispatch.gather_path(4, 8, 16, 8, False, (9, 0)) == "rows"
    assert dispatch.gather_path(4, 8, 16, 8, True, (9, 0)) == "grouped"
    assert dispatch.gather_path(17, 8, 16, 8, False, None) == "grouped"


def test_every_row_is_provisional_until_measured() -> None:
    for key, c in dispatch.TABLE.items():
        assert c.measured is False or "benchmarks/results" in c.source, key
    assert "unmeasured" in (dispatch.__doc__ or "")
