"""TritonKernels: the kernel contract over the shared ops, with a minimal platform (the
interpreter), behind core's verbs - what nvfp4-cuda and nvfp4-rocm build on."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
from nvfp4 import reference
from nvfp4.backend import Frontend
from nvfp4.planes import NVFP4Planes, PlaneError
from nvfp4_triton.backend import Platform, TritonKernels, torch_dtype
from nvfp4_triton.testing import check_close
from nvfp4_triton.weights import DeviceWeight, upload
from triton_helpers import AMD_LIKE


class InterpreterKernels(TritonKernels):
    NAME = "test-triton"
    PRIORITY = 1

    def detect(self) -> Platform:
        return Platform(
            True,
            device="Triton interpreter on CPU",
            interpreter=True,
            arch="interpreter",
            config=AMD_LIKE,
        )


class BrokenKernels(TritonKernels):
    NAME = "broken"

    def detect(self) -> Platform:
        raise RuntimeError("driver exploded")


@pytest.fixture
def b() -> Frontend:
    return Frontend(InterpreterKernels())


def _planes(n: int = 12, k: int = 64, experts: int | None = None) -> NVFP4Planes:
    rng = np.random.default_rng(n + k)
    shape = (experts, n, k) if experts else (n, k)
    return reference.quantize(rng.standard_normal(shape).astype(np.float32), name="bw")


def test_protocol_and_info(b: Frontend) -> None:
    assert isinstance(b, Frontend)
    assert b.availability().ok
    assert b.availability().device == "Triton interpreter on CPU"
    assert "w4a4" not in b.info.capabilities
    assert "qmm" in b.info.capabilities


def test_detection_failure_is_reported_not_raised() -> None:
    a = BrokenKernels().availability()
    assert not a.ok
    assert "driver exploded" in a.reason
    with pytest.raises(RuntimeError, match="driver exploded"):
        Frontend(BrokenKernels()).prepare(_planes())


def test_qmm_default_dtype_leading_axes_and_numpy_input(b: Frontend) -> None:
    planes = _planes()
    w = b.prepare(planes)
    assert isinstance(w.payload, DeviceWeight)
    x = np.random.default_rng(0).standard_normal((2, 3, 64)).astype(ml_dtypes.bfloat16)
    y = b.qmm(b.from_numpy(x), w)
    assert y.dtype == torch.bfloat16
    assert tuple(y.shape) == (2, 3, 12)
    yn = b.to_numpy(y)
    assert yn.dtype == np.dtype(ml_dtypes.bfloat16)
    ref = reference.qmm(x.astype(np.float32).reshape(6, 64), planes, out_dtype=None)
    check_close(y.reshape(6, 12), ref, "qmm", "bfloat16", "backend qmm")
    y32 = b.qmm(x.astype(np.float32), planes, out_dtype="float32")  # numpy x, raw planes
    assert y32.dtype == torch.float32


def test_verbs_refuse_malformed_planes(b: Frontend) -> None:
    p = _planes()
    bad = object.__new__(NVFP4Planes)
    for f, v in (
        ("codes", p.codes),
        ("scales", p.scales[:, :3]),
        ("global_scale", p.global_scale),
        ("partitions", None),
        ("name", "bad_scales"),
    ):
        object.__setattr__(bad, f, v)
    for call in (
        lambda: b.prepare(bad),
        lambda: b.qmm(torch.ones(2, 64), bad),
        lambda: b.dequantize(bad),
        lambda: b.gather_qmm(torch.ones(2, 64), bad, torch.zeros(2, dtype=torch.int64)),
    ):
        with pytest.raises(PlaneError, match="bad_scales"):
            call()
    content = p.replace(
        scales=np.where(p.scales == p.scales[0, 0], 0x80, p.scales).astype(np.uint8),
        name="bad_byte",
    )
    with pytest.raises(PlaneError, match="bad_byte"):
        b.prepare(content)


def test_x_checks(b: Frontend) -> None:
    w = b.prepare(_planes())
    with pytest.raises(ValueError, match="K = 64"):
        b.qmm(torch.ones(2, 48), w)
    with pytest.raises(ValueError, match="float64 is accepted as a numpy array only"):
        b.qmm(torch.ones(2, 64, dtype=torch.float64), w)
    with pytest.raises(ValueError, match="gather_qmm"):
        b.qmm(torch.ones(2, 64), b.prepare(_planes(experts=2)))
    with pytest.raises(ValueError, match="output dtype"):
        b.qmm(torch.ones(2, 64), w, out_dtype="int8")
    with pytest.raises(NotImplementedError, match="w4a4"):
        b.qmm_w4a4(torch.ones(2, 64), w)


def test_gather_and_dequantize_and_quantize(b: Frontend) -> None:
    planes = _planes(experts=3)
    w = b.prepare(planes)
    x = np.random.default_rng(1).standard_normal((5, 64)).astype(np.float16)
    ids = np.array([2, -1, 0, 7, 2])
    y = b.gather_qmm(b.from_numpy(x), w, b.from_numpy(ids))
    assert y.dtype == torch.float16
    assert (b.to_numpy(y)[[1, 3]] == 0).all()
    ref = reference.gather_qmm(x, planes, ids, out_dtype=None)
    check_close(y[[0, 2, 4]], ref[[0, 2, 4]], "gather_qmm", "float16", "backend gather")
    with pytest.raises(ValueError, match="integer"):
        b.gather_qmm(b.from_numpy(x), w, torch.zeros(5))
    d = b.dequantize(w, "bfloat16")
    np.testing.assert_array_equal(
        b.to_numpy(d).view(np.uint16), reference.dequantize(planes, "bfloat16").view(np.uint16)
    )
    assert b.to_planes(w).codes.tobytes() == planes.codes.tobytes()
    xa = np.random.default_rng(2).standard_normal((3, 32)).astype(np.float32)
    qa, ra = b.quantize_activations(b.from_numpy(xa)), reference.quantize_activations(xa)
    assert qa.codes.tobytes() == ra.codes.tobytes()
    assert qa.scales.tobytes() == ra.scales.tobytes()
    assert qa.global_scale.tobytes() == ra.global_scale.tobytes()
    with pytest.raises(ValueError, match="multiple of 16"):
        b.quantize_activations(torch.ones(2, 24))


def test_torch_dtype_names() -> None:
    assert torch_dtype("bfloat16") is torch.bfloat16
    assert torch_dtype(np.float16) is torch.float16
    assert torch_dtype(ml_dtypes.bfloat16) is torch.bfloat16
    with pytest.raises(ValueError):
        torch_dtype(torch.int8)


def test_device_weight_refuses_inconsistent_tensors() -> None:
    w = upload(_planes(), "cpu")
    with pytest.raises(PlaneError, match="device scales"):
        DeviceWeight(
            w.name,
            w.n,
            w.k,
            None,
            None,
            w.global_scale,
            w.codes,
            w.scales[:, :2].contiguous(),
            w.row_g,
        )
    with pytest.raises(PlaneError, match="k"):
        DeviceWeight(w.name, w.n, 40, None, None, w.global_scale, w.codes, w.scales, w.row_g)


class NoFP8Kernels(InterpreterKernels):
    """The interpreter platform, but without FP8 tensor cores (a GPU of compute capability
    8.0, say): ``w4a8_fp8`` must be absent and never emulated."""

    NAME = "test-no-fp8"

    def w4a8_fp8_supported(self, platform: Platform) -> bool:
        return False


def test_w4a8_verbs(b: Frontend) -> None:
    """The W4A8 verbs through core: capabilities declared under the interpreter, leading
    axes, numpy input, the default output dtype, the encoders' planes bit-exact."""
    assert {"w4a8", "w4a8_fp8"} <= b.info.capabilities
    planes = _planes(n=9, k=64)
    w = b.prepare(planes)
    x = np.random.default_rng(5).standard_normal((2, 3, 64)).astype(np.float16)
    y = b.qmm_w4a8(b.from_numpy(x), w)
    assert y.dtype == torch.float16
    assert tuple(y.shape) == (2, 3, 9)
    ref = reference.qmm_w4a8(x.reshape(6, 64), planes, out_dtype=None)
    check_close(y.reshape(6, 9), ref, "w4a8", "float16", "backend qmm_w4a8")
    yf = b.qmm_w4a8_fp8(x.astype(np.float32), w, input_scale=0.01, out_dtype="float32")
    ref = reference.qmm_w4a8_fp8(x.reshape(6, 64), planes, input_scale=0.01, out_dtype=None)
    check_close(yf.reshape(6, 9), ref, "w4a8_fp8", "float32", "backend qmm_w4a8_fp8")
    q, rq = (
        b.quantize_activations_q8(x.reshape(6, 64)),
        reference.quantize_activations_q8(x.reshape(6, 64)),
    )
    assert q.codes.tobytes() == rq.codes.tobytes()
    assert q.d.tobytes() == rq.d.tobytes()
    f, rf = (
        b.quantize_activations_fp8(x.reshape(6, 64)),
        reference.quantize_activations_fp8(x.reshape(6, 64)),
    )
    assert f.codes.tobytes() == rf.codes.tobytes()
    assert f.input_scale.tobytes() == rf.input_scale.tobytes()
    experts = _planes(n=7, k=32, experts=3)
    ids = np.array([2, -1, 0, 3, 1])
    xe = np.random.default_rng(6).standard_normal((5, 32)).astype(np.float32)
    ye = b.to_numpy(b.gather_qmm_w4a8(xe, b.prepare(experts), ids))
    assert (ye[[1, 3]] == 0).all()
    check_close(
        torch.from_numpy(ye),
        reference.gather_qmm_w4a8(xe, experts, ids, out_dtype=None),
        "w4a8",
        "float32",
        "backend gather_qmm_w4a8",
    )
    with pytest.raises(ValueError, match="multiple of 32"):
        b.qmm_w4a8(torch.ones(2, 48), b.prepare(_planes(n=4, k=48)))


def test_w4a8_fp8_absent_without_fp8_tensor_cores() -> None:
    """Not declared, refused by core's verb and by the kernel itself: never emulated."""
    kernels = NoFP8Kernels()
    b = Frontend(kernels)
    assert "w4a8" in b.info.capabilities
    assert "w4a8_fp8" not in b.info.capabilities
    w = b.prepare(_planes())
    with pytest.raises(NotImplementedError, match="w4a8_fp8"):
        b.qmm_w4a8_fp8(torch.ones(2, 64), w)
    with pytest.raises(NotImplementedError, match="FP8 tensor cores"):
        kernels.qmm_w4a8_fp8(torch.ones(2, 64), w.payload, input_scale=None, out_dtype="float32")
    with pytest.raises(NotImplementedError, match="FP8 tensor cores"):
        kernels.quantize_activations_fp8(torch.ones(2, 64), input_scale=None)


def test_views_with_negative_strides_agree_with_the_reference(b: Frontend) -> None:
    """A one-row plane with its rows reversed (numpy calls it contiguous: the stride of a
    length-1 axis does not count, but torch refuses the negative stride) and activations
    likewise: the reference accepts both, so must the backend (the plane fuzz's seed 1
    found ValueError from torch in prepare, dequantize and qmm)."""
    flat = _planes(n=1, k=64)
    planes = NVFP4Planes(flat.codes[::-1], flat.scales[::-1], flat.global_scale, name="reversed")
    assert planes.codes.strides[0] < 0
    assert planes.codes.flags.c_contiguous
    np.testing.assert_array_equal(
        b.to_numpy(b.dequantize(planes, "float32")), reference.dequantize(planes, "float32")
    )
    x = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)[::-1]
    assert x.strides[0] < 0
    y = b.qmm(x, b.prepare(planes), out_dtype="float32")
    check_close(y, reference.qmm(x, planes), "qmm", "float32", "reversed views")
