"""``python -m nvfp4_conformance``: its help is plain text (no reStructuredText markup on a
terminal) and says what the exit status means; ``generate`` forwards to nvfp4-torch."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nvfp4_conformance", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_help_is_plain_text_and_says_what_0_means() -> None:
    proc = _cli("--help")
    assert proc.returncode == 0, proc.stderr
    assert "``" not in proc.stdout
    assert ":func:" not in proc.stdout
    text = " ".join(proc.stdout.split())  # argparse keeps the docstring's line breaks
    assert "0 when every selected test passed" in text
    assert "partial when tiers were left out" in text


def test_generate_forwards_to_nvfp4_torch_with_a_warning() -> None:
    pytest.importorskip("nvfp4_torch")
    proc = _cli("generate", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "python -m nvfp4_conformance generate is deprecated" in proc.stderr
    assert "--checkpoint" in proc.stdout
    assert "--prompt-ids" in proc.stdout
