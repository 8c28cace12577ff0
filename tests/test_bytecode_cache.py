"""The nox sessions keep bytecode (``noxfile.keep_bytecode``) even where
``PYTHONDONTWRITEBYTECODE`` is set, under ``.nox/pycache``, never in the tree, and an
environment's bytecode goes with the environment (``noxfile._discard_venv``)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import noxfile  # noqa: E402


def test_the_sessions_write_bytecode_under_the_nox_folder() -> None:
    env = {"PYTHONDONTWRITEBYTECODE": "1", "PATH": "/bin"}
    noxfile.keep_bytecode(env)
    assert env == {"PATH": "/bin", "PYTHONPYCACHEPREFIX": str(ROOT / ".nox" / "pycache")}
    mine = {"PYTHONPYCACHEPREFIX": "/somewhere/else"}
    noxfile.keep_bytecode(mine)
    assert mine == {"PYTHONPYCACHEPREFIX": "/somewhere/else"}


def test_a_second_process_reads_the_first_ones_bytecode(tmp_path: Path) -> None:
    """With the environment keep_bytecode makes, an import writes its ``.pyc`` under the
    prefix (mirroring the source's path) and nothing beside the source; a later process
    finds it and compiles nothing."""
    src = tmp_path / "tree"
    src.mkdir()
    (src / "some_module.py").write_text("VALUE = 42\n", encoding="utf-8")
    env = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": str(tmp_path / "pyc")}
    noxfile.keep_bytecode(env)
    assert "PYTHONDONTWRITEBYTECODE" not in env
    script = (
        "import importlib.util as u, sys; sys.path.insert(0, sys.argv[1]); "
        "spec = u.find_spec('some_module'); import some_module; "
        "print(u.cache_from_source(spec.origin))"
    )
    run = [sys.executable, "-c", script, str(src)]
    first = subprocess.run(run, env=env, capture_output=True, text=True, check=True)
    cached = Path(first.stdout.strip())
    assert cached.is_file(), cached
    assert (tmp_path / "pyc") in cached.parents
    assert not (src / "__pycache__").exists()
    stamp = cached.stat().st_mtime_ns
    subprocess.run(run, env=env, capture_output=True, text=True, check=True)
    assert cached.stat().st_mtime_ns == stamp  # read, not written again


def test_a_discarded_environment_takes_its_bytecode_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(tmp_path / "pyc"))
    monkeypatch.delenv(noxfile.KEEP_VENVS, raising=False)
    venv = ROOT / ".nox" / f"test-discard-{uuid.uuid4().hex}"
    mirror = tmp_path / "pyc" / venv.relative_to(venv.anchor) / "lib"
    other = tmp_path / "pyc" / "elsewhere"
    try:
        (venv / "lib").mkdir(parents=True)
        mirror.mkdir(parents=True)
        other.mkdir(parents=True)
        noxfile._discard_venv(SimpleNamespace(virtualenv=SimpleNamespace(location=str(venv))))
        assert not venv.exists()
        assert not mirror.parent.exists()
        assert other.is_dir()  # another environment's bytecode stays
    finally:
        if venv.exists():
            shutil.rmtree(venv)
