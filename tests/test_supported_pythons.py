"""The Python versions the packages declare, and the check that runs the torch-free wheels on
each (``.ci/pythons.py``, run by ``nox -s build``)."""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from pathlib import Path

import pytest
import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / ".ci"))
import pythons  # noqa: E402

PYPROJECTS = [*sorted(ROOT.glob("packages/*/pyproject.toml")), ROOT / "conformance/pyproject.toml"]
VERSION_CLASSIFIER = re.compile(r"Programming Language :: Python :: (3\.\d+)")
#: Requirements no torch-free distribution may pull in (torch and what needs it).
TORCH_STACK = {"torch", "triton", "transformers", "accelerate", "nvidia-modelopt", "torchao"}


def _project(path: Path) -> dict[str, object]:
    return dict(tomllib.loads(path.read_text(encoding="utf-8"))["project"])


def _requirement_name(text: str) -> str:
    return re.split(r"[\s\[<>=!~;]", text.strip(), maxsplit=1)[0].lower()


@pytest.mark.parametrize("path", PYPROJECTS, ids=lambda p: p.parent.name)
def test_each_package_declares_the_versions_it_is_tested_on(path: Path) -> None:
    project = _project(path)
    assert project["requires-python"] == f">={pythons.SUPPORTED[0]}", path
    classifiers = [str(c) for c in project["classifiers"]]  # type: ignore[attr-defined]
    named = tuple(m.group(1) for c in classifiers if (m := VERSION_CLASSIFIER.fullmatch(c)))
    expected = pythons.SUPPORTED if project["name"] in pythons.TORCH_FREE else (pythons.SESSIONS,)
    assert named == expected, f"{path}: classifiers name {named}, expected {expected}"


def test_the_torch_free_distributions_need_no_torch() -> None:
    by_name = {str(_project(p)["name"]): _project(p) for p in PYPROJECTS}
    assert set(pythons.TORCH_FREE) <= set(by_name)
    for name in pythons.TORCH_FREE:
        deps = {_requirement_name(r) for r in by_name[name]["dependencies"]}  # type: ignore[attr-defined]
        assert not deps & TORCH_STACK, f"{name} depends on {sorted(deps & TORCH_STACK)}"
        local = deps & set(by_name)
        assert local <= set(pythons.TORCH_FREE), f"{name} needs {sorted(local)} from the tree"


def test_the_supported_versions_are_ordered_and_include_the_sessions_own() -> None:
    as_tuples = [tuple(int(n) for n in v.split(".")) for v in pythons.SUPPORTED]
    assert as_tuples == sorted(as_tuples)
    assert pythons.SESSIONS in pythons.SUPPORTED
    assert pythons.SESSIONS not in pythons.others()
    assert len(pythons.others()) == len(pythons.SUPPORTED) - 1


def test_the_github_gate_sets_up_every_supported_python() -> None:
    workflow = yaml.safe_load((ROOT / ".github/workflows/tests.yml").read_text(encoding="utf-8"))
    steps = workflow["jobs"]["tests"]["steps"]
    setup = [s for s in steps if str(s.get("uses", "")).startswith("actions/setup-python")]
    assert len(setup) == 1
    listed = str(setup[0]["with"]["python-version"]).split()
    assert sorted(listed) == sorted(pythons.SUPPORTED)
    # setup-python makes the last one listed the default `python`: the sessions' own
    assert listed[-1] == pythons.SESSIONS


def _executable(path: Path, text: str = "#!/bin/sh\nexit 0\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_candidates_are_path_first_then_pyenv_newest_patch_first(tmp_path: Path) -> None:
    on_path = _executable(tmp_path / "bin" / "python3.12")
    _executable(tmp_path / "bin" / "python3.13")  # another version: not a candidate
    (tmp_path / "bin" / "python3.12x").write_text("")  # not this name
    pyenv = tmp_path / "pyenv"
    for patch in ("3.12.1", "3.12.10", "3.12.0rc1", "3.1.5"):
        _executable(pyenv / "versions" / patch / "bin" / f"python{patch[:4].rstrip('.')}")
    env = {"PATH": str(tmp_path / "bin"), "PYENV_ROOT": str(pyenv)}
    assert pythons.candidates("3.12", env) == [
        str(on_path),
        str(pyenv / "versions/3.12.10/bin/python3.12"),
        str(pyenv / "versions/3.12.1/bin/python3.12"),
    ]
    assert pythons.candidates("3.11", env) == []
    with pytest.raises(ValueError, match=r"expected a version like 3\.12, found '3\.12\.1'"):
        pythons.candidates("3.12.1", env)


def test_candidates_skip_a_file_that_is_not_executable(tmp_path: Path) -> None:
    plain = tmp_path / "bin" / "python3.12"
    plain.parent.mkdir()
    plain.write_text("")
    env = {"PATH": str(plain.parent), "HOME": str(tmp_path / "home")}
    assert pythons.candidates("3.12", env) == []


def test_find_takes_the_first_candidate_that_reports_the_version(tmp_path: Path) -> None:
    shim = _executable(tmp_path / "shims" / "python3.12")
    real = _executable(tmp_path / "pyenv" / "versions" / "3.12.4" / "bin" / "python3.12")
    env = {"PATH": str(shim.parent), "PYENV_ROOT": str(tmp_path / "pyenv")}
    asked: list[str] = []

    def probe(python: str, version: str) -> bool:
        asked.append(python)
        return python == str(real) and version == "3.12"

    assert pythons.find("3.12", None, env, probe) == str(real)
    assert asked == [str(shim), str(real)]
    assert pythons.find("3.12", None, env, lambda p, v: False) is None


def test_reports_runs_the_interpreter(tmp_path: Path) -> None:
    own = "{}.{}".format(*sys.version_info[:2])
    assert pythons.reports(sys.executable, own)
    assert not pythons.reports(sys.executable, "3.9")
    # a pyenv shim of a version that is not selected: exits 127
    shim = _executable(
        tmp_path / "python3.12", "#!/bin/sh\necho 'pyenv: not found' >&2\nexit 127\n"
    )
    assert not pythons.reports(str(shim), "3.12")
    assert not pythons.reports(str(tmp_path / "missing"), "3.12")


def _certificate(path: Path, python: str, summary: dict[str, int]) -> Path:
    cert = {"platform": {"versions": {"python": python}}, "summary": summary}
    path.write_text(json.dumps(cert))
    return path


def test_certificate_problem(tmp_path: Path) -> None:
    good = _certificate(tmp_path / "good.json", "3.12.1", {"passed": 332})
    assert pythons.certificate_problem(good, "3.12") is None
    other = _certificate(tmp_path / "other.json", "3.11.7", {"passed": 332})
    assert "expected 3.12.x, found '3.11.7'" in str(pythons.certificate_problem(other, "3.12"))
    failed = _certificate(tmp_path / "failed.json", "3.12.1", {"passed": 330, "failed": 2})
    assert "expected passed tests only" in str(pythons.certificate_problem(failed, "3.12"))
    empty = _certificate(tmp_path / "empty.json", "3.12.1", {})
    assert "expected passed tests only" in str(pythons.certificate_problem(empty, "3.12"))
    missing = pythons.certificate_problem(tmp_path / "none.json", "3.12")
    assert "no readable certificate (FileNotFoundError" in str(missing)
    (tmp_path / "bad.json").write_text("{")
    assert "JSONDecodeError" in str(pythons.certificate_problem(tmp_path / "bad.json", "3.12"))


def _steps(tmp_path: Path, version: str, floors: Path | None = None) -> list[list[str]]:
    """:func:`pythons.checks` for an interpreter at ``/opt/python<version>``."""
    return pythons.checks(
        f"/opt/python{version}",
        version,
        uv="uv",
        root=ROOT,
        dist=tmp_path / "dist",
        constraints=tmp_path / "c.txt",
        work=tmp_path / version,
        floors=floors,
    )


def test_checks_install_the_built_wheels_and_run_the_suite_and_the_cli(tmp_path: Path) -> None:
    work = tmp_path / "3.12"
    steps = _steps(tmp_path, "3.12")
    venv_bin = str(work / "venv" / "bin")
    venv = str(work / "venv")
    assert steps[0] == ["uv", "venv", "-q", "--clear", "--python", "/opt/python3.12", venv]
    install = steps[1]
    assert install[:3] == ["uv", "pip", "install"]
    assert ["--find-links", str(tmp_path / "dist")] == install[install.index("--find-links") :][:2]
    wanted = {"nvfp4-core", "nvfp4-cpu[test]", "nvfp4-checkpoints[gguf]", "nvfp4-conformance"}
    assert wanted <= set(install)
    assert install.count("-c") == 1  # no floors asked for: the newest releases
    assert not any(pythons._AT_FLOORS in step for step in steps)
    # uv keeps a find-links wheel by folder, name and version: a rebuilt dist/ must be read
    refreshed = {install[i + 1] for i, a in enumerate(install) if a == "--refresh-package"}
    assert refreshed == set(pythons.TORCH_FREE)
    # every later step runs the new environment's programs, never the session's own
    for step in steps[2:]:
        program = step[2] if step[0] == "env" else step[0]
        assert program == "mkdir" or program.startswith(venv_bin + os.sep), step
    text = [" ".join(s) for s in steps]
    assert any("NVFP4_REQUIRE_ORACLES=1" in t and "packages/nvfp4-cpu/tests" in t for t in text)
    certify = next(s for s in steps if "nvfp4_conformance" in s)
    assert certify[certify.index("--nvfp4-tiers") + 1] == "T0,T1,T2,T3,T4,T5"
    assert str(work / "conformance-cpu-python3.12.json") in certify
    verbs = [s[1] for s in steps if s[0] == f"{venv_bin}{os.sep}nvfp4"]
    assert verbs.count("convert") == verbs.count("verify") == 3
    assert "shard" in verbs
    assert "example-checkpoint" in verbs


def test_checks_at_the_floors_add_their_constraints_and_check_them(tmp_path: Path) -> None:
    floors = tmp_path / "floors.txt"
    steps = _steps(tmp_path, "3.10", floors)
    install = steps[1]
    constraint_files = [install[i + 1] for i, a in enumerate(install) if a == "-c"]
    assert constraint_files == [str(tmp_path / "c.txt"), str(floors)]
    at_floors = [s for s in steps if pythons._AT_FLOORS in s]
    assert at_floors == [
        [str(tmp_path / "3.10/venv/bin/python"), "-c", pythons._AT_FLOORS, str(floors)]
    ]
    assert steps.index(at_floors[0]) < min(i for i, s in enumerate(steps) if "pytest" in s)


def _pyproject(folder: Path, name: str, deps: list[str], extras: dict[str, list[str]]) -> Path:
    folder.mkdir()
    path = folder / "pyproject.toml"
    lines = [f"[project]\nname = {json.dumps(name)}\ndependencies = {json.dumps(deps)}\n"]
    lines.append("[project.optional-dependencies]\n")
    lines += [f"{k} = {json.dumps(v)}\n" for k, v in extras.items()]
    path.write_text("".join(lines))
    return path


def test_floors_take_each_requirements_highest_lower_bound(tmp_path: Path) -> None:
    paths = [
        _pyproject(
            tmp_path / "core",
            "nvfp4-core",
            ["numpy>=1.26", "ml_dtypes>=0.5", "tomli>=1.1; python_version < '3.11'"],
            {"test": ["torch>=2.4"]},  # an extra the check does not install
        ),
        _pyproject(
            tmp_path / "cpu", "nvfp4-cpu", ["nvfp4-core", "numpy>=1.20"], {"test": ["Pytest>=8"]}
        ),
        _pyproject(
            tmp_path / "ck",
            "nvfp4-checkpoints",
            ["nvfp4-core", "safetensors>=0.4,<1", "NumPy>=1.27.1"],
            {"gguf": ["gguf>=0.19"], "tokenizer": ["transformers>=4.46"]},
        ),
        _pyproject(tmp_path / "suite", "nvfp4-conformance", ["hypothesis", "jsonschema>=4.18"], {}),
    ]
    assert pythons.floors(paths, "3.10") == {
        "gguf": "0.19",
        "jsonschema": "4.18",
        "ml-dtypes": "0.5",
        "numpy": "1.27.1",  # the highest bound wins, whatever the spelling of the name
        "pytest": "8",
        "safetensors": "0.4",
        "tomli": "1.1",
    }
    assert "tomli" not in pythons.floors(paths, "3.12")  # its marker excludes 3.12
    assert pythons.constraints_text({"numpy": "1.26", "pytest": "8"}) == "numpy==1.26\npytest==8\n"


def test_the_repository_s_floors_are_the_ones_the_code_needs() -> None:
    """The floors found wrong when they were first run: ml_dtypes 0.4 has no
    float8_e8m0fnu (nvfp4.safetensors_format reads it), gguf before 0.19 no NVFP4 type."""
    pins = pythons.floors(PYPROJECTS, pythons.SUPPORTED[0])
    assert pins["ml-dtypes"] == "0.5"
    assert pins["gguf"] == "0.19"
    assert pins["numpy"] == "1.26"


def test_the_floor_check_compares_installed_versions(tmp_path: Path) -> None:
    import importlib.metadata
    import subprocess

    have = importlib.metadata.version("pytest")
    padded = tmp_path / "same.txt"
    padded.write_text(f"pytest=={have}.0\n")  # 8.1 and 8.1.0 are one version
    script = [sys.executable, "-c", pythons._AT_FLOORS]
    assert subprocess.run([*script, str(padded)], check=False).returncode == 0
    other = tmp_path / "other.txt"
    other.write_text(f"pytest=={have}\nnumpy==1.0\n")
    done = subprocess.run([*script, str(other)], capture_output=True, text=True, check=False)
    assert done.returncode == 1
    assert "not at the declared floors: numpy" in done.stderr
    assert "(floor 1.0)" in done.stderr
    assert "pytest" not in done.stderr


def test_the_torch_stack_floors_are_nvfp4_torch_s_models_extra_less_what_is_skipped() -> None:
    pins = pythons.floors(
        PYPROJECTS,
        pythons.SESSIONS,
        names=("nvfp4-torch",),
        extras={"nvfp4-torch": ("models",)},
        skip=pythons.TORCH_FLOORS_SKIP,
    )
    assert set(pins) == {"transformers", "accelerate", "gguf", "safetensors"}
    # transformers 5.17 rebuilds an NVFP4 GGUF's tokenizer wrongly; 5.18 needs safetensors 0.8
    assert pins["transformers"] == "5.18"
    assert pins["safetensors"] == "0.8"
