"""T6's quantized-activation quality figures (W4A4, W4A8 int8, W4A8 FP8) in the certificate
(the figures themselves and the switching of modes are nvfp4-torch's, tested there).

* The certificate: a run that recorded T6 activation-quality cases carries, per mode, the
  means over the prompts, W4A8's KL as a fraction of W4A4's, and a Markdown table.
"""

from __future__ import annotations

import pytest
from nvfp4_conformance import certificate_schema
from nvfp4_conformance.certificate import SCHEMA_VERSION, build_certificate, render_markdown
from nvfp4_conformance.recording import ConformanceRun


# ------------------------------------------------------------------- the certificate
def _run_with_quality() -> ConformanceRun:
    import nvfp4

    run = ConformanceRun(
        backend_name="reference", backend=nvfp4.get_backend("reference"), spec_version="1.1"
    )
    kl = {"w4a4": (0.30, 0.20), "w4a8": (0.0035, 0.0025), "w4a8_fp8": (0.03, 0.01)}
    for mode, (a, b) in kl.items():
        node = f"nvfp4_conformance/tiers/test_t6_parity.py::test_activation_quality[{mode}]"
        run.outcome(node).outcome = "passed"
        for prompt, value, top1 in (("p0", a, 0.9), ("p1", b, 1.0)):
            run.record(
                node,
                prompt,
                {
                    "kind": "activation_quality",
                    "mode": mode,
                    "mean_kl_w4a16_to_mode": value,
                    "top1_agreement_vs_w4a16": top1,
                    "mean_kl_float32_to_mode": 2 * value,
                    "top1_agreement_vs_float32": top1 - 0.1,
                },
            )
        run.record(
            node,
            f"{mode} (all prompts)",
            {"kind": "activation_quality_time", "mode": mode, "seconds": 4.5},
        )
    parity = "nvfp4_conformance/tiers/test_t6_parity.py::test_greedy_parity[p0]"
    run.outcome(parity).outcome = "passed"
    run.record(parity, "p0", {"kind": "parity", "tokens_matched": 40, "tokens_expected": 40})
    run.finished = run.started + 1
    return run


def test_certificate_carries_the_quality_of_each_activation_mode() -> None:
    cert = build_certificate(_run_with_quality())
    assert cert["schema_version"] == SCHEMA_VERSION == 4
    certificate_schema.validate(cert, "a certificate with T6 activation quality")
    quality = cert["t6"]["activation_quality"]
    assert list(quality) == ["w4a4", "w4a8", "w4a8_fp8"]
    w4a8 = quality["w4a8"]
    assert w4a8["mean_kl_w4a16_to_mode"] == pytest.approx(0.003)
    assert w4a8["mean_kl_float32_to_mode"] == pytest.approx(0.006)
    assert w4a8["top1_agreement_vs_w4a16"] == pytest.approx(0.95)
    assert w4a8["top1_agreement_vs_float32"] == pytest.approx(0.85)
    assert w4a8["seconds"] == 4.5
    assert [p["case"] for p in w4a8["prompts"]] == ["p0", "p1"]
    # W4A8's KL against W4A16 next to W4A4's: the figure the W4A8 work aims at (<= 1/3)
    assert w4a8["kl_w4a16_to_mode_over_w4a4"] == pytest.approx(0.003 / 0.25)
    assert quality["w4a8_fp8"]["kl_w4a16_to_mode_over_w4a4"] == pytest.approx(0.02 / 0.25)
    assert "kl_w4a16_to_mode_over_w4a4" not in quality["w4a4"]

    md = render_markdown(cert)
    assert "### Quantized activations" in md
    rows = {
        cells[0]: cells
        for line in md.splitlines()
        if line.startswith("| w4a")
        for cells in [[c.strip() for c in line.strip().strip("|").split("|")]]
    }
    assert rows["w4a8"][1:] == ["0.003", "0.012", "0.95", "0.006", "0.85", "2", "4.5"]
    assert rows["w4a4"][2] == "-"
    assert "mean KL(W4A16 \\|\\| mode)" in md
    summary = md.split("\n## ", 1)[0]
    assert (
        "T6 quantized activations (information; mean KL(W4A16 || mode) in nats, top-1 "
        "agreement with W4A16): w4a4 0.25, top-1 0.95; w4a8 0.003 (0.012 of W4A4's), top-1 "
        "0.95; w4a8_fp8 0.02 (0.08 of W4A4's), top-1 0.95." in summary
    )


def test_a_certificate_without_quantized_modes_has_no_quality_entry() -> None:
    run = _run_with_quality()
    for node in [n for n in run.outcomes if "activation_quality" in n]:
        del run.outcomes[node]
    cert = build_certificate(run)
    assert "activation_quality" not in cert["t6"]
    assert "### Quantized activations" not in render_markdown(cert)
