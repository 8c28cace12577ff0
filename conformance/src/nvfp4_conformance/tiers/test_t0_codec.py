"""T0 codec: every E2M1 code and every E4M3 scale byte, decoded by the backend, exactly as
:mod:`nvfp4.spec`'s tables say.

* All 16 codes in both nibble positions (``dequantize`` and ``qmm`` against an identity).
* All 127 valid scale bytes (0x00..0x7E), each with every magnitude and sign.
* All 129 invalid scale bytes (bit 7 set, 0x7F) refused by ``prepare`` with ``PlaneError``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from nvfp4.planes import NVFP4Planes, PlaneError
from nvfp4.spec import E2M1_VALUES, E4M3_INVALID_BYTES, E4M3_VALUES

from nvfp4_conformance.attribution import decode_or_explain
from nvfp4_conformance.cases import codes_probe, scales_probe
from nvfp4_conformance.checks import assert_exact, exact_mismatches


def _expected(planes: NVFP4Planes, codes: npt.NDArray[np.uint8]) -> npt.NDArray[np.float32]:
    """The spec's decode of a probe (global 1.0): E2M1 value times E4M3 value."""
    scale = np.repeat(E4M3_VALUES[planes.scales], 16, axis=-1)
    return (E2M1_VALUES[codes] * scale).astype(np.float32)


def _explain(planes: NVFP4Planes, codes: npt.NDArray[np.uint8]) -> Callable[[tuple[int, ...]], str]:
    def explain(at: tuple[int, ...]) -> str:
        row, col = at
        code = int(codes[row, col])
        byte = int(planes.scales[row, col // 16])
        nibble = "low" if col % 2 == 0 else "high"
        return (
            f"code {code} (0b{code:04b}, {nibble} nibble of byte {col // 2}) = "
            f"{E2M1_VALUES[code]!r} x scale byte 0x{byte:02X} = {E4M3_VALUES[byte]!r}"
        )

    return explain


def _per_code_summary(
    found: npt.NDArray[Any], expected: npt.NDArray[Any], codes: npt.NDArray[np.uint8]
) -> str:
    bad = exact_mismatches(found, expected)
    wrong = sorted({int(c) for c in codes[bad]})
    if not wrong:
        return ""
    parts = []
    for c in wrong:
        at = np.argwhere(bad & (codes == c))[0]
        parts.append(
            f"code {c} (0b{c:04b}) decodes as {float(np.asarray(found)[tuple(at)])!r}, "
            f"spec says {float(expected[tuple(at)])!r}"
        )
    return "wrong codes: " + "; ".join(parts)


def _decode(
    backend: Any, planes: NVFP4Planes, verb: str, record: Any = None, case: str = ""
) -> npt.NDArray[Any]:
    if verb == "dequantize":
        if record is None:
            handle = backend.prepare(planes)
            return np.asarray(backend.to_numpy(backend.dequantize(handle, "float32")))
        # a refusal (in prepare or dequantize) a declared deviation also makes is recorded
        # as explained by it
        return np.asarray(
            decode_or_explain(
                record,
                case,
                planes,
                "float32",
                lambda: backend.to_numpy(backend.dequantize(backend.prepare(planes), "float32")),
            )
        )
    handle = backend.prepare(planes)
    # qmm against the identity: y[k, n] = w[n, k] exactly (one nonzero product per sum)
    eye = np.eye(planes.k, dtype=np.float32)
    y = np.asarray(backend.to_numpy(backend.qmm(backend.from_numpy(eye), handle)))
    return y.T


VERBS = [
    pytest.param(
        "dequantize", marks=pytest.mark.requires_capability("dequantize"), id="dequantize"
    ),
    pytest.param("qmm", marks=pytest.mark.requires_capability("qmm"), id="qmm_identity"),
]


@pytest.mark.parametrize("verb", VERBS)
def test_all_e2m1_codes(nvfp4_backend: Any, nvfp4_record: Any, verb: str) -> None:
    """All 16 codes, in low and high nibbles, decode to ``spec.E2M1_VALUES`` (scale 1.0,
    global 1.0; code 8 is -0.0)."""
    planes, codes = codes_probe()
    expected = _expected(planes, codes)
    found = _decode(nvfp4_backend, planes, verb, nvfp4_record, "16 codes x 2 nibbles x 16 rows")
    bad = int(exact_mismatches(found, expected).sum()) if found.shape == expected.shape else -1
    nvfp4_record("16 codes x 2 nibbles x 16 rows", mismatches=bad, elements=expected.size)
    summary = _per_code_summary(found, expected, codes) if bad > 0 else ""
    assert_exact(
        found,
        expected,
        f"T0 {verb}: E2M1 codes" + (f" ({summary})" if summary else ""),
        explain=_explain(planes, codes),
        dtype=np.float32,
    )


@pytest.mark.parametrize("verb", VERBS)
def test_all_valid_scale_bytes(nvfp4_backend: Any, nvfp4_record: Any, verb: str) -> None:
    """Every valid scale byte 0x00..0x7E (normals and subnormals) decodes to
    ``spec.E4M3_VALUES``, times every code."""
    planes, codes = scales_probe()
    expected = _expected(planes, codes)
    found = _decode(nvfp4_backend, planes, verb, nvfp4_record, "127 valid bytes x 2 blocks")
    bad_mask = exact_mismatches(found, expected) if found.shape == expected.shape else None
    bad = int(bad_mask.sum()) if bad_mask is not None else -1
    wrong_bytes: list[int] = []
    if bad_mask is not None and bad:
        block_bad = bad_mask.reshape(planes.n, 2, 16).any(axis=-1)
        wrong_bytes = sorted({int(b) for b in planes.scales[block_bad]})
    nvfp4_record(
        "127 valid bytes x 2 blocks",
        mismatches=bad,
        elements=expected.size,
        wrong_scale_bytes=[f"0x{b:02X}" for b in wrong_bytes[:16]],
    )
    assert_exact(
        found,
        expected,
        f"T0 {verb}: E4M3 scale bytes"
        + (
            f" (wrong bytes: {', '.join(f'0x{b:02X}' for b in wrong_bytes[:16])})"
            if wrong_bytes
            else ""
        ),
        explain=_explain(planes, codes),
        dtype=np.float32,
    )


def test_invalid_scale_bytes_refused(nvfp4_backend: Any, nvfp4_record: Any) -> None:
    """The 129 invalid scale bytes (bit 7 set, 0x7F NaN) make ``prepare`` raise
    ``PlaneError`` naming the tensor (content validation at load time)."""
    accepted, wrong_error = [], []
    for byte in sorted(E4M3_INVALID_BYTES):
        scales = np.full((4, 2), 0x38, dtype=np.uint8)
        scales[2, 1] = byte
        name = f"invalid_scale_0x{byte:02X}"
        planes = NVFP4Planes(
            np.zeros((4, 16), np.uint8), scales, np.asarray(1.0, dtype=np.float32), name=name
        )
        try:
            nvfp4_backend.prepare(planes)
        except PlaneError as exc:
            if name not in str(exc):
                wrong_error.append(f"0x{byte:02X}: message does not name the tensor: {exc}")
        except Exception as exc:
            wrong_error.append(f"0x{byte:02X}: {type(exc).__name__} instead of PlaneError: {exc}")
        else:
            accepted.append(f"0x{byte:02X}")
    nvfp4_record("129 invalid bytes", accepted=len(accepted), wrong_error=len(wrong_error))
    assert not accepted, f"prepare accepted invalid scale bytes: {', '.join(accepted)}"
    assert not wrong_error, "prepare refused invalid scale bytes badly:\n" + "\n".join(
        wrong_error[:8]
    )
