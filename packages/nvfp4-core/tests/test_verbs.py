"""Core's verbs over the narrow kernel contract: every argument is checked once, in core,
before a kernel sees it; kernels get 2-D, contiguous, validated operands; prepared handles
cannot be edited into a lie; the adapter in docs/architecture.md is complete in under 100
lines."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import re
import types
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import nvfp4
import pytest
from nvfp4 import reference
from nvfp4.contract import Availability, BackendInfo, Kernels
from nvfp4.dtypes import OUTPUT_DTYPES
from nvfp4.testing import assert_within
from nvfp4.tolerances import tolerance

BF16 = np.dtype(ml_dtypes.bfloat16)
ARCHITECTURE = Path(__file__).resolve().parents[3] / "docs" / "architecture.md"


class Recorder:
    """A complete kernels object on the reference arithmetic that records what each kernel
    receives and asserts the contract's promises about it."""

    def __init__(self, capabilities: frozenset[str] | None = None) -> None:
        self.info = BackendInfo(
            name="recorder",
            spec_versions=("1.0",),
            priority=0,
            capabilities=capabilities
            if capabilities is not None
            else frozenset({"qmm", "gather_qmm", "dequantize", "quantize_activations", "w4a4"}),
        )
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def availability(self) -> Availability:
        return Availability(True, device="numpy")

    def prepare(self, planes: nvfp4.NVFP4Planes) -> nvfp4.NVFP4Planes:
        nvfp4.validate(planes, content=True)  # it must already hold
        self.calls.append(("prepare", (planes.shape,)))
        return planes

    def _x(self, verb: str, x: Any) -> None:
        assert isinstance(x, np.ndarray)
        assert x.ndim == 2
        assert x.shape[0] >= 1
        assert x.flags.c_contiguous
        assert x.dtype.name in OUTPUT_DTYPES, x.dtype
        self.calls.append((verb, (x.shape, x.dtype.name)))

    def qmm(self, x: Any, w: Any, *, out_dtype: str) -> Any:
        self._x("qmm", x)
        assert w.num_experts is None
        assert out_dtype in OUTPUT_DTYPES
        return reference.output(reference.qmm_2d(x, reference.decoded_operand(w)), out_dtype)

    def gather_qmm(
        self, x: Any, w: Any, expert_ids: Any, *, sorted_indices: bool, out_dtype: str
    ) -> Any:
        self._x("gather_qmm", x)
        assert w.num_experts is not None
        assert expert_ids.dtype == np.int64
        assert expert_ids.shape == (x.shape[0],)
        return reference.output(reference.gather_qmm_2d(x, w, expert_ids), out_dtype)

    def dequantize(self, w: Any, *, dtype: str) -> Any:
        assert dtype in OUTPUT_DTYPES
        return reference.dequantize(w, dtype)

    def quantize_activations(self, x: Any, *, input_scale: float | None) -> Any:
        self._x("quantize_activations", x)
        assert input_scale is None or (isinstance(input_scale, float) and input_scale > 0)
        return reference.quantize_activations_2d(x, input_scale)

    def qmm_w4a4(self, x: Any, w: Any, *, input_scale: float | None, out_dtype: str) -> Any:
        self._x("qmm_w4a4", x)
        return reference.output(reference.qmm_w4a4_2d(x, w, input_scale), out_dtype)

    def to_planes(self, w: Any) -> Any:
        return w

    def from_numpy(self, a: Any) -> Any:
        return np.asarray(a)

    def to_numpy(self, a: Any) -> Any:
        return np.asarray(a)


def _planes(n: int = 6, k: int = 32, experts: int | None = None) -> nvfp4.NVFP4Planes:
    rng = np.random.default_rng(n * k)
    shape = (experts, n, k) if experts else (n, k)
    return nvfp4.quantize(rng.standard_normal(shape).astype(np.float32), name="w")


@pytest.fixture
def rec() -> Recorder:
    return Recorder()


@pytest.fixture
def b(rec: Recorder) -> nvfp4.Frontend:
    return nvfp4.Frontend(rec)


# ------------------------------------------------------------------ the contract
def test_recorder_satisfies_the_protocol(rec: Recorder) -> None:
    assert isinstance(rec, Kernels)


def test_not_a_kernels_object_is_refused() -> None:
    with pytest.raises(TypeError, match="lacks availability, prepare, from_numpy, to_numpy"):
        nvfp4.Frontend(types.SimpleNamespace(info=None))  # type: ignore[arg-type]


def test_leading_axes_are_reshaped_by_core(b: nvfp4.Frontend, rec: Recorder) -> None:
    p = _planes()
    w = b.prepare(p)
    x = np.random.default_rng(0).standard_normal((2, 3, 32)).astype(np.float16)
    y = b.qmm(x, w)
    assert y.shape == (2, 3, 6)
    assert y.dtype == np.float16
    assert ("qmm", ((6, 32), "float16")) in rec.calls
    np.testing.assert_array_equal(y, reference.qmm(x, p, out_dtype=np.float16))


def test_strided_x_arrives_contiguous(b: nvfp4.Frontend) -> None:
    w = b.prepare(_planes())
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)[:, ::2]
    assert not x.flags.c_contiguous
    y = b.qmm(x, w, out_dtype="float32")
    np.testing.assert_array_equal(
        y, reference.qmm(np.ascontiguousarray(x), _planes(), out_dtype=np.float32)
    )


def test_float64_is_rounded_once_and_widened_back(b: nvfp4.Frontend, rec: Recorder) -> None:
    w = b.prepare(_planes())
    x = np.random.default_rng(2).standard_normal((3, 32))
    y = b.qmm(x, w)
    assert y.dtype == np.float64
    assert ("qmm", ((3, 32), "float32")) in rec.calls
    np.testing.assert_array_equal(
        y, reference.qmm(x, _planes(), out_dtype=np.float32).astype(np.float64)
    )


def test_empty_m_never_reaches_a_kernel(b: nvfp4.Frontend, rec: Recorder) -> None:
    w = b.prepare(_planes())
    y = b.qmm(np.zeros((0, 32), BF16), w)
    assert y.shape == (0, 6)
    assert y.dtype == BF16
    g = b.gather_qmm(
        np.zeros((0, 32), np.float32), b.prepare(_planes(experts=2)), np.zeros(0, np.int64)
    )
    assert g.shape == (0, 6)
    assert [c for c, _ in rec.calls if c != "prepare"] == []


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda b, w, m: b.qmm(np.ones((2, 48), np.float32), w),
            r"qmm\('w'\): x must be \[\.\.\., K\] with K = 32, found shape \(2, 48\)",
        ),
        (
            lambda b, w, m: b.qmm(np.ones((2, 32), np.int32), w),
            "expected a float32, float16, bfloat16 or float64 array, found dtype int32",
        ),
        (
            lambda b, w, m: b.qmm(np.ones((2, 32), np.float32), w, out_dtype="int8"),
            "output dtype: expected one of",
        ),
        (
            lambda b, w, m: b.qmm(np.ones((2, 32), np.float32), m),
            r"qmm\('w'\): expert-stacked weights go through gather_qmm",
        ),
        (
            lambda b, w, m: b.gather_qmm(np.ones((2, 32), np.float32), w, [0, 1]),
            r"weights must be \[E, N, K\]",
        ),
        (
            lambda b, w, m: b.gather_qmm(np.ones((2, 2, 32), np.float32), m, [0, 1]),
            r"x must be \[M, K\], found shape \(2, 2, 32\)",
        ),
        (
            lambda b, w, m: b.gather_qmm(np.ones((2, 32), np.float32), m, [0.0, 1.0]),
            r"expert_ids must be integer \[M\] with M = 2, found float64 \(2,\)",
        ),
        (
            lambda b, w, m: b.gather_qmm(
                np.ones((2, 32), np.float32), m, [1, 0], sorted_indices=True
            ),
            "sorted_indices=True but expert_ids are not sorted",
        ),
        (
            lambda b, w, m: b.quantize_activations(np.ones((2, 24), np.float32)),
            "K must be a positive multiple of 16, found 24",
        ),
        (
            lambda b, w, m: b.quantize_activations(np.ones((3, 2, 32), np.float32)),
            r"x must be \[M, K\], found shape \(3, 2, 32\)",
        ),
        (
            lambda b, w, m: b.quantize_activations(np.ones((0, 32), np.float32)),
            "expected at least one row",
        ),
        (
            lambda b, w, m: b.quantize_activations(np.ones((2, 32), np.float32), np.nan),
            "input_scale must be finite and > 0",
        ),
        (
            lambda b, w, m: b.qmm_w4a4(np.ones((2, 32), np.float32), w, input_scale=-1.0),
            "input_scale must be finite and > 0",
        ),
        (
            lambda b, w, m: b.qmm_w4a4(np.ones((2, 32), np.float32), m),
            "expert-stacked weights are not supported here",
        ),
        (lambda b, w, m: b.dequantize(w, "int8"), "output dtype: expected one of"),
    ],
)
def test_every_refusal_happens_before_any_kernel(
    b: nvfp4.Frontend, rec: Recorder, call: Any, message: str
) -> None:
    w, m = b.prepare(_planes()), b.prepare(_planes(experts=2))
    rec.calls.clear()
    with pytest.raises(ValueError, match=message):
        call(b, w, m)
    assert rec.calls == []


def test_invalid_planes_never_reach_prepare(b: nvfp4.Frontend, rec: Recorder) -> None:
    p = _planes()
    bad = p.scales.copy()
    bad[0, 0] = 0x7F
    with pytest.raises(nvfp4.PlaneError, match="scale byte"):
        b.prepare(p.replace(scales=bad))
    with pytest.raises(nvfp4.PlaneError, match="global"):
        b.qmm(np.ones((1, 32), np.float32), p.replace(global_scale=np.float32(np.nan)))
    with pytest.raises(nvfp4.PlaneError, match="planes type"):
        b.prepare(np.zeros((2, 16), np.uint8))  # type: ignore[arg-type]
    assert rec.calls == []


def test_the_sorted_hint_is_checked_on_host_ids(b: nvfp4.Frontend) -> None:
    p = _planes(experts=3)
    w = b.prepare(p)
    x = np.random.default_rng(3).standard_normal((4, 32)).astype(np.float32)
    ids = np.array([0, 0, 2, 5], dtype=np.uint8)  # 5: out of range, a zero row
    y = b.gather_qmm(x, w, ids, sorted_indices=True)
    np.testing.assert_array_equal(y, reference.gather_qmm(x, p, ids, out_dtype=np.float32))
    assert not y[3].any()
    huge = np.array([0, 2**64 - 1, 1, 2**63], dtype=np.uint64)  # beyond int64: out of range
    y = b.gather_qmm(x, w, huge)
    assert not y[[1, 3]].any()


# -------------------------------------------------------------- optional kernels
def test_an_absent_kernel_is_named() -> None:
    class QmmOnly(Recorder):
        gather_qmm = None  # type: ignore[assignment]

    b = nvfp4.Frontend(QmmOnly(frozenset({"qmm"})))
    with pytest.raises(NotImplementedError, match=r"backend 'recorder' has no gather_qmm kernel"):
        b.gather_qmm(np.ones((1, 32), np.float32), _planes(experts=2), [0])
    assert not b.has("gather_qmm")
    assert b.has("qmm")


def test_w4a4_runs_only_where_declared() -> None:
    b = nvfp4.Frontend(Recorder(frozenset({"qmm"})))
    with pytest.raises(NotImplementedError, match="does not declare the 'w4a4' capability"):
        b.qmm_w4a4(np.ones((1, 32), np.float32), _planes())
    assert not b.has("qmm_w4a4")


def test_weights_of_another_backend_are_refused(b: nvfp4.Frontend) -> None:
    other = nvfp4.Frontend(Recorder())
    w = other.prepare(_planes())
    with pytest.raises(TypeError, match="prepared by backend 'recorder', not 'recorder'"):
        b.qmm(np.ones((1, 32), np.float32), w)
    with pytest.raises(TypeError, match=r"expected a weight from Frontend\.prepare\(\)"):
        b.qmm(np.ones((1, 32), np.float32), {"codes": 1})


# ------------------------------------------------------------- prepared handles
def test_prepared_handles_cannot_be_edited(b: nvfp4.Frontend) -> None:
    p = _planes(n=10, k=48)
    w = b.prepare(p)
    assert (w.name, w.shape, w.n, w.k, w.num_experts, w.partitions) == (
        "w",
        (10, 48),
        10,
        48,
        None,
        None,
    )
    with pytest.raises(AttributeError, match="immutable"):
        w.shape = (32, 48)  # type: ignore[misc]
    with pytest.raises(AttributeError, match="immutable"):
        del w.name
    with pytest.raises(TypeError):
        dataclasses.replace(w, shape=(32, 48))  # type: ignore[type-var]
    with pytest.raises(TypeError, match=r"made by Frontend\.prepare"):
        nvfp4.Prepared()
    assert copy.copy(w) is w
    assert copy.deepcopy(w) is w
    with pytest.raises(TypeError, match="pickle its planes"):
        pickle.dumps(w)
    assert b.to_planes(w) is p


def test_module_level_verbs(b: nvfp4.Frontend) -> None:
    p = _planes(experts=2)
    x = np.random.default_rng(4).standard_normal((3, 32)).astype(np.float32)
    ids = np.array([1, 0, 1])
    # raw planes: the reference
    np.testing.assert_array_equal(nvfp4.gather_qmm(x, p, ids), reference.gather_qmm(x, p, ids))
    np.testing.assert_array_equal(nvfp4.dequantize(p), reference.dequantize(p))
    # a prepared weight: its own backend
    w = nvfp4.prepare(p, backend=b)
    assert w.backend is b
    np.testing.assert_array_equal(nvfp4.gather_qmm(x, w, ids), reference.gather_qmm(x, p, ids))
    assert nvfp4.to_planes(w) is p
    q = nvfp4.quantize_activations(x, backend=b)
    assert q.codes.tobytes() == reference.quantize_activations(x).codes.tobytes()


def test_backend_facts_read_through(b: nvfp4.Frontend, rec: Recorder) -> None:
    assert b.calls is rec.calls
    assert b.name == "recorder"
    with pytest.raises(AttributeError):
        b.no_such_fact


# -------------------------------------------------- the adapter in the documentation
def _doc_adapter() -> tuple[str, types.ModuleType]:
    text = ARCHITECTURE.read_text()
    blocks = re.findall(r"```python\n(# adapter: toy\n.*?)```", text, flags=re.S)
    assert len(blocks) == 1, "docs/architecture.md must hold exactly one '# adapter: toy' block"
    module = types.ModuleType("toy_adapter")
    exec(compile(blocks[0], str(ARCHITECTURE), "exec"), module.__dict__)
    return blocks[0], module


def test_the_documented_adapter_is_small_and_correct() -> None:
    source, module = _doc_adapter()
    assert len(source.splitlines()) < 100
    b = nvfp4.Frontend(module.backend())
    assert isinstance(b.kernels, Kernels)
    rng = np.random.default_rng(5)
    p = nvfp4.quantize(
        rng.standard_normal((3, 40, 64)).astype(np.float32)[0], partitions=(0, 16, 40)
    )
    w = b.prepare(p)
    for dtype in ("float32", "float16", "bfloat16"):
        x = rng.standard_normal((2, 5, 64)).astype(OUTPUT_DTYPES[dtype])
        y = b.qmm(x, w)
        ref = reference.qmm(x, p, out_dtype=None)
        assert_within(y, ref, tolerance("qmm", dtype), f"qmm {dtype}")
        d = b.dequantize(w, dtype)
        np.testing.assert_array_equal(
            d.view(np.uint8), reference.dequantize(p, dtype).view(np.uint8)
        )
    with pytest.raises(NotImplementedError, match="has no gather_qmm kernel"):
        b.gather_qmm(np.ones((1, 64), np.float32), p, [0])
