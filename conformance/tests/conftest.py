"""Self-tests of the conformance suite.

The suite is run in-process with ``pytester`` against test-only backends (see
``broken_backends.py``), registered exactly like real ones: a ``*.dist-info`` directory
with an ``entry_points.txt`` in the group ``nvfp4.backends``, put on ``sys.path``.
:func:`run_tiers` is that in-process run; :func:`run_command` is the command line a user
types (``python -m nvfp4_conformance run``), in a subprocess.

Tests that need the ``parity`` extra or the SmolLM2 wheel import them with
``pytest.importorskip``; with ``NVFP4_REQUIRE_ORACLES=1`` (CI) any skip fails the run.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from nvfp4.testing import pytest_configure, pytest_sessionfinish  # noqa: F401 - the oracle rule

pytest_plugins = ["pytester"]

# pytester's in-process runs put sys.modules back as they found it, dropping every module
# first imported inside them; torch cannot be imported a second time in one process ("module
# functions cannot set METH_CLASS or METH_STATIC"). Imported here, it is in every snapshot,
# whatever order a pytest-xdist worker runs the files in.
with contextlib.suppress(ImportError):  # no parity extra: the tests needing torch skip or fail
    import torch  # noqa: F401


@pytest.fixture
def run_tiers(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., tuple[pytest.RunResult, dict[str, Any]]]:
    """``run_tiers(backend, *pytest_args)``: the shipped tiers
    (``--pyargs nvfp4_conformance.tiers``) run in-process on ``backend``, with neither
    ``NVFP4_BACKEND`` nor ``TRITON_INTERPRET`` set; ``(pytest's result, the certificate)``.
    The certificate is written to ``pytester.path / "cert-<backend>.json"`` (its Markdown
    twin beside it) and is ``{}`` when the run wrote none."""
    monkeypatch.delenv("NVFP4_BACKEND", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)

    def run(backend: str, *pytest_args: str) -> tuple[pytest.RunResult, dict[str, Any]]:
        cert = pytester.path / f"cert-{backend}.json"
        result = pytester.runpytest(
            "--pyargs",
            "nvfp4_conformance.tiers",
            f"--nvfp4-backend={backend}",
            f"--nvfp4-certificate={cert}",
            "-p",
            "no:cacheprovider",
            *pytest_args,
        )
        data = json.loads(cert.read_text(encoding="utf-8")) if cert.exists() else {}
        return result, data

    return run


@pytest.fixture
def run_command(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``run_command(cert, *pytest_args, triton_interpret=False)``: ``python -m
    nvfp4_conformance run --backend reference --certificate CERT -- PYTEST_ARGS`` in a
    subprocess in ``tmp_path``, without ``NVFP4_BACKEND`` (and with ``TRITON_INTERPRET=1``
    when ``triton_interpret``); the finished process, output captured as text."""

    def run(
        cert: Path, *pytest_args: str, triton_interpret: bool = False
    ) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != "NVFP4_BACKEND"}
        if triton_interpret:
            env["TRITON_INTERPRET"] = "1"
        return subprocess.run(
            [
                *(sys.executable, "-m", "nvfp4_conformance", "run", "--backend", "reference"),
                *("--certificate", str(cert), "--", *pytest_args),
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    return run
