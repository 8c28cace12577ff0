"""The engines matrix: certificates are recorded without machine paths, and the committed
docs/engines.md is exactly what the committed certificates give."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nvfp4_engines import matrix
from nvfp4_engines.whole_model import results

ROOT = Path(__file__).resolve().parents[3]


def test_sanitize_keeps_no_machine_path(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    cert = {
        "imported_from": {
            "nvfp4": f"{root}/packages/nvfp4-core/src/nvfp4/__init__.py",
            "backend": f"{root}/.nox/engines/lib/python3.11/site-packages/nvfp4_engines/ggml.py",
        },
        "tests": [{"message": "in /opt/venv/lib/python3.11/site-packages/mlx/core.py: boom"}],
        "backend": {"name": "toy"},
    }
    src = tmp_path / "c.json"
    src.write_text(json.dumps(cert))
    (out,) = matrix.record([src], tmp_path / "reports", root)
    got = json.loads(out.read_text())
    assert got["imported_from"]["nvfp4"] == "packages/nvfp4-core/src/nvfp4/__init__.py"
    assert got["imported_from"]["backend"] == "site-packages/nvfp4_engines/ggml.py"
    assert got["tests"][0]["message"] == "in site-packages/mlx/core.py: boom"


def test_committed_doc_is_generated_from_the_committed_certificates() -> None:
    certs = matrix.load_certificates(ROOT / "reports" / "engines")
    assert {c["backend"]["name"] for c in certs} == {
        "gguf-py",
        "mlx-native",
        "ggml",
        "modelopt",
        "compressed-tensors",
        "torchao",
    }
    whole = results.load_all(ROOT / "reports" / "engines" / results.FOLDER)
    impact_file = ROOT / "reports" / matrix.IMPACT
    impact = json.loads(impact_file.read_text()) if impact_file.is_file() else None
    assert (ROOT / "docs" / "engines.md").read_text() == matrix.render(certs, whole, impact)


def _cert(tests: list[dict[str, Any]], result: str = "failed") -> dict[str, Any]:
    return {"backend": {"name": "modelopt", "notes": []}, "result": result, "tests": tests}


def test_an_engine_verdict_follows_the_registry() -> None:
    """Explained by emulation or by a declared deviation's message: compatible; an unsafe
    deviation or an unexplained failure: incompatible; nothing failing: conformant."""
    first = {
        "nodeid": "a",
        "outcome": "failed",
        "message": "",
        "explained_by": ["scale_times_global_first"],
    }
    v = matrix.engine_verdict(_cert([first]))
    assert v["class"] == "compatible"
    assert v["claimed"] == {"scale_times_global_first": 1}
    assert v["by"] == {"emulation": 1, "message": 0}
    unsafe = {**first, "explained_by": ["zero_amax_global"]}
    v = matrix.engine_verdict(_cert([first, unsafe]))
    assert v["class"] == "incompatible"
    assert v["unsafe"] == ["zero_amax_global"]
    odd = {"nodeid": "b", "outcome": "failed", "message": "something else", "explained_by": None}
    v = matrix.engine_verdict(_cert([first, odd]))
    assert v["class"] == "incompatible"
    assert v["unexplained"] == ["b"]
    passed = {"nodeid": "c", "outcome": "passed", "message": ""}
    assert matrix.engine_verdict(_cert([passed], "certified"))["class"] == "conformant"
    assert matrix.engine_verdict(_cert([passed], "failed"))["class"] == "incompatible"


def test_a_bounded_deviation_shows_the_worst_fraction_of_its_bound() -> None:
    """The deviations section gives, for a deviation whose failing cases measured how much
    of its bound they use (T7's ``bound_used``), the worst of them; nothing for the others."""
    certs = matrix.load_certificates(ROOT / "reports" / "engines")
    torchao = next(c for c in certs if c["backend"]["name"] == "torchao")
    key = "partials_in_activation_dtype"
    sums = [t for t in torchao["tests"] if "test_row_parallel_qmm_cancelling[" in t["nodeid"]]
    failed = [t for t in sums if t["outcome"] == "failed"]
    assert failed, "the committed torchao certificate has no failing row-parallel sum"
    for i, t in enumerate(failed):
        t["cases"][-1]["bound_used"] = {key: 0.1 * (i + 1)}
    md = matrix.render(certs, [], None)
    (line,) = [x for x in md.splitlines() if x.startswith(f"**{key}**")]
    assert line.endswith(f"; the worst uses {0.1 * len(failed):.2g} of its bound."), line
    (other,) = [x for x in md.splitlines() if x.startswith("**zero_amax_global**")][:1]
    assert "of its bound" not in other
