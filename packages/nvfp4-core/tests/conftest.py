"""Shared test set-up for nvfp4-core.

Oracle libraries (nvidia-modelopt, gguf, mlx, compressed-tensors) are imported with
``pytest.importorskip`` so the tests can run on a bare machine. In CI the nox session
installs every oracle and sets ``NVFP4_REQUIRE_ORACLES=1``: there any skipped test fails
the run, so no cross-check passes by skipping. The one exception is a test marked
``optional_oracle`` (an oracle the issue itself calls optional, such as llama-cpp-python,
whose source build takes about 18 minutes): its skip is reported, not fatal.

The fixture generator is a maintainer's tool of the repository (``tools/``), not part of the
package: its folder is put on ``sys.path`` for the tests that regenerate the fixtures.
"""

from __future__ import annotations

import sys
from pathlib import Path

from nvfp4.testing import pytest_configure, pytest_sessionfinish  # noqa: F401 - the oracle rule

pytest_plugins = ["pytester"]

#: The repository's maintainer tools (``tools/generate_fixtures.py``).
TOOLS = Path(__file__).resolve().parents[3] / "tools"
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))
