"""One function names dtypes in core: :func:`nvfp4.dtypes.dtype_name`."""

from __future__ import annotations

import ast
from pathlib import Path

import ml_dtypes
import numpy as np
import nvfp4
import pytest
from nvfp4 import frontend, reference, tolerances
from nvfp4.dtypes import dtype_name


def test_dtype_name_is_defined_once_in_core() -> None:
    src = Path(nvfp4.__file__).resolve().parent
    defined = sorted(
        str(path.relative_to(src))
        for path in src.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef) and node.name == "dtype_name"
    )
    assert defined == ["dtypes.py"]
    assert frontend.dtype_name is reference.dtype_name is tolerances.dtype_name is dtype_name


def test_dtype_name_of_every_kind_of_dtype() -> None:
    assert dtype_name("bfloat16") == "bfloat16"
    assert dtype_name(np.float16) == "float16"
    assert dtype_name(np.dtype(np.int8)) == "int8"
    assert dtype_name(ml_dtypes.bfloat16) == "bfloat16"
    assert dtype_name(np.dtype("float64")) == "float64"
    torch = pytest.importorskip("torch")
    assert dtype_name(torch.bfloat16) == "bfloat16"


def test_lookups_and_verbs_name_dtypes_alike() -> None:
    assert tolerances.tolerance("qmm", ml_dtypes.bfloat16) == tolerances.tolerance(
        "qmm", "bfloat16"
    )
    with pytest.raises(KeyError, match="no entry 'int8'"):
        tolerances.tolerance("qmm", np.int8)
    with pytest.raises(ValueError, match="output dtype"):
        frontend.decode_dtype(np.float64)
