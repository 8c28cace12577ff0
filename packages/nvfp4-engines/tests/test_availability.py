"""Every adapter is cheap to import and construct (no engine imported), and says what to
install when its engine is missing. Needs no engine installed."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
from nvfp4_engines import ADAPTERS, _libggml, gguf_py, mlx_native
from nvfp4_engines import ggml as ggml_adapter

ENGINE_MODULES = ("gguf", "mlx", "mlx.core", "llama_cpp")


def test_factories_import_no_engine() -> None:
    code = (
        "import sys, importlib\n"
        f"for module in {sorted(ADAPTERS.values())!r}:\n"
        "    importlib.import_module(module).backend()\n"
        f"loaded = [m for m in {ENGINE_MODULES!r} if m in sys.modules]\n"
        "assert not loaded, f'engines imported by the factories: {loaded}'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_entry_points_name_the_adapters() -> None:
    from importlib.metadata import entry_points

    found = {ep.name: ep.value for ep in entry_points(group="nvfp4.backends")}
    for name, module in ADAPTERS.items():
        assert found.get(name) == f"{module}:backend"
        assert importlib.import_module(module).backend().info.name == name


def test_adapters_are_never_chosen_automatically() -> None:
    for module in ADAPTERS.values():
        assert importlib.import_module(module).backend().info.priority < 0


def test_gguf_py_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gguf_py, "dist_version", lambda _: "")
    a = gguf_py.GgufPyKernels().availability()
    assert not a.ok
    assert "pip install 'gguf>=0.18'" in a.reason


def test_mlx_native_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mlx_native, "dist_version", lambda _: "")
    mlx_native._probe.cache_clear()
    try:
        a = mlx_native.MlxNativeKernels().availability()
    finally:
        mlx_native._probe.cache_clear()
    assert not a.ok
    assert "mlx[cpu]>=0.30" in a.reason


def test_ggml_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "llama_cpp" else real(n, *a)
    )
    _libggml.load.cache_clear()
    try:
        a = ggml_adapter.GgmlKernels().availability()
    finally:
        _libggml.load.cache_clear()
    assert not a.ok
    assert "llama-cpp-python>=0.3.36" in a.reason
