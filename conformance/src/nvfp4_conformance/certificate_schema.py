"""The certificate's JSON schema, for anyone who reads certificates programmatically.

Each ``schema_version`` has its own schema file, ``data/certificate-v<N>.schema.json``
(JSON Schema draft 2020-12), shipped in the wheel; a certificate names its version in
``schema_version``. :func:`validate` checks a certificate against the schema of the version
it names and raises :class:`CertificateSchemaError` listing every violation, each with its
JSON path::

    import json
    from nvfp4_conformance.certificate_schema import validate

    cert = json.load(open("reports/conformance-cpu.json"))
    validate(cert)  # raises CertificateSchemaError if it is not a valid certificate
    print(cert["result"], cert["capabilities_certified"])
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

__all__ = ["SCHEMA_VERSION", "SCHEMA_VERSIONS", "CertificateSchemaError", "schema", "validate"]

#: The form of the certificate JSON. 2 added ``tiers`` (the per-tier summary), ``left_out``
#: (what a partial run did not run, and why) and each test's ``hypothesis`` flag; version 1
#: carried ``"certificate_format": 1`` in its place. 3 added ``t6.activation_quality``
#: (per quantized activation mode: KL and top-1 agreement against W4A16 and float32),
#: ``platform.cpu`` (the CPU model) and ``platform.emulation`` (qemu-user evidence or null).
#: 4 added ``verdict`` (the conformance class of spec 1.2's draft and the declared
#: deviations that explain the failures) and each test's ``explained_by`` (deviation ids, or
#: null: unexplained or not failing).
SCHEMA_VERSION = 4
#: The schema versions this suite can check (each has a schema file).
SCHEMA_VERSIONS = (2, 3, 4)


class CertificateSchemaError(ValueError):
    """A certificate that does not match its schema; ``errors`` holds one line per
    violation (``$.path: message``)."""

    def __init__(self, where: str, errors: list[str]) -> None:
        self.errors = errors
        shown = "; ".join(errors[:5]) + (f"; and {len(errors) - 5} more" if len(errors) > 5 else "")
        super().__init__(f"{where}: not a valid nvfp4 conformance certificate: {shown}")


@cache
def schema(version: int = SCHEMA_VERSION) -> dict[str, Any]:
    """The JSON schema of certificates of ``schema_version`` ``version``."""
    if version not in SCHEMA_VERSIONS:
        raise CertificateSchemaError(
            "schema", [f"schema_version: expected one of {SCHEMA_VERSIONS}, found {version!r}"]
        )
    text = resources.files(__package__).joinpath(f"data/certificate-v{version}.schema.json")
    loaded: dict[str, Any] = json.loads(text.read_text(encoding="utf-8"))
    return loaded


def validate(cert: Any, where: str = "certificate") -> None:
    """Check ``cert`` (a parsed certificate) against the schema of its ``schema_version``;
    ``where`` (a file name) starts the error message."""
    import jsonschema

    if not isinstance(cert, dict):
        raise CertificateSchemaError(
            where, [f"$: expected a JSON object, found {type(cert).__name__}"]
        )
    version = cert.get("schema_version")
    if isinstance(version, bool) or version not in SCHEMA_VERSIONS:
        raise CertificateSchemaError(
            where, [f"$.schema_version: expected one of {SCHEMA_VERSIONS}, found {version!r}"]
        )
    checker = jsonschema.Draft202012Validator(schema(version))
    errors = sorted(checker.iter_errors(cert), key=lambda e: list(e.absolute_path))
    if errors:
        raise CertificateSchemaError(where, [f"{e.json_path}: {e.message}" for e in errors])
