"""The certificate JSON schema: the committed certificate and a fresh run's certificate
validate; a certificate with a field missing, a misspelt field, a wrong type or an unknown
outcome does not, and the error names the JSON path."""

from __future__ import annotations

import copy
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from nvfp4_conformance.certificate import SCHEMA_VERSION
from nvfp4_conformance.certificate_schema import (
    SCHEMA_VERSIONS,
    CertificateSchemaError,
    schema,
    validate,
)

DATA = Path(__file__).with_name("data") / "certificate-reference.json"


@pytest.fixture(scope="module")
def cert() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DATA.read_text(encoding="utf-8"))
    return loaded


def test_the_writer_version_has_a_schema() -> None:
    assert SCHEMA_VERSION in SCHEMA_VERSIONS
    assert schema()["properties"]["schema_version"] == {"const": SCHEMA_VERSION}


def test_the_schema_is_valid_json_schema() -> None:
    import jsonschema

    jsonschema.Draft202012Validator.check_schema(schema())


def test_the_committed_certificate_validates(cert: dict[str, Any]) -> None:
    validate(cert, str(DATA.name))


def test_a_fresh_certificate_validates(
    tmp_path: Path, run_command: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    out = tmp_path / "c.json"
    proc = run_command(out, "--nvfp4-tiers=T0,T1", "-q")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    validate(json.loads(out.read_text(encoding="utf-8")), out.name)


def _broken(cert: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """A copy of ``cert`` with the value at ``path`` replaced (``...`` deletes the key)."""
    bad = copy.deepcopy(cert)
    node = bad
    for key in path[:-1]:
        node = node[key]
    if value is ...:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return bad


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("result",), ..., "'result' is a required property"),
        (("result",), "certifed", "$.result: 'certifed' is not one of"),
        (("spec_version",), "1", "$.spec_version: '1' does not match"),
        (("backend", "priority"), "50", "$.backend.priority: '50' is not of type 'integer'"),
        (("tests", 0, "outcome"), "pass", "$.tests[0].outcome: 'pass' is not one of"),
        (("tiers", "T0", "verdict"), "ok", "$.tiers.T0.verdict: 'ok' is not one of"),
        (
            ("capabilities", "qmm", "state"),
            "fine",
            "$.capabilities.qmm.state: 'fine' is not one of",
        ),
        (("certified_capabilities",), [], "Additional properties are not allowed"),
        (("duration_s",), -1, "$.duration_s: -1 is less than the minimum of 0"),
    ],
)
def test_a_broken_certificate_is_refused_with_its_path(
    cert: dict[str, Any], path: tuple[Any, ...], value: Any, message: str
) -> None:
    with pytest.raises(CertificateSchemaError) as info:
        validate(_broken(cert, path, value), "broken.json")
    assert str(info.value).startswith("broken.json: not a valid nvfp4 conformance certificate")
    assert message in str(info.value)


def test_an_unknown_schema_version_is_refused(cert: dict[str, Any]) -> None:
    with pytest.raises(
        CertificateSchemaError, match=r"schema_version: expected one of \(2, 3, 4\), found 9"
    ):
        validate(_broken(cert, ("schema_version",), 9))
    with pytest.raises(CertificateSchemaError, match=r"\$: expected a JSON object, found list"):
        validate([cert])


REPOSITORY = Path(__file__).resolve().parents[2]


#: The folder of the engines' whole-model results (nvfp4_engines.whole_model.results.FOLDER).
WHOLE_MODEL_RESULTS = "whole-model"
#: The measured impact of the declared deviations (tools/measure_deviation_impact.py): a
#: report, not a certificate, checked by tests/test_deviation_impact.py.
DEVIATION_IMPACT = "deviation-impact.json"


def _committed_certificates() -> list[Path]:
    """Every certificate committed in the repository (the engines matrix's among them). The
    whole-model results beside them (``reports/engines/whole-model/``) are not certificates:
    they have their own schema, checked by nvfp4-engines' tests; nor is the deviations'
    impact report."""
    found = [*sorted((REPOSITORY / "reports").glob("**/*.json")), DATA]
    return [
        p
        for p in found
        if p.is_file() and p.parent.name != WHOLE_MODEL_RESULTS and p.name != DEVIATION_IMPACT
    ]


def test_every_committed_certificate_validates() -> None:
    paths = _committed_certificates()
    if (REPOSITORY / ".git").exists():  # a checkout: the engines' certificates are there
        assert any(p.parent.name == "engines" for p in paths), paths
    for path in paths:
        validate(json.loads(path.read_text(encoding="utf-8")), str(path.relative_to(REPOSITORY)))


def test_the_writer_refuses_a_certificate_its_schema_does_not_allow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """write_certificate checks the JSON before writing: a builder that produced a field the
    schema does not know writes nothing."""
    from nvfp4_conformance import certificate

    real = certificate.build_certificate

    def with_stray_field(run: Any) -> dict[str, Any]:
        cert = real(run)
        cert["stray"] = 1
        return cert

    monkeypatch.setattr(certificate, "build_certificate", with_stray_field)
    run = _finished_reference_run()
    out = tmp_path / "c.json"
    with pytest.raises(CertificateSchemaError, match="Additional properties are not allowed"):
        certificate.write_certificate(run, out)
    assert not out.exists()
    assert not out.with_suffix(".md").exists()


def _finished_reference_run() -> Any:
    """A ConformanceRun of the reference backend with no tests (enough to build a
    certificate)."""
    import time

    import nvfp4
    from nvfp4_conformance.recording import ConformanceRun

    run = ConformanceRun(backend=nvfp4.get_backend("reference"), backend_name="reference")
    run.spec_version = "1.1"
    run.finished = time.time()
    run.exit_status = 0
    return run


def test_read_certificate_returns_what_was_written_and_refuses_other_files(
    tmp_path: Path,
) -> None:
    """The public reader: a certificate the suite wrote comes back as written; a file that
    is not JSON, or JSON its schema refuses, is refused with the file's name."""
    from nvfp4_conformance import certificate, read_certificate

    out = tmp_path / "c.json"
    certificate.write_certificate(_finished_reference_run(), out)
    assert read_certificate(out) == json.loads(out.read_text(encoding="utf-8"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(CertificateSchemaError, match=r"bad\.json: .*not readable as JSON"):
        read_certificate(bad)
    stray = json.loads(out.read_text(encoding="utf-8"))
    stray["stray"] = 1
    bad.write_text(json.dumps(stray), encoding="utf-8")
    with pytest.raises(CertificateSchemaError, match=r"bad\.json: .*Additional properties"):
        read_certificate(bad)
