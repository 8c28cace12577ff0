"""Shared set-up for the nvfp4-metal tests.

* ``backend``: the ``metal`` backend as users get it (``nvfp4.get_backend("metal")``); the
  tests need MLX and fail (they do not skip) when it cannot run here.
* ``exports``: tiny Llama and Qwen3-MoE checkpoints exported by NVIDIA ModelOpt itself
  (nvfp4-checkpoints' ``tests/make_modelopt_exports.py``, built once per session).
* As in nvfp4-core, ``NVFP4_REQUIRE_ORACLES=1`` (set by CI) turns any skip into a failure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from nvfp4.testing import pytest_configure, pytest_sessionfinish  # noqa: F401 - the oracle rule
from nvfp4.testing.modules import module_from_file

_EXPORTS_SCRIPT = (
    Path(__file__).resolve().parents[2] / "nvfp4-checkpoints" / "tests" / "make_modelopt_exports.py"
)


@pytest.fixture(scope="session")
def backend() -> Any:
    import nvfp4

    b = nvfp4.get_backend("metal")
    avail = b.availability()
    assert avail.ok, f"the metal backend cannot run here: {avail.reason}"
    return b


@pytest.fixture(autouse=True)
def _native_impl(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts from the default implementation, whatever the caller's shell set."""
    monkeypatch.delenv("NVFP4_METAL_IMPL", raising=False)
    monkeypatch.delenv("NVFP4_METAL_W4A4", raising=False)


def _exports_module() -> Any:
    if not _EXPORTS_SCRIPT.is_file():
        pytest.skip(f"nvfp4-checkpoints' export script is not in this tree ({_EXPORTS_SCRIPT})")
    return module_from_file(_EXPORTS_SCRIPT, "make_modelopt_exports")


@pytest.fixture(scope="session")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``{"llama": dir, "moe": dir}``: real ModelOpt NVFP4 exports (skips without modelopt)."""
    pytest.importorskip("modelopt.torch.quantization")
    pytest.importorskip("transformers")
    pytest.importorskip("mlx_lm")
    module = _exports_module()
    base = Path(tmp_path_factory.getbasetemp()) / "modelopt_exports"
    built: dict[str, Path] = module.exports(base, ("llama", "moe"))
    return built
