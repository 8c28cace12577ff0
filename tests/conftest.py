"""Tests of the repository itself (install targets, CI workflows): run by
``nox -s "package-tests(package='repository')"``. They need PyPI's metadata (no GPU, no large download)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / ".ci"))
