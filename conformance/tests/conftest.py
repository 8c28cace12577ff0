"""Self-tests of the conformance suite.

The suite is run in-process with ``pytester`` against test-only backends (see
``broken_backends.py``), registered exactly like real ones: a ``*.dist-info`` directory
with an ``entry_points.txt`` in the group ``nvfp4.backends``, put on ``sys.path``.

Tests that need the ``parity`` extra or the SmolLM2 wheel import them with
``pytest.importorskip``; with ``NVFP4_REQUIRE_ORACLES=1`` (CI) any skip fails the run.
"""

from __future__ import annotations

from nvfp4.testing import pytest_configure, pytest_sessionfinish  # noqa: F401 - the oracle rule

pytest_plugins = ["pytester"]
