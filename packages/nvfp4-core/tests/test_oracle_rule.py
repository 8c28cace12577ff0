"""The oracle rule of :mod:`nvfp4.testing`, which every suite's conftest takes: with
``NVFP4_REQUIRE_ORACLES=1`` a skip fails the session (unless marked ``optional_oracle``)."""

from __future__ import annotations

import pytest

_CONFTEST = "from nvfp4.testing import pytest_configure, pytest_sessionfinish  # noqa: F401\n"
_TESTS = """
import pytest

def test_runs():
    assert True

def test_needs_a_missing_oracle():
    pytest.importorskip("no_such_oracle_library")

@pytest.mark.optional_oracle
def test_optional():
    pytest.importorskip("no_such_optional_oracle")
"""


@pytest.mark.parametrize("required", [True, False])
def test_skips_fail_only_when_oracles_are_required(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, required: bool
) -> None:
    monkeypatch.setenv("NVFP4_REQUIRE_ORACLES", "1" if required else "0")
    pytester.makeconftest(_CONFTEST)
    pytester.makepyfile(test_rule=_TESTS)
    result = pytester.runpytest_subprocess("-rs")
    result.assert_outcomes(passed=1, skipped=2)
    if required:
        assert result.ret == pytest.ExitCode.TESTS_FAILED
        result.stdout.fnmatch_lines(
            ["*NVFP4_REQUIRE_ORACLES=1 forbids skips: *test_needs_a_missing_oracle*no_such_oracle*"]
        )
        assert "forbids skips: test_rule.py::test_optional" not in result.stdout.str()
    else:
        assert result.ret == pytest.ExitCode.OK
        assert "forbids skips" not in result.stdout.str()


def _required_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, name: str, tests: str, *args: str
) -> pytest.RunResult:
    """``tests`` as the file ``name``.py, run in a fresh pytest with oracles required."""
    monkeypatch.setenv("NVFP4_REQUIRE_ORACLES", "1")
    pytester.makeconftest(_CONFTEST)
    pytester.makepyfile(**{name: tests})
    return pytester.runpytest_subprocess(*args)


def test_optional_skips_alone_pass(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    tests = """
import pytest

@pytest.mark.optional_oracle
def test_optional():
    pytest.importorskip("no_such_optional_oracle")
"""
    result = _required_run(pytester, monkeypatch, "test_rule", tests, "--strict-markers")
    result.assert_outcomes(skipped=1)
    assert result.ret == pytest.ExitCode.OK


def test_a_module_skipped_while_collected_fails_by_name(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a module-level skip leaves a collection report (no keywords): named, not a crash
    tests = """
import pytest

pytest.importorskip("no_such_module_oracle")

def test_never_collected():
    assert True
"""
    result = _required_run(pytester, monkeypatch, "test_module", tests)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*forbids skips: *test_module.py*no_such_module_oracle*"])
    assert "AttributeError" not in result.stdout.str() + result.stderr.str()
