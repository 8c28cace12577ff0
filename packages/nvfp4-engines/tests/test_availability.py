"""Every adapter is cheap to import and construct (no engine imported), and says what to
install when its engine is missing. Needs no engine installed."""

from __future__ import annotations

import contextlib
import importlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import weight
from nvfp4_engines import (
    ADAPTERS,
    GPU_ONLY,
    _common,
    _cuda,
    _libggml,
    compressed_tensors,
    gguf_py,
    mlx_native,
    modelopt,
    torchao,
)
from nvfp4_engines import ggml as ggml_adapter

ENGINE_MODULES = (
    "gguf",
    "mlx",
    "mlx.core",
    "llama_cpp",
    "torch",
    "modelopt",
    "compressed_tensors",
    "torchao",
    "flashinfer",
    "vllm",
    "transformer_engine",
)
#: GPU-only adapter -> what its reason names to install.
GPU_INSTALL = {
    "flashinfer": "pip install 'flashinfer-python>=0.7.2'",
    "vllm": "pip install 'vllm>=0.33'",
    "transformer-engine": "pip install 'transformer-engine[pytorch]>=2.20'",
}


@contextlib.contextmanager
def answered_afresh(cached) -> Iterator[None]:
    """The ``functools.lru_cache`` function ``cached`` (a probe, ggml's loader) cleared
    before the block, so it answers under the test's conditions, and after it, so no other
    test sees that answer."""
    cached.cache_clear()
    try:
        yield
    finally:
        cached.cache_clear()


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
    assert "pip install 'gguf>=0.19'" in a.reason


@pytest.mark.parametrize(
    "case", ["no libggml installed", "not a folder", "no cpu library", "not ELF"]
)
def test_ggml_unavailable_says_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, case: str
) -> None:
    real = importlib.util.find_spec
    monkeypatch.delenv(_libggml.LIB_DIR_ENV, raising=False)
    if case == "no libggml installed":
        gone = ("libggml", "llama_cpp")
        monkeypatch.setattr(
            importlib.util, "find_spec", lambda n, *a: None if n in gone else real(n, *a)
        )
        want = (
            "neither libggml-python nor llama-cpp-python is installed: pip install 'libggml-python"
        )
    elif case == "not a folder":
        monkeypatch.setenv(_libggml.LIB_DIR_ENV, str(tmp_path / "absent"))
        want = f"{_libggml.LIB_DIR_ENV}={tmp_path / 'absent'}: not a folder"
    else:  # a source-build folder holding libggml-base.so and a broken or no libggml-cpu.so
        (tmp_path / "libggml-base.so").write_bytes(b"")
        if case == "not ELF":
            (tmp_path / "libggml-cpu.so").write_bytes(b"not an ELF file")
        monkeypatch.setenv(_libggml.LIB_DIR_ENV, str(tmp_path))
        want = "libggml does not load" if case == "not ELF" else "libggml-cpu not found under"
    with answered_afresh(_libggml.load):
        a = ggml_adapter.GgmlKernels().availability()
    assert not a.ok
    assert want in a.reason


@pytest.mark.parametrize("case", ["plain build", "variant absent"])
def test_ggml_variant_refused_says_which(tmp_path: Path, case: str) -> None:
    """A CPU variant asked for that the folder does not hold is refused before anything is
    opened, naming the file looked for and the variants found."""
    (tmp_path / "libggml-base.so").write_bytes(b"")
    if case == "plain build":
        (tmp_path / "libggml-cpu.so").write_bytes(b"")
        found = "none, not a backend-DL build"
    else:
        (tmp_path / "libggml-cpu-zen4.so").write_bytes(b"")
        (tmp_path / "libggml-cpu-x64.so").write_bytes(b"")
        found = "x64, zen4"
    with answered_afresh(_libggml.load), pytest.raises(_libggml.GgmlUnavailable) as info:
        _libggml.load(str(tmp_path), "haswell")
    assert f"{tmp_path}: no libggml-cpu-haswell.so (CPU variants found: {found})" in str(info.value)


def test_ggml_variants_found_by_name(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    for name in ("libggml-cpu-haswell.so", "libggml-cpu-zen4.so", "libggml-cpu.so"):
        (tmp_path / "bin" / name).write_bytes(b"")
    found = _libggml._variants(tmp_path)
    assert sorted(found) == ["haswell", "zen4"]
    assert found["haswell"].endswith("bin/libggml-cpu-haswell.so")


@pytest.mark.parametrize(
    ("module", "install"),
    [
        (mlx_native, "mlx[cpu]>=0.30"),
        (modelopt, "nvidia-modelopt>=0.47"),
        (compressed_tensors, "compressed-tensors>=0.20"),
        (torchao, "torchao>=0.18"),
    ],
)
def test_cpu_engine_missing(monkeypatch: pytest.MonkeyPatch, module, install: str) -> None:
    monkeypatch.setattr(_common, "dist_version", lambda _: "")
    with answered_afresh(module._probe):
        a = module.backend().availability()
    assert not a.ok
    assert f"pip install '{install}'" in a.reason


def test_gpu_only_adapters_say_needs_cuda_on_this_machine() -> None:
    assert sorted(GPU_ONLY) == sorted(GPU_INSTALL)
    assert _cuda.cuda_device() == "", "this test is for machines without a CUDA device"
    for name in GPU_ONLY:
        b = importlib.import_module(ADAPTERS[name]).backend()
        a = b.availability()
        assert not a.ok
        assert a.reason.startswith("needs CUDA: "), a.reason
        assert GPU_INSTALL[name] in a.reason or "is installed" in a.reason, a.reason
        with pytest.raises(RuntimeError, match=rf"{name!r} cannot run here: needs CUDA"):
            b.prepare(weight(4, 64, 0))


@pytest.mark.parametrize("installed", ["", "1.0"])
def test_gpu_only_reason_names_what_to_install(
    monkeypatch: pytest.MonkeyPatch, installed: str
) -> None:
    monkeypatch.setattr(_cuda, "cuda_device", lambda: "")
    monkeypatch.setattr(_cuda, "dist_version", lambda _: installed)
    for name, install in GPU_INSTALL.items():
        module = importlib.import_module(ADAPTERS[name])
        a = module.backend().availability()
        assert not a.ok
        assert a.reason.startswith("needs CUDA: ")
        expected = f"{module.DISTRIBUTION} 1.0 is installed" if installed else install
        assert a.reason.endswith(expected), a.reason
