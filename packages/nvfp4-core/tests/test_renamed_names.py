"""The front end's old name, ``Backend``, stays one release as an alias that warns, and every
entry-point factory returns a front end (one meaning per word: backend, kernels, front end)."""

from __future__ import annotations

import importlib

import nvfp4
import pytest
from nvfp4.reference_backend import ReferenceKernels, backend


@pytest.mark.parametrize("module", ["nvfp4", "nvfp4.backend"])
def test_the_old_name_is_the_front_end_and_warns(module: str) -> None:
    mod = importlib.import_module(module)
    with pytest.warns(
        DeprecationWarning, match=rf"{module}\.Backend is renamed {module}\.Frontend"
    ):
        old = mod.Backend
    assert old is nvfp4.Frontend


def test_a_name_that_never_existed_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'Backnd'"):
        nvfp4.Backnd


def test_the_old_name_is_not_exported() -> None:
    assert "Backend" not in nvfp4.__all__
    assert "Frontend" in nvfp4.__all__


def test_the_reference_factory_returns_a_front_end_like_every_backend() -> None:
    made = backend()
    assert isinstance(made, nvfp4.Frontend)
    assert isinstance(made.kernels, ReferenceKernels)
    assert isinstance(nvfp4.get_backend("reference"), nvfp4.Frontend)
