"""Self-tests of the conformance suite.

The suite is run in-process with ``pytester`` against test-only backends (see
``broken_backends.py``), registered exactly like real ones: a ``*.dist-info`` directory
with an ``entry_points.txt`` in the group ``nvfp4.backends``, put on ``sys.path``.

Tests that need the ``parity`` extra or the SmolLM2 wheel import them with
``pytest.importorskip``; with ``NVFP4_REQUIRE_ORACLES=1`` (CI) any skip fails the run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from nvfp4.testing import pytest_configure, pytest_sessionfinish  # noqa: F401 - the oracle rule

pytest_plugins = ["pytester"]


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer Llama (hidden 64, K of every linear a multiple of 32) with every decoder
    linear NVFP4, written as a ModelOpt checkpoint the way T6 writes SmolLM2."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from nvfp4_conformance import smollm2
    from tiny_models import tiny_model

    model = tiny_model("llama", seed=3)
    q = smollm2.quantize_model(model)
    return smollm2.write_nvfp4_checkpoint(q, tmp_path_factory.mktemp("tiny") / "ckpt")
