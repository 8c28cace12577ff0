"""The runner workflows (GitHub Actions, GitLab CI) validate against their schemas and run
every conformance session there is, each on the right runner, keeping reports/ and failing
on a non-certified result."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import noxfile  # noqa: E402

GITHUB = ROOT / ".github" / "workflows" / "conformance.yml"
GITLAB = ROOT / "docs" / "ci" / "gitlab-ci.yml"
#: The tests: the quick gate on every push, the full run nightly and on release tags.
GITHUB_TESTS = ROOT / ".github" / "workflows" / "tests.yml"
SCHEMAS = {
    GITHUB: "vendor.github-workflows",
    GITLAB: "vendor.gitlab-ci",
    GITHUB_TESTS: "vendor.github-workflows",
}
BACKENDS = list(noxfile.HARDWARE)
RUNNERS = {  # backend -> a label its runner must carry
    "reference": "ubuntu-latest",
    "cpu": "ubuntu-latest",
    "metal": "macos-14",
    "cuda": "nvidia-gpu",
    "rocm": "amd-gpu",
}


def _validate(path: Path, schema: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", schema, str(path)],
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize(
    "path", [GITHUB, GITLAB, GITHUB_TESTS], ids=["github", "gitlab", "github-tests"]
)
def test_schema(path: Path) -> None:
    done = _validate(path, SCHEMAS[path])
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    "path", [GITHUB, GITLAB, GITHUB_TESTS], ids=["github", "gitlab", "github-tests"]
)
def test_schema_catches_a_mistake(path: Path, tmp_path: Path) -> None:
    """The lint is real: a misspelt key fails it."""
    text = path.read_text()
    bad = (
        text.replace("runs-on:", "runs_on:", 1)
        if path in (GITHUB, GITHUB_TESTS)
        else text.replace("  tags:", "  tag:", 1)
    )
    assert bad != text
    copy = tmp_path / path.name
    copy.write_text(bad)
    assert _validate(copy, SCHEMAS[path]).returncode != 0


def _github() -> dict[str, Any]:
    return dict(yaml.safe_load(GITHUB.read_text()))


def test_github_matrix_covers_every_backend_on_its_runner() -> None:
    job = _github()["jobs"]["conformance"]
    rows = {row["backend"]: row for row in job["strategy"]["matrix"]["include"]}
    assert sorted(rows) == sorted(BACKENDS)
    for backend, row in rows.items():
        assert RUNNERS[backend] in row["runs-on"], (backend, row["runs-on"])
    assert "self-hosted" in rows["cuda"]["runs-on"]
    assert "self-hosted" in rows["rocm"]["runs-on"]
    assert job["strategy"]["fail-fast"] is False
    assert job["env"][noxfile.REQUIRE_CERTIFIED] == "1"
    assert job["env"]["NVFP4_TORCH_INDEX_URL"] == "${{ matrix.torch-index }}"
    assert "NVFP4_ROCM_TORCH_INDEX_URL" in rows["rocm"]["torch-index"]


def test_github_steps_run_the_session_and_keep_reports() -> None:
    steps = _github()["jobs"]["conformance"]["steps"]
    runs = [s.get("run", "") for s in steps]
    assert "python -m nox -s conformance-${{ matrix.backend }}" in runs
    upload = next(s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact"))
    assert upload["if"] == "always()"
    assert upload["with"]["path"] == "reports/"


def test_gitlab_jobs_cover_every_backend() -> None:
    doc = yaml.safe_load(GITLAB.read_text())
    base = doc[".conformance"]
    assert base["variables"][noxfile.REQUIRE_CERTIFIED] == "1"
    assert 'python3 -m nox -s "conformance-${BACKEND}"' in base["script"]
    assert base["artifacts"]["when"] == "always"
    assert base["artifacts"]["paths"] == ["reports/"]
    jobs = {k: v for k, v in doc.items() if k.startswith("conformance-")}
    assert sorted(jobs) == sorted(f"conformance-{b}" for b in BACKENDS)
    for backend in BACKENDS:
        job = jobs[f"conformance-{backend}"]
        assert job["variables"]["BACKEND"] == backend
        if backend in ("metal", "cuda", "rocm"):
            label = {"metal": "saas-macos-medium-m1", "cuda": "nvidia-gpu", "rocm": "amd-gpu"}
            assert label[backend] in job["tags"]


def test_sessions_named_by_the_workflows_exist() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "nox", "-l", "-f", str(ROOT / "noxfile.py")],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    for backend in BACKENDS:
        assert f"conformance-{backend}" in done.stdout


def _nox_sessions(command: str) -> list[str]:
    """The sessions after ``nox -s`` in a command line."""
    words = command.split()
    return words[words.index("-s") + 1 :]


def test_the_gate_and_the_full_run_are_readmes_and_ci_s() -> None:
    """README's test command (the quick gate) is what ``.ci/run`` and the workflow's gate
    step run; the full run is the same sessions plus ``cpu-aarch64`` and ``torch-floors``, with
    ``NVFP4_FULL_RUN=1``, on the schedule, release tags and by hand."""
    readme = (ROOT / "README.md").read_text()
    (gate,) = [
        line
        for line in readme.splitlines()
        if line.startswith("python3 -m pip install nox uv && python3 -m nox -s tests")
    ]
    assert gate in (ROOT / ".ci" / "run").read_text().splitlines()
    workflow = yaml.safe_load(GITHUB_TESTS.read_text())
    steps = {s.get("name"): s for s in workflow["jobs"]["tests"]["steps"]}
    quick = steps["The quick gate (README's test command)"]
    full = steps["The full run"]
    assert _nox_sessions(quick["run"]) == _nox_sessions(gate)
    assert _nox_sessions(full["run"]) == [*_nox_sessions(gate), "cpu-aarch64", "torch-floors"]
    assert quick["if"] == f"env.{noxfile.FULL_RUN} != '1'"
    assert full["if"] == f"env.{noxfile.FULL_RUN} == '1'"
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads the key `on` as True
    assert {"push", "pull_request", "schedule", "workflow_dispatch"} <= set(triggers)
    switch = workflow["jobs"]["tests"]["env"][noxfile.FULL_RUN]
    for event in ("schedule", "workflow_dispatch", "refs/tags/"):
        assert event in switch
    # README names both and says which is which
    assert (
        f"{noxfile.FULL_RUN}=1 python3 -m nox -s {' '.join(_nox_sessions(full['run']))}" in readme
    )
    assert "quick gate" in readme
    assert "full run" in readme


def test_the_tests_job_keeps_tritons_compile_cache() -> None:
    """The compile checks of nvfp4-cuda and nvfp4-rocm are served by Triton's cache, which
    the job restores (from a run with the same kernels, else the newest) and saves."""
    steps = yaml.safe_load(GITHUB_TESTS.read_text())["jobs"]["tests"]["steps"]
    names = [s.get("name") for s in steps]
    cache = steps[names.index("Triton's compile cache")]
    assert cache["uses"].startswith("actions/cache@")
    assert cache["with"]["path"] == "~/.triton/cache"
    assert "hashFiles('packages/nvfp4-triton/src/**')" in cache["with"]["key"]
    assert cache["with"]["key"].startswith(cache["with"]["restore-keys"])
    assert names.index("Triton's compile cache") < names.index(
        "The quick gate (README's test command)"
    )


def test_the_fuzz_is_sized_by_the_kind_of_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NVFP4_FUZZ_EXAMPLES", raising=False)
    monkeypatch.delenv(noxfile.FULL_RUN, raising=False)
    assert noxfile._fuzz_examples() == {"NVFP4_FUZZ_EXAMPLES": noxfile.FUZZ_EXAMPLES["quick"]}
    monkeypatch.setenv(noxfile.FULL_RUN, "1")
    assert noxfile._fuzz_examples() == {"NVFP4_FUZZ_EXAMPLES": noxfile.FUZZ_EXAMPLES["full"]}
    monkeypatch.setenv("NVFP4_FUZZ_EXAMPLES", "10000")  # a deep run's own size wins
    assert noxfile._fuzz_examples() == {}
    monkeypatch.setenv(noxfile.FULL_RUN, "yes")
    with pytest.raises(SystemExit, match="NVFP4_FULL_RUN='yes'"):
        noxfile._full_run()


def test_the_full_run_certifies_every_cpu_engine_within_the_budget() -> None:
    """Every engine with no GPU requirement has a job in the full run (and none in the
    gate), whose timeout is noxfile's ENGINE_BUDGET_MINUTES, the budget README states."""
    job = yaml.safe_load(GITHUB_TESTS.read_text())["jobs"]["engines"]
    cpu_engines = [e for e in noxfile.ENGINE_PINS if e not in noxfile.GPU_ENGINES]
    assert sorted(job["strategy"]["matrix"]["engine"]) == sorted(cpu_engines)
    for event in ("schedule", "workflow_dispatch", "refs/tags/"):
        assert event in job["if"]
    assert "push" not in job["if"]
    assert job["timeout-minutes"] == noxfile.ENGINE_BUDGET_MINUTES
    (run,) = [s["run"] for s in job["steps"] if "nox" in s.get("run", "") and "engines" in s["run"]]
    assert "engines(engine='${{ matrix.engine }}')" in run
    readme = " ".join((ROOT / "README.md").read_text().split())  # lines joined
    assert f"within {noxfile.ENGINE_BUDGET_MINUTES} minutes an engine" in readme


def test_the_gate_s_main_job_runs_t7_greedy_parity_for_named_backends_only() -> None:
    assert set(noxfile.GATE_T7_GREEDY) <= set(noxfile.HARDWARE)
    assert "cpu" in noxfile.GATE_T7_GREEDY  # the native CPU backend is always certified at TP
    readme = " ".join((ROOT / "README.md").read_text().split())  # lines joined
    assert "greedy parity at TP2 and TP3 for the cpu backend" in readme
