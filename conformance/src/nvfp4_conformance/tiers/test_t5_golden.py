"""T5 golden fixtures: the committed cases of :mod:`nvfp4.fixtures`, run as their manifest
says.

Each manifest entry lists its arrays; every ``expected`` array names the ``op`` that
produces it, the arguments (array keys; ``"."`` is the case's own planes) and the rule:
``exact`` (byte for byte; for a non-reference activation encoder, the boundary rule of
"Conformance of other encoders" applies to the codes, as in T2: spec 1.0's for NVFP4
activations, ``[quantize_q8]``'s for W4A8 int8 ones, whose ``d`` stays bit-identical; FP8
codes are exact for every backend) or ``tolerance`` (``max|y - ref| / max|ref|`` against
``nvfp4.tolerances.tolerance(path, dtype, spec=...)`` of the certified spec version, with
``zero_rows`` exactly zero and ``nan_rows`` non-finite, all NaN for W4A8). Backend verbs
run on the backend under test; the encoder and the layout transcoders run on the installed
nvfp4-core. An op this suite does not know fails: a newer manifest needs a newer suite.

A case applies from its manifest's ``min_spec`` on (spec 1.1's W4A8 cases are skipped, as
"applies from a later spec", when certifying 1.0), and each backend op only where the
backend declares the capability it needs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt
import pytest
from nvfp4 import layouts, reference
from nvfp4.activations import Q8Activations
from nvfp4.contract import KERNELS
from nvfp4.planes import NVFP4Planes, PlaneError

from nvfp4_conformance.attribution import decode_or_explain, exact_or_explain
from nvfp4_conformance.calls import floor_of
from nvfp4_conformance.checks import (
    as_float64,
    assert_exact,
    assert_within,
    error_figures,
    is_reference,
)
from nvfp4_conformance.encoders import compare_encoding
from nvfp4_conformance.w4a8_encoders import compare_fp8, compare_q8

try:
    from nvfp4 import fixtures as _fixtures

    CASES: list[dict[str, Any]] = _fixtures.list_cases()
    _LOAD_ERROR = ""
except Exception as exc:  # reported by test_fixtures_present, not hidden
    CASES = []
    _LOAD_ERROR = f"{type(exc).__name__}: {exc}"

CORE_OPS = {
    "quantize",
    "to_gguf",
    "to_mlx",
    "mlx_global_scale_arg",
    "swizzle_scales",
    "to_compressed_tensors",
}
#: backend op -> the capability it needs: the kernels of the contract (a golden case's backend
#: op is the kernel of that name).
BACKEND_OPS: dict[str, str] = dict(KERNELS)
#: Backend ops that encode activations (no weight to prepare).
ENCODER_OPS = {"quantize_activations", "quantize_activations_q8", "quantize_activations_fp8"}
#: Matmuls whose non-finite activation rows give all-NaN output rows (spec 1.1, "W4A8").
ALL_NAN_OPS = {"qmm_w4a8", "gather_qmm_w4a8", "qmm_w4a8_fp8"}
VIEWS = {"float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16)}


def _ops(case: dict[str, Any]) -> set[str]:
    return {a["op"] for a in case["arrays"].values() if a["role"] == "expected"}


def _params() -> list[Any]:
    out = []
    for case in CASES:
        ops = _ops(case)
        since = [pytest.mark.min_spec(case.get("min_spec", "1.0"))]
        if ops & CORE_OPS or case.get("refusals"):
            out.append(pytest.param(case["name"], "core", id=f"{case['name']}-core", marks=since))
        for op in sorted(ops - CORE_OPS):
            marks = list(since)
            if op in BACKEND_OPS:
                marks.append(pytest.mark.requires_capability(BACKEND_OPS[op]))
                if "partitions" in case["arrays"] and op in ("qmm", "gather_qmm"):
                    marks.append(pytest.mark.requires_capability("fused_partitions"))
            out.append(pytest.param(case["name"], op, id=f"{case['name']}-{op}", marks=marks))
    return out


def _stored(
    arrays: dict[str, npt.NDArray[Any]], key: str, meta: dict[str, Any]
) -> npt.NDArray[Any]:
    a = arrays[key]
    view = meta.get("view")
    return a.view(VIEWS[view]) if view else a


def _decoded(backend: Any, handle: Any, dtype: str) -> Any:
    return backend.to_numpy(backend.dequantize(handle, dtype))


def planes_of(arrays: dict[str, npt.NDArray[Any]], name: str) -> NVFP4Planes:
    parts = tuple(int(b) for b in arrays["partitions"]) if "partitions" in arrays else None
    return NVFP4Planes(
        arrays["codes"], arrays["scales"], arrays["global_scale"].astype(np.float32), parts, name
    )


def _arg(arrays: dict[str, npt.NDArray[Any]], planes: NVFP4Planes | None, ref: Any) -> Any:
    if ref is None:
        return None
    if ref == ".":
        return planes
    return arrays[ref]


def _bytes_equal(found: Any, expected: npt.NDArray[Any], what: str) -> None:
    f = np.ascontiguousarray(np.asarray(found))
    e = np.ascontiguousarray(expected)
    assert f.shape == e.shape, f"{what}: shape {f.shape}, expected {e.shape}"
    assert f.dtype.itemsize == e.dtype.itemsize, f"{what}: dtype {f.dtype}, expected {e.dtype}"
    diff = np.flatnonzero(f.reshape(-1).view(np.uint8) != e.reshape(-1).view(np.uint8))
    assert diff.size == 0, f"{what}: {diff.size} bytes differ, first at byte {int(diff[0])}"


def _core_output(
    op: str, key: str, args: dict[str, Any], arrays: dict[str, Any], planes: NVFP4Planes | None
) -> Any:
    a = {k: _arg(arrays, planes, v) for k, v in args.items()}
    if op == "quantize":
        parts = tuple(int(b) for b in a["partitions"]) if a.get("partitions") is not None else None
        p = reference.quantize(a["w"], a.get("global_scale"), partitions=parts)
        return {"codes": p.codes, "scales": p.scales, "global_scale": p.global_scale}[key]
    if op == "to_gguf":
        data, scale = layouts.to_gguf(a["planes"])
        return {"gguf_data": data, "gguf_scale": scale}[key]
    if op == "to_mlx":
        return layouts.to_mlx(a["planes"]).weight
    if op == "mlx_global_scale_arg":
        return layouts.mlx_global_scale_arg(a["planes"].global_scale)
    if op == "swizzle_scales":
        return layouts.swizzle_scales(a["planes"].scales, a["planes"].name)
    if op == "to_compressed_tensors":
        ct = layouts.to_compressed_tensors(a["planes"])
        out = {
            "ct_weight_packed": ct["weight_packed"],
            "ct_weight_global_scale": ct["weight_global_scale"],
            "ct_weight_scale": np.asarray(ct["weight_scale"]).view(np.uint8),
        }
        return out[key]
    raise AssertionError(f"unknown core op {op!r}")


REFUSERS: dict[str, Callable[[NVFP4Planes], Any]] = {
    "to_gguf": layouts.to_gguf,
    "to_compressed_tensors": layouts.to_compressed_tensors,
    "to_modelopt": layouts.to_modelopt,
}


def test_fixtures_present(nvfp4_record: Any) -> None:
    """The installed nvfp4-core ships its golden fixtures and they load (sha256-checked)."""
    assert not _LOAD_ERROR, f"nvfp4.fixtures could not be read: {_LOAD_ERROR}"
    assert CASES, "nvfp4.fixtures lists no cases"
    nvfp4_record("manifest", cases=len(CASES))


@pytest.mark.parametrize(("name", "op"), _params())
def test_golden(
    nvfp4_backend: Any, nvfp4_record: Any, nvfp4_tolerance: Any, name: str, op: str
) -> None:
    case = next(c for c in CASES if c["name"] == name)
    arrays = _fixtures.load_case(name)
    planes = planes_of(arrays, name) if "codes" in arrays else None
    expected = {k: m for k, m in case["arrays"].items() if m["role"] == "expected"}

    if op == "core":
        checked = 0
        for key, meta in expected.items():
            if meta["op"] not in CORE_OPS:
                continue
            found = _core_output(meta["op"], key, meta.get("args", {}), arrays, planes)
            _bytes_equal(found, arrays[key], f"{name}: {meta['op']} -> {key}")
            checked += 1
        refused = []
        for fn in case.get("refusals", []):
            assert fn in REFUSERS, f"{name}: unknown refusal {fn!r} in the manifest"
            assert planes is not None
            with pytest.raises(PlaneError):
                REFUSERS[fn](planes)
            refused.append(fn)
        nvfp4_record(f"{name}-core", arrays_checked=checked, refusals=refused)
        return

    if op not in BACKEND_OPS:
        raise AssertionError(f"{name}: the manifest uses op {op!r}, which this suite does not know")
    b = nvfp4_backend
    if op == "dequantize" and planes is not None:
        # a refusal in prepare a declared deviation also makes is recorded as explained by it
        handle = decode_or_explain(
            nvfp4_record, name, planes, "float32", functools.partial(b.prepare, planes)
        )
    else:
        handle = b.prepare(planes) if planes is not None and op not in ENCODER_OPS else None
    act_cache: dict[Any, Any] = {}
    for key, meta in sorted((k, m) for k, m in expected.items() if m["op"] == op):
        args = {k: _arg(arrays, planes, v) for k, v in meta.get("args", {}).items()}
        what = f"{name}: {op} -> {key}"
        if op == "dequantize":
            assert planes is not None
            found = np.asarray(
                decode_or_explain(
                    nvfp4_record,
                    key,
                    planes,
                    meta["dtype"],
                    functools.partial(_decoded, b, handle, meta["dtype"]),
                )
            )
            want = _stored(arrays, key, meta)
            exact_or_explain(
                nvfp4_record,
                key,
                planes,
                meta["dtype"],
                functools.partial(assert_exact, found, want, what, dtype=want.dtype),
                found,
            )
            nvfp4_record(key, dtype=meta["dtype"], mismatches=0, elements=int(want.size))
            continue
        if op == "quantize_activations":
            ref = _act_planes(arrays, key, name)
            if ref.name in act_cache:
                continue  # the codes, scales and global of one encoding are checked together
            scale = _scale(args.get("input_scale"))
            x = args["x"]
            got = b.quantize_activations(b.from_numpy(x), scale)
            act_cache[ref.name] = got
            window = float(nvfp4_tolerance("quantize", "boundary_window"))
            figs = compare_encoding(
                x,
                got,
                ref,
                window=window,
                exact=is_reference(b),
                what=f"{name}: quantize_activations",
            ).figures()
            nvfp4_record(ref.name, **figs)
            continue
        if op == "quantize_activations_q8":
            stem = key.rsplit("_", 1)[0]  # <stem>_codes and <stem>_d: one encoding
            if stem in act_cache:
                continue
            x = args["x"]
            got = b.quantize_activations_q8(b.from_numpy(x))
            act_cache[stem] = got
            ref_q8 = Q8Activations(
                arrays[f"{stem}_codes"], arrays[f"{stem}_d"].view(np.float16), f"{name}.{stem}"
            )
            window = float(nvfp4_tolerance("quantize_q8", "boundary_window"))
            try:
                figs = compare_q8(x, got, ref_q8, window=window)
            except AssertionError as exc:
                raise AssertionError(f"{name}: quantize_activations_q8 -> {stem}: {exc}") from None
            nvfp4_record(stem, encoder="int8", **figs)
            if is_reference(b):
                assert figs["disagreements"] == 0, (
                    f"{name}: the reference backend's int8 codes differ from the golden ones "
                    f"in {figs['disagreements']} places"
                )
            continue
        if op == "quantize_activations_fp8":
            stem = key.removesuffix("_input_scale").removesuffix("_codes")
            if stem in act_cache:
                continue
            scale = _scale(args.get("input_scale"))
            x = args["x"]
            got_fp8 = b.quantize_activations_fp8(b.from_numpy(x), scale)
            act_cache[stem] = got_fp8
            ref_fp8 = reference.quantize_activations_fp8(x, scale)
            _bytes_equal(ref_fp8.codes, arrays[f"{stem}_codes"], f"{what} (reference)")
            figs, problem = compare_fp8(x, got_fp8, ref_fp8)
            nvfp4_record(stem, encoder="fp8", dynamic=scale is None, **figs)
            assert not problem, f"{name}: quantize_activations_fp8 -> {stem}: {problem}"
            continue
        # matmuls: rule "tolerance"
        x = args["x"]
        xb = b.from_numpy(x)
        if op == "qmm":
            y = b.qmm(xb, handle)
        elif op == "gather_qmm":
            y = b.gather_qmm(xb, handle, b.from_numpy(args["expert_ids"]))
        elif op == "qmm_w4a4":
            y = b.qmm_w4a4(xb, handle, input_scale=_scale(args.get("input_scale")))
        elif op == "qmm_w4a8":
            y = b.qmm_w4a8(xb, handle)
        elif op == "gather_qmm_w4a8":
            y = b.gather_qmm_w4a8(xb, handle, b.from_numpy(args["expert_ids"]))
        else:
            y = b.qmm_w4a8_fp8(xb, handle, input_scale=_scale(args.get("input_scale")))
        y = np.asarray(b.to_numpy(y))
        want = arrays[key]
        assert y.shape == want.shape, f"{what}: shape {y.shape}, expected {want.shape}"
        tol = float(nvfp4_tolerance(meta["path"], meta["dtype"]))
        zero_rows = list(meta.get("zero_rows", []))
        nan_rows = list(meta.get("nan_rows", []))
        keep = np.ones(y.shape[0], dtype=bool)
        keep[zero_rows + nan_rows] = False
        assert planes is not None
        floor = _floor(nvfp4_tolerance, op, meta, args, planes, want)
        floor_kept = None if floor is None else floor[keep]
        figs = error_figures(y[keep], want[keep], floor_kept, tol)
        nvfp4_record(
            key, dtype=meta["dtype"], tolerance=tol, zero_rows=zero_rows, nan_rows=nan_rows, **figs
        )
        ids = args.get("expert_ids")
        for r in zero_rows:
            why = (
                "out-of-range expert"
                if ids is not None
                and planes is not None
                and not 0 <= int(ids[r]) < (planes.num_experts or 0)
                else "all-zero activations"
            )
            assert np.all(as_float64(y[r]) == 0), (
                f"{what}: row {r} ({why}) must be exactly zero, found {y[r]}"
            )
        for r in nan_rows:
            if op in ALL_NAN_OPS:
                assert np.isnan(as_float64(y[r])).all(), (
                    f"{what}: row {r} (NaN/Inf activation) must be NaN everywhere, found {y[r]}"
                )
            assert not np.isfinite(as_float64(y[r])).all(), (
                f"{what}: row {r} (NaN activation) must be non-finite"
            )
        assert_within(y[keep], want[keep], tol, what, allowance=floor_kept)


def _floor(
    bounds: Any,
    op: str,
    meta: dict[str, Any],
    args: dict[str, npt.NDArray[Any]],
    planes: NVFP4Planes,
    want: npt.NDArray[Any],
) -> npt.NDArray[np.float64] | None:
    """The accumulation floor of a golden matmul's outputs (spec 1.3 on), over what the
    path multiplies: x, or the reference's encoding of it (the golden outputs are the
    reference's)."""
    x = args["x"]
    with np.errstate(invalid="ignore"):
        if op == "qmm_w4a4":
            a: Any = reference.quantize_activations(x, _scale(args.get("input_scale")))
        elif op in ("qmm_w4a8", "gather_qmm_w4a8"):
            a = reference.quantize_activations_q8(x)
        elif op == "qmm_w4a8_fp8":
            a = reference.quantize_activations_fp8(x, _scale(args.get("input_scale")))
        else:
            a = x
        ids = args.get("expert_ids") if op.startswith("gather") else None
        return floor_of(bounds, meta["path"], a, planes, want, meta["dtype"], ids)


def _scale(a: Any) -> float | None:
    """A stored static input scale as the float a verb takes (``None``: dynamic)."""
    return None if a is None else float(np.asarray(a).reshape(()))


def _act_planes(arrays: dict[str, npt.NDArray[Any]], key: str, name: str) -> NVFP4Planes:
    """The expected activation planes a ``act_<variant>_{codes,scales,global_scale}`` key
    belongs to."""
    for suffix in ("_codes", "_scales", "_global_scale"):
        if key.endswith(suffix):
            stem = key[: -len(suffix)]
            return NVFP4Planes(
                arrays[stem + "_codes"],
                arrays[stem + "_scales"],
                arrays[stem + "_global_scale"].astype(np.float32),
                name=f"{name}.{stem}",
            )
    raise AssertionError(f"{name}: unexpected quantize_activations key {key!r}")
