"""T3 dequantize: ``backend.dequantize(prepare(planes), dtype)`` is exact.

Spec 1.0 "Decoding": ``value = e2m1(code) * e4m3(scale) * global``; the first product is
exact, the multiply by the row's global (per tensor, per expert or per partition) rounds
once in float32, and float16 / bfloat16 outputs are that float32 result cast with
round-to-nearest-even. The expected values are computed here from :mod:`nvfp4.spec`'s
tables (not by calling the reference), so this tier checks the reference too.
Signed zeros compare equal; infinities (float16 overflow) must match.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import hypothesis.strategies as st
import ml_dtypes
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, given, settings
from nvfp4 import deviation_emulators as emu
from nvfp4 import reference
from nvfp4.dtypes import OUTPUT_DTYPES
from nvfp4.planes import NVFP4Planes
from nvfp4.spec import E2M1_VALUES, E4M3_VALUES

from nvfp4_conformance.attribution import explain_dequantize, explain_refusal
from nvfp4_conformance.cases import random_planes, realistic_weight
from nvfp4_conformance.checks import assert_exact, exact_mismatches

pytestmark = pytest.mark.requires_capability("dequantize")

DTYPES = list(OUTPUT_DTYPES)


def spec_decode(planes: NVFP4Planes, dtype: str) -> npt.NDArray[Any]:
    """Decode from the spec tables: exact product, one float32 rounding, then the cast."""
    codes = reference.unpack_codes(planes.codes)
    scale = np.repeat(E4M3_VALUES[planes.scales], 16, axis=-1)
    unscaled = (E2M1_VALUES[codes] * scale).astype(np.float32)
    # overflow to +-inf and underflow are the spec's results (float16_overflow, subnormal
    # outputs), not accidents: silenced here, at the product and the cast, only
    with np.errstate(over="ignore", under="ignore"):
        v = (unscaled * planes.row_global()[..., None]).astype(np.float32)
        return v.astype(OUTPUT_DTYPES[dtype])


def explainer(planes: NVFP4Planes) -> Callable[[tuple[int, ...]], str]:
    codes = reference.unpack_codes(planes.codes)
    row_g = planes.row_global()

    def explain(at: tuple[int, ...]) -> str:
        *lead, col = at
        code = int(codes[(*lead, col)])
        byte = int(planes.scales[(*lead, col // 16)])
        g = float(row_g[tuple(lead)])
        where = f"expert {lead[0]} row {lead[1]}" if len(lead) == 2 else f"row {lead[0]}"
        part = ""
        if planes.partitions is not None:
            row = lead[-1]
            p = int(np.searchsorted(planes.partitions, row, side="right") - 1)
            part = f", partition {p}"
        return (
            f"{where}{part}: code {code} ({E2M1_VALUES[code]!r}) x scale 0x{byte:02X} "
            f"({E4M3_VALUES[byte]!r}) x global {g!r}"
        )

    return explain


def check_dequantize(backend: Any, record: Any, case: str, planes: NVFP4Planes, dtype: str) -> None:
    expected = spec_decode(planes, dtype)
    try:
        found = np.asarray(backend.to_numpy(backend.dequantize(backend.prepare(planes), dtype)))
    except Exception:
        # a refusal a declared deviation also makes is recorded as explained by it
        record(
            case,
            dtype=dtype,
            shape=list(planes.shape),
            explained_by=explain_refusal(lambda d: emu.dequantize(planes, dtype, deviations=d)),
        )
        raise
    mismatches = (
        int(exact_mismatches(found, expected).sum()) if found.shape == expected.shape else -1
    )
    # a failing case carries the declared deviations whose emulation gives exactly this
    # output (spec 1.2); a passing one carries no explained_by, so a Hypothesis test's
    # failing examples are the cases that have one (attribution.failing_explanation)
    explained = {"explained_by": explain_dequantize(found, planes, dtype)} if mismatches else {}
    record(
        case,
        dtype=dtype,
        shape=list(planes.shape),
        mismatches=mismatches,
        elements=int(expected.size),
        **explained,
    )
    assert_exact(
        found,
        expected,
        f"T3 dequantize {case} -> {dtype}",
        explain=explainer(planes),
        dtype=OUTPUT_DTYPES[dtype],
    )


def _ties(rng: np.random.Generator, dtype: str, *, name: str) -> NVFP4Planes:
    """Planes whose global is 1 plus half an ulp of 1 in ``dtype`` (1 + 2^-8 for bfloat16,
    1 + 2^-11 for float16): many products land exactly half-way between two ``dtype``
    values, so the cast's ties-to-even rule decides them."""
    half_ulp = float(ml_dtypes.finfo(OUTPUT_DTYPES[dtype]).eps) / 2
    return random_planes(
        rng, 16, 64, scale_bytes=(0x30, 0x40), global_scale=np.float32(1 + half_ulp), name=name
    )


def _cases() -> dict[str, NVFP4Planes]:
    rng = np.random.default_rng(303)
    parts = (0, 16, 24, 40)
    return {
        "random_2d": random_planes(rng, 33, 272, name="t3.random"),
        "realistic_2d": realistic_weight(rng, 64, 512, name="t3.realistic"),
        "experts_per_expert_globals": random_planes(rng, 24, 64, experts=3, name="t3.experts"),
        "partitions_per_partition_globals": random_planes(
            rng, 40, 64, partitions=parts, name="t3.qkv"
        ),
        "experts_and_partitions": random_planes(
            rng, 40, 32, experts=2, partitions=parts, name="t3.moe_gate_up"
        ),
        # 448 * 6 * 100 overflows float16 (inf); float32 and bfloat16 hold it
        "float16_overflow": random_planes(
            rng, 8, 64, scale_bytes=(0x70, 0x7E), global_scale=np.float32(100.0), name="t3.big"
        ),
        "bfloat16_ties": _ties(rng, "bfloat16", name="t3.bf16_ties"),
        "float16_ties": _ties(rng, "float16", name="t3.f16_ties"),
        # products below 2^-126: float32 subnormal outputs (no flush to zero)
        "float32_subnormal_outputs": random_planes(
            rng,
            8,
            64,
            scale_bytes=(0x00, 0x20),
            global_scale=np.float32(2.0**-120),
            name="t3.subnormal",
        ),
    }


CASES = _cases()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(CASES))
def test_dequantize(nvfp4_backend: Any, nvfp4_record: Any, case: str, dtype: str) -> None:
    check_dequantize(nvfp4_backend, nvfp4_record, case, CASES[case], dtype)


_globals = st.floats(2.0**-100, 2.0**20, width=32, allow_nan=False, allow_infinity=False)


@settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_dequantize_property(nvfp4_backend: Any, nvfp4_record: Any, data: st.DataObject) -> None:
    """Hypothesis-drawn shapes, experts, partitions, globals and output dtypes."""
    experts = data.draw(st.sampled_from([None, None, 1, 3]), label="experts")
    n = data.draw(st.integers(1, 40), label="n")
    k = 16 * data.draw(st.integers(1, 8), label="k_blocks")
    parts = None
    if n >= 2 and data.draw(st.booleans(), label="fused"):
        cut = data.draw(st.integers(1, n - 1), label="cut")
        parts = (0, cut, n)
    shape = ((experts,) if experts else ()) + ((2,) if parts else ())
    g = np.array(
        data.draw(
            st.lists(
                _globals, min_size=max(1, int(np.prod(shape))), max_size=max(1, int(np.prod(shape)))
            ),
            label="globals",
        ),
        dtype=np.float32,
    ).reshape(shape)
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    planes = random_planes(
        np.random.default_rng(seed),
        n,
        k,
        experts=experts,
        partitions=parts,
        global_scale=g,
        name="t3.property",
    )
    dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
    check_dequantize(nvfp4_backend, nvfp4_record, f"E{experts}_N{n}_K{k}_P{parts}", planes, dtype)
