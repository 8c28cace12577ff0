"""Every verb of the rocm backend under the interpreter, with a 64-lane CDNA configuration
(gfx942) and a 32-lane RDNA one (gfx1201) - the real tiles of each, run by the shared
kernels - against nvfp4.reference with the spec's tolerances (exact where the spec says
exact)."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch
from nvfp4 import reference
from nvfp4.spec import GLOBAL_AMAX_DIVISOR
from nvfp4.testing import assert_within, relative_error
from nvfp4.tolerances import tolerance
from nvfp4_rocm import ROCmBackend, dispatch
from nvfp4_triton.testing import NUMPY, TORCH, check_close, torch_activations


def _close(y: torch.Tensor, ref: npt.NDArray[Any], path: str, dtype: str) -> float:
    assert y.dtype == TORCH[dtype]
    return check_close(y, ref, path, dtype, f"{path} {dtype}")


def _bits(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
    a = np.ascontiguousarray(a)
    return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


# ------------------------------------------------------------------------------ qmm
@pytest.mark.parametrize("path", ["", "gemv", "gemm", "dequant_matmul"])
@pytest.mark.parametrize("m", [1, 3, 33])
def test_qmm_every_path(
    amd: ROCmBackend, monkeypatch: pytest.MonkeyPatch, path: str, m: int
) -> None:
    """Ragged N (45) split into three fused partitions with their own globals."""
    monkeypatch.setenv(dispatch.PATH_ENV, path)
    rng = np.random.default_rng(m)
    planes = reference.quantize(
        rng.standard_normal((45, 96)).astype(np.float32), partitions=(0, 8, 24, 45), name="qkv"
    )
    assert planes.global_scale.shape == (3,)
    xt, x = torch_activations(rng, m, 96, "float32")
    y = amd.qmm(xt, amd.prepare(planes))
    assert tuple(y.shape) == (m, 45)
    _close(y, reference.qmm(x, planes, out_dtype=None), "qmm", "float32")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("m", [1, 33])
def test_qmm_half_dtypes_by_dispatch(amd: ROCmBackend, dtype: str, m: int) -> None:
    rng = np.random.default_rng(7 + m)
    planes = reference.quantize(rng.standard_normal((40, 64)).astype(np.float32))
    xt, x = torch_activations(rng, m, 64, dtype)
    y = amd.qmm(xt, amd.prepare(planes))
    _close(y, reference.qmm(x, planes, out_dtype=None), "qmm", dtype)


def test_qmm_split_k_and_leading_axes(amd: ROCmBackend) -> None:
    """K = 1024 is two GEMV chunks of 512: split-K runs (the config asks for two programs
    per CU) and its fixed-order reduction gives the same bits on every call."""
    rng = np.random.default_rng(11)
    planes = reference.quantize(rng.standard_normal((24, 1024)).astype(np.float32))
    w = amd.prepare(planes)
    xt, x = torch_activations(rng, 2, 1024, "float32")
    y = amd.qmm(xt.reshape(2, 1, 1024), w)
    assert tuple(y.shape) == (2, 1, 24)
    _close(y.reshape(2, 24), reference.qmm(x, planes, out_dtype=None), "qmm", "float32")
    assert torch.equal(y, amd.qmm(xt.reshape(2, 1, 1024), w))


# ----------------------------------------------------------------------- gather_qmm
@pytest.mark.parametrize("path", ["", "rows", "grouped"])
@pytest.mark.parametrize("sorted_ids", [False, True])
def test_gather_qmm(
    amd: ROCmBackend, monkeypatch: pytest.MonkeyPatch, path: str, sorted_ids: bool
) -> None:
    """Per-expert globals, ragged N, out-of-range ids (negative and >= E) on rows of x
    holding NaN: those output rows are exactly zero."""
    monkeypatch.setenv(dispatch.GATHER_PATH_ENV, path)
    rng = np.random.default_rng(3)
    planes = reference.quantize(rng.standard_normal((3, 21, 64)).astype(np.float32))
    assert planes.global_scale.shape == (3,)
    ids = np.array([2, 0, -1, 0, 3, 1, 2, 99, 0])
    if sorted_ids:
        ids = np.sort(ids)
    xt, x = torch_activations(rng, len(ids), 64, "float32")
    bad = (ids < 0) | (ids >= 3)
    xt[torch.from_numpy(bad)] = float("nan")
    y = amd.gather_qmm(xt, amd.prepare(planes), torch.from_numpy(ids), sorted_indices=sorted_ids)
    yn = y.numpy()
    assert (_bits(yn[bad]) == 0).all(), "rows with an out-of-range id must be exactly +0"
    ref = reference.gather_qmm(np.nan_to_num(x), planes, ids, out_dtype=None)
    _close(y[torch.from_numpy(~bad)], ref[~bad], "gather_qmm", "float32")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gather_qmm_partitioned_experts(amd: ROCmBackend, dtype: str) -> None:
    """(E, P) globals: every expert's fused gate/up partitions keep their own global."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((2, 32, 48)).astype(np.float32)
    w[:, 16:] *= 40.0
    planes = reference.quantize(w, partitions=(0, 16, 32))
    assert planes.global_scale.shape == (2, 2)
    ids = np.array([1, 1, 0, 5])
    xt, x = torch_activations(rng, 4, 48, dtype)
    y = amd.gather_qmm(xt, amd.prepare(planes), ids)
    assert (y[3] == 0).all()
    _close(y[:3], reference.gather_qmm(x, planes, ids, out_dtype=None)[:3], "gather_qmm", dtype)


# ----------------------------------------------------------------------- dequantize
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_dequantize_is_exact(amd: ROCmBackend, dtype: str) -> None:
    rng = np.random.default_rng(9)
    w = rng.standard_normal((2, 19, 80)).astype(np.float32) * np.float32(1e3)
    planes = reference.quantize(w, partitions=(0, 7, 19))
    y = amd.to_numpy(amd.dequantize(amd.prepare(planes), dtype))
    ref = reference.dequantize(planes, NUMPY[dtype])
    assert y.dtype == ref.dtype
    assert y.shape == (2, 19, 80)
    assert (_bits(y) == _bits(ref)).all()


# -------------------------------------------------------------------- activations
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("static", [False, True])
def test_quantize_activations_is_bit_exact(amd: ROCmBackend, dtype: str, static: bool) -> None:
    """Linear scales; ties at every E2M1 boundary; zeros; a NaN block; a static global."""
    rng = np.random.default_rng(13)
    xt, x = torch_activations(rng, 5, 96, dtype)
    xt[0, :16] = 0.0
    xt[1, 16:32] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 2) * 448
    xt[2, 40] = float("nan")
    x = xt.float().numpy()
    scale = float(np.nanmax(np.abs(x)) / GLOBAL_AMAX_DIVISOR * 1.5) if static else None
    got = amd.quantize_activations(xt, scale)
    ref = reference.quantize_activations(x, scale)
    assert _bits(np.asarray(got.global_scale)) == _bits(np.asarray(ref.global_scale))
    assert got.scales.shape == (5, 6)  # linear, not swizzled
    assert (got.scales == ref.scales).all()
    assert (got.codes == ref.codes).all()
    assert got.scales[2, 2] == 0x7F  # the NaN block


# ---------------------------------------------------------------------- W4A4 emulated
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(("m", "static"), [(1, False), (33, False), (3, True)])
def test_w4a4_emulated(amd: ROCmBackend, dtype: str, m: int, static: bool) -> None:
    rng = np.random.default_rng(17 + m)
    planes = reference.quantize(
        rng.standard_normal((40, 64)).astype(np.float32), partitions=(0, 8, 40)
    )
    xt, x = torch_activations(rng, m, 64, dtype)
    scale = float(np.abs(x).max() / GLOBAL_AMAX_DIVISOR * 1.5) if static else None
    y = amd.qmm_w4a4(xt, amd.prepare(planes), input_scale=scale)
    ref = reference.qmm_w4a4(x, planes, input_scale=scale, out_dtype=None)
    _close(y, ref, "w4a4", dtype)
    # it is W4A4, not W4A16: y sits on the activation-rounded result, far from W4A16's
    w4a16 = reference.qmm(x, planes, out_dtype=None)
    scale = np.abs(ref).max()
    assert relative_error(w4a16, ref) > 3 * tolerance("w4a4", dtype)
    assert np.abs(y.float().numpy() - w4a16).max() / scale > 2 * tolerance("w4a4", dtype)


def test_w4a4_nonfinite_rows(amd: ROCmBackend) -> None:
    rng = np.random.default_rng(23)
    planes = reference.quantize(rng.standard_normal((16, 64)).astype(np.float32))
    xt, _ = torch_activations(rng, 4, 64, "float32")
    xt[1, 3] = float("nan")
    xt[3, 60] = float("inf")
    y = amd.qmm_w4a4(xt, amd.prepare(planes)).numpy()
    assert np.isnan(y[[1, 3]]).all()
    ref = reference.qmm_w4a4(xt.numpy(), planes, out_dtype=None)
    good = [0, 2]
    assert_within(y[good], ref[good], tolerance("w4a4", "float32"), "finite rows")


# ------------------------------------------------------------------------------ W4A8
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_w4a8(amd: ROCmBackend, dtype: str) -> None:
    """W4A8 int8 and FP8 with the real tiles of gfx942 (64 lanes) and gfx1201 (32 lanes),
    under the interpreter (which declares both whatever the architecture)."""
    rng = np.random.default_rng(31)
    planes = reference.quantize(rng.standard_normal((33, 64)).astype(np.float32))
    xt, x = torch_activations(rng, 17, 64, dtype)
    w = amd.prepare(planes)
    _close(amd.qmm_w4a8(xt, w), reference.qmm_w4a8(x, planes, out_dtype=None), "w4a8", dtype)
    y = amd.qmm_w4a8_fp8(xt, w, input_scale=None)
    _close(y, reference.qmm_w4a8_fp8(x, planes, out_dtype=None), "w4a8_fp8", dtype)
    q, ref = amd.quantize_activations_q8(xt), reference.quantize_activations_q8(x)
    assert q.codes.tobytes() == ref.codes.tobytes()
    assert q.d.tobytes() == ref.d.tobytes()


def test_gather_qmm_w4a8(amd: ROCmBackend) -> None:
    rng = np.random.default_rng(32)
    planes = reference.quantize(rng.standard_normal((3, 20, 96)).astype(np.float32))
    x = rng.standard_normal((7, 96)).astype(np.float32)
    ids = np.array([1, 5, 0, 2, 2, -3, 1])
    x[[1, 5]] = np.nan  # never read: their rows are exact zeros
    y = amd.to_numpy(amd.gather_qmm_w4a8(x, amd.prepare(planes), ids))
    assert (y[[1, 5]] == 0).all()
    ok = [0, 2, 3, 4, 6]
    ref = reference.gather_qmm_w4a8(np.nan_to_num(x), planes, ids, out_dtype=None)
    assert_within(y[ok], ref[ok], tolerance("w4a8", "float32"), "gather_qmm_w4a8")
