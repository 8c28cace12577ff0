"""Every reproducer of :mod:`nvfp4_engines.deviations` still shows its deviation, on the
engine installed here (run as a script with only the engine imported)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
from conftest import ENGINES
from nvfp4_engines.deviations import DEVIATIONS, classify

ENGINE_IMPORT = {name: module for name, (_, module) in ENGINES.items()}
CASES = [
    pytest.param(d, engine, id=f"{d.key}-{engine}")
    for d in DEVIATIONS
    for engine in d.reproducers
    if importlib.util.find_spec(ENGINE_IMPORT[engine]) is not None
]


@pytest.mark.parametrize(("deviation", "engine"), CASES)
def test_reproducer_shows_the_deviation(deviation, engine: str) -> None:
    run = subprocess.run(
        [sys.executable, "-c", deviation.reproducers[engine]],
        capture_output=True,
        text=True,
        timeout=120,
    )
    crashed = run.returncode < 0 and engine in deviation.crashes
    assert crashed or run.stdout.startswith("DEVIATION:"), (
        f"{deviation.key} on {engine}: rc {run.returncode}, stdout {run.stdout!r}, "
        f"stderr {run.stderr[-500:]!r}"
    )


def test_every_pattern_classifies_a_message_of_its_own() -> None:
    messages = {
        "ggml_no_global": "quantize_activations: global 1.0, the reference's is 0.0016 (a",
        "k_multiple_of_64": "K for GGUF NVFP4: expected a multiple of 64, found K = 32",
        "q8_nonfinite_block": "d of row 0, block 0: np.float16(inf), expected np.float16(nan)",
        "out_of_range_expert_id": "expert id -1 at row 0 is outside [0, 4): ...",
        "mlx_k_multiple_of_32": "[reshape] Cannot reshape array of size 10 into shape (2,4).",
        "mlx_negative_zero_code": "41907 boundary disagreements in 1181696 random elements",
        "mlx_low_precision": "qmm M=1 K=64 N=7 float16: max|err|/max|ref| = inf > tolerance",
        "partials_in_activation_dtype": "test_t7_sharded.py::test_row_parallel_qmm_cancelling["
        "tp3-o_576_cancelling-bfloat16] o_576_cancelling at TP3, bfloat16: row-parallel sum "
        "max|y - ref| / max|ref| = (outputs beyond their accumulation floor) inf > "
        "[row_parallel] 0.01",
        "mlx_degenerate_global": "tensor 'a': global_scale at (): expected finite and > 0",
        "mlx_float16_encoder": "test_quantize_activations[float16_input] quantize_activations: "
        "block (1, 189) has scale byte 0x72, the reference's is 0x73",
        "scale_byte_zero": "block (0, 0) has scale byte 0x00, the reference's is 0x38",
        "mlx_nonfinite_block": "block (0, 1) holds NaN/Inf; it must get scale byte 0x7F and "
        "codes 0, found 0x7E and codes [0, 11, 10]",
        "scale_times_global_first": "T3 dequantize random_2d -> float32: 761 of 8976 elements "
        "differ (exact match required)",
        "ct_bfloat16_decompress": "T3 dequantize random_2d -> float16: 52 of 8976 elements "
        "differ (exact match required)",
        "zero_amax_global": "quantize_activations: global 0.0, the reference's is 1.0 (a",
        "nonfinite_amax_global": "quantize_activations: global nan, the reference's is 0.000372",
        "ct_nonfinite_global_one": "quantize_activations: global 1.0, the reference's is 0.0013",
        "ct_encode_global": "quantize_activations: global 0.0016233766, the reference's is "
        "0.0016276041",
        "ct_zero_scale_eps": "quantize_activations: block (0, 0) has scale byte 0x20, the "
        "reference's is 0x38; the unrounded scale 1.0 is not within",
        "torchao_no_float16": "AssertionError: torch.float16 not supported",
        "torchao_scale_floor": "quantize_activations: block (0, 0) has scale byte 0x08, the "
        "reference's is 0x38; the unrounded scale 1.0 is not within",
        "torchao_reciprocal_scale": "test_quantize_activations[subnormal_amax_global_2^-149] "
        "quantize_activations: element (row 0, col 1) x = -1.45e-42, scaled value -4.98: code "
        "15, the reference gives 14; not a boundary disagreement",
    }
    assert sorted(messages) == sorted(d.key for d in DEVIATIONS)
    engine_of = {d.key: next(iter(d.reproducers)) for d in DEVIATIONS}
    for key, message in messages.items():
        found = classify(message, engine=engine_of[key])
        assert found is not None, key
        assert found.key == key, (key, found.key)
    assert classify("something else entirely") is None


def test_an_engine_gets_only_its_own_deviations() -> None:
    message = "T3 dequantize random_2d -> float32: 761 of 8976 elements differ"
    assert classify(message, engine="torchao").key == "scale_times_global_first"
    assert classify(message, engine="compressed-tensors").key == "ct_bfloat16_decompress"
    assert classify(message, engine="gguf-py") is None
