"""T2 quantize: the backend's activation encoder (``quantize_activations``, the W4A4 input
side) against :func:`nvfp4.reference.quantize_activations`, by spec 1.0's rule
("Conformance of other encoders", ``[quantize]`` in ``tolerances.toml``).

The global must be bit-identical. The reference backend must agree everywhere (``reference``
= 0 disagreements). Another backend may differ only by boundary disagreements (a scale byte
or a code one step away where the reference's unrounded value lies within
``boundary_window`` of the midpoint; codes 0 and 8 exchanged), each case reporting its count;
over the random cases (at least 2^20 elements together) their fraction must not exceed
``others``. Cases built from exact midpoints count their disagreements but do not enter the
fraction.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

import hypothesis.extra.numpy as hnp
import ml_dtypes
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nvfp4 import deviation_emulators as emu
from nvfp4 import reference
from nvfp4.planes import NVFP4Planes
from nvfp4.spec import BLOCK_SIZE, E2M1_BOUNDS
from nvfp4.testing import nonfinite_blocks, rows_across_magnitudes, zero_blocks

from nvfp4_conformance.attribution import explain_encoding, explain_refusal
from nvfp4_conformance.checks import is_reference
from nvfp4_conformance.corpus import CorpusTally
from nvfp4_conformance.encoders import compare_encoding

pytestmark = pytest.mark.requires_capability("quantize_activations")

TIES = np.asarray(E2M1_BOUNDS, dtype=np.float32)


def compare_encodings(
    x: npt.NDArray[Any],
    got: Any,
    ref: NVFP4Planes,
    *,
    exact: bool,
    tolerance: Callable[[str, Any], float],
) -> dict[str, Any]:
    """:func:`nvfp4_conformance.encoders.compare_encoding` with the window of the certified
    spec version (``tolerance`` is the ``nvfp4_tolerance`` fixture)."""
    window = tolerance("quantize", "boundary_window")
    return compare_encoding(
        x, got, ref, window=window, exact=exact, what="quantize_activations"
    ).figures()


def _run(backend: Any, x: npt.NDArray[Any], input_scale: float | None) -> tuple[Any, NVFP4Planes]:
    try:
        got = backend.quantize_activations(backend.from_numpy(x), input_scale)
    except Exception as exc:
        # a refusal a declared deviation also makes (spec 1.2) is named in the failure
        ids = explain_refusal(lambda d: emu.quantize_activations(x, input_scale, deviations=d))
        if ids:
            raise AssertionError(f"quantize_activations raised {exc!r}{_EXPLAINED}{ids}") from exc
        raise
    ref = reference.quantize_activations(x, input_scale)
    return got, ref


#: How a failure message names the declared deviations that explain it.
_EXPLAINED = "; explained by declared deviation(s) "


def _encode_and_judge(
    backend: Any,
    record: Any,
    tolerance: Callable[[str, Any], float],
    case: str,
    x: npt.NDArray[Any],
    input_scale: float | None,
    **fields: Any,
) -> tuple[Any, dict[str, Any]]:
    """``backend``'s encoding ``got`` of ``x`` (:func:`_run`) and the figures of
    :func:`compare_encodings` with the reference's (exactly for the reference backend); the
    case is recorded with ``input_scale``, ``fields`` and the figures. Where the backend
    refuses or the comparison fails, the case is recorded with the declared deviations that
    explain it (``explained_by``, spec 1.2) and the test fails as before."""
    try:
        got, ref = _run(backend, x, input_scale)
    except AssertionError as exc:
        _record_refusal(record, case, input_scale, exc)
        raise
    try:
        figures = compare_encodings(x, got, ref, exact=is_reference(backend), tolerance=tolerance)
    except AssertionError:
        ids = explain_encoding(x, input_scale, got) if isinstance(got, NVFP4Planes) else None
        record(case, input_scale=input_scale, explained_by=ids, **fields)
        raise
    record(case, input_scale=input_scale, **fields, **figures)
    return got, figures


def _tie_blocks(rng: np.random.Generator, m: int, k: int, amax: float) -> npt.NDArray[np.float32]:
    """Blocks whose amax is 6 (scale byte 1.0 at global 1.0) and whose other elements are
    mostly exact E2M1 ties, signed, with a few zeros, -0.0 and tiny negatives."""
    pool = np.concatenate([TIES, [0.0, -0.0, 0.1, 0.3, 2.9, 4.5], TIES]).astype(np.float32)
    x = rng.choice(pool, size=(m, k)).astype(np.float32)
    x *= np.where(rng.random((m, k)) < 0.5, -1, 1).astype(np.float32)
    x[:, ::BLOCK_SIZE] = np.float32(6.0)
    x[0, 0] = np.float32(amax)
    return x


def _subnormal(rng: np.random.Generator, amax_steps: int) -> npt.NDArray[np.float32]:
    """Subnormal activations (multiples of 2^-149, signed) whose amax is ``amax_steps``
    times 2^-149."""
    steps = rng.integers(0, amax_steps + 1, size=(3, 64)).astype(np.float32)
    steps *= np.where(rng.random((3, 64)) < 0.5, -1, 1).astype(np.float32)
    steps[1, 5] = amax_steps
    return (steps * np.float32(2.0**-149)).astype(np.float32)


Builder = Callable[[np.random.Generator], npt.NDArray[Any]]
CASES: dict[str, tuple[Builder, float | None]] = {
    # name: (builder(rng) -> x, input_scale)
    "ties_static_scale": (lambda r: _tie_blocks(r, 16, 256, 6.0), 1.0),
    "ties_dynamic_global": (lambda r: _tie_blocks(r, 16, 256, 2688.0), None),
    "normal_dynamic_m1": (lambda r: r.standard_normal((1, 4096)).astype(np.float32), None),
    "normal_dynamic_m33": (lambda r: r.standard_normal((33, 272)).astype(np.float32), None),
    "normal_static_scale": (lambda r: r.standard_normal((8, 512)).astype(np.float32), 0.003),
    "rows_1e-3_to_1e3": (lambda r: rows_across_magnitudes(r, 7, 128, -3, 3), None),
    "zeros": (lambda r: np.zeros((4, 64), np.float32), None),
    # amax / 2688 underflows to 0 at amax <= 1344 * 2^-149: the global is then 1.0 (spec 1.0,
    # step 1 and its erratum); one step above, the global is the smallest subnormal 2^-149.
    "subnormal_amax_global_1": (lambda r: _subnormal(r, 1344), None),
    "subnormal_amax_global_2^-149": (lambda r: _subnormal(r, 1345), None),
    "zero_blocks": (lambda r: zero_blocks(r, 5, 128), None),
    "float16_input": (lambda r: r.standard_normal((16, 4096)).astype(np.float16), None),
    "nonfinite_blocks": (lambda r: nonfinite_blocks(r, 6, 128, 0.01), None),
    "bfloat16_input": (lambda r: r.standard_normal((16, 4096)).astype(ml_dtypes.bfloat16), None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_quantize_activations(
    nvfp4_backend: Any, nvfp4_record: Any, nvfp4_tolerance: Any, case: str
) -> None:
    """Crafted cases: exact midpoints (static and dynamic global), wide row ranges, zeros,
    zero blocks, float16 / bfloat16 inputs."""
    build, input_scale = CASES[case]
    x = build(np.random.default_rng(zlib.crc32(case.encode())))
    _encode_and_judge(
        nvfp4_backend, nvfp4_record, nvfp4_tolerance, case, x, input_scale, shape=list(x.shape)
    )


def _record_refusal(record: Any, case: str, input_scale: Any, exc: AssertionError) -> None:
    """Record the deviations :func:`_run` named for a refusal as the case's explanation."""
    text = str(exc)
    if _EXPLAINED in text:
        ids = [i.strip(" '[]") for i in text.split(_EXPLAINED, 1)[1].split(",")]
        record(case, input_scale=input_scale, explained_by=ids)


#: The random corpus whose disagreements are counted against ``others``: 2^20 + elements,
#: float32 as in the measurements behind the number. (float16 / bfloat16 inputs have few
#: mantissa bits, so exact midpoints are common - 1.5e-3 of the elements for normal bfloat16
#: data - and an encoder with another tie rule would exceed ``others`` there; they are
#: checked element by element in test_quantize_activations instead.)
RANDOM_CORPUS = [
    ("normal_256x4096_dynamic", (256, 4096), "float32", None, 1.0),
    ("heavy_tailed_64x1024_dynamic", (64, 1024), "float32", None, "t3"),
    ("normal_33x2048_static", (33, 2048), "float32", 0.002, 1.0),
]


def test_random_corpus_disagreement_fraction(
    nvfp4_backend: Any, nvfp4_record: Any, nvfp4_tolerance: Any
) -> None:
    """Random activations, 2^20 elements and more: every difference is a boundary
    disagreement and their fraction is within ``[quantize] others`` (``reference``, 0, for
    the reference)."""
    exact = is_reference(nvfp4_backend)
    tally = CorpusTally()
    runs: list[tuple[Any, Any, Any]] = []
    for name, shape, _dtype, input_scale, scale in RANDOM_CORPUS:
        rng = np.random.default_rng(zlib.crc32(name.encode()))
        if scale == "t3":
            x = rng.standard_t(3, size=shape)
        else:
            x = rng.standard_normal(shape) * np.exp(rng.normal(0.0, 1.0, size=(shape[0], 1)))
        x = x.astype(np.float32)
        got, figures = _encode_and_judge(
            nvfp4_backend, nvfp4_record, nvfp4_tolerance, name, x, input_scale, shape=list(shape)
        )
        tally.add(figures)
        runs.append((x, input_scale, got))
    try:
        tally.judge(nvfp4_record, nvfp4_tolerance, table="quantize", exact=exact, unit="elements")
    except AssertionError:
        # explained when one set of declared deviations gives every corpus item's planes
        x0, s0, got0 = runs[0]
        ids = explain_encoding(x0, s0, got0)
        if ids and all(
            _same(got, emu.quantize_activations(x, s, deviations=ids)) for x, s, got in runs[1:]
        ):
            nvfp4_record("random corpus attribution", explained_by=ids)
        else:
            nvfp4_record("random corpus attribution", explained_by=None)
        raise


def _same(got: Any, want: NVFP4Planes) -> bool:
    return (
        isinstance(got, NVFP4Planes)
        and np.array_equal(got.codes, want.codes)
        and np.array_equal(got.scales, want.scales)
    )


_finite = st.floats(-3.0e4, 3.0e4, width=32, allow_nan=False, allow_infinity=False)
#: Each special as the float32 it becomes: hypothesis refuses an array element that the
#: dtype would round (1e-30 is not a float32) in its older releases, with numpy 1.26.
_special = st.sampled_from(
    [float(np.float32(v)) for v in (0.0, -0.0, 0.25, -0.75, 1.25, 3.5, -5.0, 6.0, 1e-30, -1e-30)]
)


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)
@given(data=st.data())
def test_quantize_activations_property(
    nvfp4_backend: Any, nvfp4_record: Any, nvfp4_tolerance: Any, data: st.DataObject
) -> None:
    """Hypothesis-drawn activations (any finite float32, specials mixed in), dynamic and
    static globals."""
    m = data.draw(st.integers(1, 6), label="m")
    kb = data.draw(st.integers(1, 6), label="k_blocks")
    x = data.draw(
        hnp.arrays(np.float32, (m, kb * BLOCK_SIZE), elements=st.one_of(_finite, _special)),
        label="x",
    )
    input_scale = data.draw(st.sampled_from([None, None, 1.0, 0.01, 7.5]), label="input_scale")
    case = f"m{m}_k{kb * BLOCK_SIZE}_s{input_scale}"
    # a failing example is recorded with the declared deviations that explain it, like the
    # corpus tests' cases: the certificate explains the test only if every one is explained
    _encode_and_judge(
        nvfp4_backend,
        nvfp4_record,
        nvfp4_tolerance,
        case,
        x,
        input_scale,
        shape=[m, kb * BLOCK_SIZE],
    )
