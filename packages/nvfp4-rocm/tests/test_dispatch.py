"""The ROCm dispatch table and its environment overrides."""

from __future__ import annotations

import pytest
import torch
from nvfp4_rocm import dispatch


@pytest.fixture(autouse=True)
def _no_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(dispatch.PATH_ENV, raising=False)
    monkeypatch.delenv(dispatch.GATHER_PATH_ENV, raising=False)


@pytest.mark.parametrize(
    ("m", "arch", "want"),
    [
        (1, "gfx942", "gemv"),
        (8, "gfx942", "gemv"),
        (9, "gfx942", "dequant_matmul"),
        (4096, "gfx942", "dequant_matmul"),
        (8, "gfx950", "gemv"),
        (9, "gfx950", "dequant_matmul"),
        (16, "gfx1100", "gemv"),
        (17, "gfx1100", "dequant_matmul"),
        (16, "gfx1201", "gemv"),
        (17, "gfx1201", "dequant_matmul"),
        (1, "gfx90a", "gemv"),  # borrowed CDNA3 rule
    ],
)
def test_table(m: int, arch: str, want: str) -> None:
    assert dispatch.qmm_path(m, torch.bfloat16, arch) == want


def test_float32_avoids_reduced_precision_dense_matmul() -> None:
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")  # XF32 / TF32 allowed: not exact enough
        assert dispatch.qmm_path(64, torch.float32, "gfx942") == "gemm"
        assert dispatch.qmm_path(64, torch.bfloat16, "gfx942") == "dequant_matmul"
        torch.set_float32_matmul_precision("highest")
        assert dispatch.qmm_path(64, torch.float32, "gfx942") == "dequant_matmul"
    finally:
        torch.set_float32_matmul_precision(before)


def test_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(dispatch.PATH_ENV, "gemm")
    assert dispatch.qmm_path(1, torch.float16, "gfx942") == "gemm"
    monkeypatch.setenv(dispatch.PATH_ENV, "mxfp4")
    with pytest.raises(ValueError, match=r"NVFP4_ROCM_PATH='mxfp4'.*gemv, gemm, dequant_matmul"):
        dispatch.qmm_path(1, torch.float16, "gfx942")
    monkeypatch.setenv(dispatch.GATHER_PATH_ENV, "rows")
    assert dispatch.gather_path(4096, True, "gfx942") == "rows"
    monkeypatch.setenv(dispatch.GATHER_PATH_ENV, "sorted")
    with pytest.raises(ValueError, match="rows, grouped"):
        dispatch.gather_path(1, False, "gfx942")


def test_gather_table() -> None:
    assert dispatch.gather_path(16, False, "gfx942") == "rows"
    assert dispatch.gather_path(4, True, "gfx942") == "grouped"
    assert dispatch.gather_path(17, False, "gfx1201") == "grouped"


def test_every_rule_is_provisional_until_measured() -> None:
    assert set(dispatch.RULES) == {"cdna3", "cdna4", "rdna3", "rdna4"}
    for key, rule in dispatch.RULES.items():
        assert rule.measured is False or "benchmarks/results" in rule.source, key
        assert "not measured" in rule.source or rule.measured
    assert "unmeasured" in (dispatch.__doc__ or "")


def test_emulated_w4a4_keeps_globals_after_accumulation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Never dequant_matmul (it folds the weight global into each element before the sum)."""
    assert dispatch.w4a4_path(8, "gfx942") == "gemv"
    assert dispatch.w4a4_path(9, "gfx942") == "gemm"
    assert dispatch.w4a4_path(4096, "gfx950") == "gemm"
    assert dispatch.w4a4_path(16, "gfx1201") == "gemv"
    monkeypatch.setenv(dispatch.PATH_ENV, "dequant_matmul")
    assert dispatch.w4a4_path(1, "gfx942") == "dequant_matmul"
