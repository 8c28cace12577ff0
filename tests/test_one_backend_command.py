"""README's one-command install of a backend is the command the build session runs (a fresh
environment, then a product on it), so the two cannot drift apart."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import noxfile  # noqa: E402


def test_readme_shows_the_command_the_build_session_runs() -> None:
    command = " ".join(noxfile.ONE_BACKEND_COMMAND)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"\n{command}\n" in readme
    # every path it names is a package of the tree, the backend's dependency first
    paths = [a for a in noxfile.ONE_BACKEND_COMMAND if a.startswith("./")]
    assert [p.split("/")[-1] for p in paths] == ["nvfp4-core", "nvfp4-cpu"]
    assert all((ROOT / p / "pyproject.toml").is_file() for p in paths)


def test_the_command_is_on_the_first_screen() -> None:
    """A newcomer sees it without scrolling: within README's first 30 lines."""
    command = " ".join(noxfile.ONE_BACKEND_COMMAND)
    head = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()[:30]
    assert command in head, f"README's first 30 lines do not show {command!r}"
