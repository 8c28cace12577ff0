"""Shared test set-up for nvfp4-checkpoints.

Oracle libraries (nvidia-modelopt, gguf, mlx, compressed-tensors, safetensors' torch front
end) are imported with ``pytest.importorskip`` so the tests can run on a bare machine. In CI
the nox session installs every oracle and sets ``NVFP4_REQUIRE_ORACLES=1``: there any
skipped test fails the run, so no cross-check passes by skipping. The one exception is a
test marked ``optional_oracle`` (an oracle the issue itself calls optional, such as
llama-cpp-python, whose source build takes about 18 minutes): its skip is reported, not
fatal.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from make_modelopt_exports import session_exports
from nvfp4.testing import pytest_configure, pytest_sessionfinish  # noqa: F401 - the oracle rule


@pytest.fixture(scope="session")
def modelopt_exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The real ModelOpt exports (``make_modelopt_exports.py``), built once a session."""
    return session_exports(tmp_path_factory)
