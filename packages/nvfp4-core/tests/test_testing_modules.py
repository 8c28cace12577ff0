"""``nvfp4.testing.module_from_file``: a script imported from its path for a test."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from nvfp4.testing import module_from_file


def test_a_script_is_run_once_under_the_given_name(tmp_path: Path) -> None:
    script = tmp_path / "tool.py"
    script.write_text("RUNS = []\nRUNS.append(__name__)\n", encoding="utf-8")
    module = module_from_file(script, "nvfp4_test_tool")
    assert module.RUNS == ["nvfp4_test_tool"]
    assert module.__file__ == str(script)
    assert "nvfp4_test_tool" not in sys.modules


def test_a_file_that_is_not_python_is_an_import_error_naming_it(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("not python", encoding="utf-8")
    with pytest.raises(ImportError, match=r"notes\.txt: cannot be loaded as the Python module"):
        module_from_file(notes, "notes")
