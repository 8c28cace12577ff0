"""The conformance sessions can install on the machines they exist for.

For every target platform, the test asks PyPI which torch pip would take there (metadata
only, ``pip install --dry-run --no-deps --report`` with ``--platform``), derives the pins
the noxfile would write for it, and checks two ways that nothing contradicts:

* our own reading (:func:`install_targets.contradictions`): a pin or a package dependency
  that excludes the version torch requires, or a distribution forbidden on the target;
* pip's resolver: one ``--dry-run --no-deps`` install, for that platform, of every
  third-party requirement of the session (markers evaluated for the platform) together with
  torch's own requirements on the same distributions, under the session's constraints.

The ROCm target takes torch from PyTorch's ROCm index, which this machine cannot reach:
its check uses the requirement every ROCm build of torch carries (``pytorch-triton-rocm``)
and asserts the rule that matters there: nothing may require PyPI's ``triton``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

import install_targets as t
import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import noxfile  # noqa: E402

PIP = [sys.executable, "-m", "pip"]
PYPI_ONLY = ["--isolated"]  # what a runner sees: PyPI, none of this machine's pip config


def session_requirements(hw: str, target: t.Target, plan: t.Plan) -> list[Requirement]:
    """The third-party requirements ``conformance-<hw>`` installs on ``target``, markers
    evaluated there (in-tree packages come as wheels and are left out)."""
    local = set(noxfile._local_packages())
    found: list[Requirement] = [Requirement(c) for c in plan.constraints]
    deps: list[str] = []
    for d in noxfile.conformance_dirs(hw):
        deps += tomllib.loads((d / "pyproject.toml").read_text())["project"].get("dependencies", [])
    deps += [*noxfile.PARITY]
    if hw in noxfile.TRITON_BACKENDS:
        deps += plan.extra_requirements
    for text in deps:
        req = Requirement(text)
        if req.name in local or not t.applies(req, target.markers):
            continue
        req.marker = None
        found.append(req)
    return found


def pip_resolves(
    target: t.Target, torch: t.TorchBuild, reqs: Iterable[Requirement], extra: list[str]
) -> subprocess.CompletedProcess[str]:
    """pip's resolver over ``reqs`` plus torch's requirements on the same names, for the
    target's platform, metadata only."""
    names = {canonicalize_name(r.name) for r in reqs}
    theirs = [r for r in torch.requirements_on(target) if canonicalize_name(r.name) in names]
    for r in theirs:
        r.marker = None
    pins = [str(r) for r in reqs if t._pinned_versions(r)]
    with tempfile.TemporaryDirectory() as tmp:
        constraints = Path(tmp) / "constraints.txt"
        constraints.write_text("\n".join(pins) + "\n")
        args = [*PIP, *extra, "install", "--dry-run", "--no-deps", "--quiet"]
        args += [
            "--target",
            str(Path(tmp) / "t"),
            "--only-binary=:all:",
            "--python-version",
            "3.11",
        ]
        for tag in target.pip_platforms:
            args += ["--platform", tag]
        args += ["-c", str(constraints), *sorted({str(r) for r in [*reqs, *theirs]})]
        return subprocess.run(args, capture_output=True, text=True, check=False, timeout=600)


def _check(hw: str, target: t.Target, torch: t.TorchBuild, extra: list[str]) -> t.Plan:
    requirement = f"torch=={t.TORCH_VERSION}"
    plan = t.plan(target, torch, requirement=requirement, triton_backend=True)
    reqs = session_requirements(hw, target, plan)
    assert t.contradictions(target, torch, reqs) == []
    done = pip_resolves(target, torch, reqs, extra)
    assert done.returncode == 0, done.stderr[-3000:]
    return plan


@pytest.fixture(scope="module")
def pypi_torch() -> dict[str, t.TorchBuild]:
    """torch as PyPI serves it on each platform (one metadata look-up per platform)."""
    req = f"torch=={t.TORCH_VERSION}"
    return {
        name: t.lookup_torch(PIP, req, PYPI_ONLY, target=t.TARGETS[name])
        for name in ("cuda", "macos")
    }


def test_linux_cuda_runner(pypi_torch: dict[str, t.TorchBuild]) -> None:
    """conformance-cuda on a Linux NVIDIA runner: PyPI's CUDA build, Triton from torch."""
    torch = pypi_torch["cuda"]
    triton = [r for r in torch.requirements_on(t.TARGETS["cuda"]) if r.name == "triton"]
    assert triton, f"torch {torch.version} on Linux requires no triton: {torch.requires}"
    plan = _check("cuda", t.TARGETS["cuda"], torch, PYPI_ONLY)
    assert not any(c.startswith("triton") for c in plan.constraints)
    assert any("the one this torch requires" in r for r in plan.reasons)


def test_linux_cpu_runner_without_a_cpu_index(pypi_torch: dict[str, t.TorchBuild]) -> None:
    """conformance-cpu / -reference / the interpreter runs on ubuntu-latest with PyPI only:
    torch is then PyPI's CUDA build, and the interpreter pin must give way to its Triton."""
    for hw in ("reference", "cpu", "metal", "cuda", "rocm"):
        plan = _check(hw, t.TARGETS["cpu"], pypi_torch["cuda"], PYPI_ONLY)
        assert f"triton=={t.INTERPRETER_TRITON}" not in plan.constraints


def test_macos_runner(pypi_torch: dict[str, t.TorchBuild]) -> None:
    """conformance-metal on macos-14: torch from PyPI, no Triton, plain mlx (no [cpu])."""
    target = t.TARGETS["macos"]
    plan = _check("metal", target, pypi_torch["macos"], PYPI_ONLY)
    reqs = session_requirements("metal", target, plan)
    names = {canonicalize_name(r.name): r for r in reqs}
    assert "triton" not in names
    assert names["mlx"].extras == set()
    assert not any(c.startswith("triton") for c in plan.constraints)


def test_this_machine() -> None:
    """Here (the configured index carries the CPU wheel): torch requires no Triton, so the
    interpreter runs pin the release they were checked on, and it resolves."""
    torch = t.lookup_torch(PIP, f"torch=={t.TORCH_VERSION}")
    if any(r.name == "triton" for r in torch.requirements_on(t.TARGETS["cpu"])):
        pytest.fail(f"this machine's torch {torch.version} is not a CPU build ({torch.url})")
    for hw in ("reference", "cpu", "metal", "cuda", "rocm"):
        plan = _check(hw, t.TARGETS["cpu"], torch, [])
        assert f"triton=={t.INTERPRETER_TRITON}" in plan.constraints
        if hw in noxfile.TRITON_BACKENDS:
            assert plan.extra_requirements == ("triton",)


# The requirement a ROCm build of torch carries on Linux (PyTorch's ROCm index is not
# reachable here; the name is what matters: it installs the `triton` import package).
ROCM_TORCH = t.TorchBuild(
    version=f"{t.TORCH_VERSION}+rocm",
    url="(PyTorch's ROCm index)",
    requires=('pytorch-triton-rocm; platform_system == "Linux"',),
)


def test_linux_rocm_runner() -> None:
    """conformance-rocm on an AMD runner: nothing the session installs requires `triton`."""
    target = t.TARGETS["rocm"]
    plan = t.plan(target, ROCM_TORCH, requirement=f"torch=={t.TORCH_VERSION}")
    reqs = session_requirements("rocm", target, plan)
    assert t.contradictions(target, ROCM_TORCH, reqs) == []
    assert not any(canonicalize_name(r.name) in t.TRITON_DISTRIBUTIONS for r in reqs)
    assert any("pytorch-triton-rocm" in r for r in plan.reasons)


# -------------------------------------------------------------- the check can fail
def test_a_contradicting_triton_pin_is_caught(pypi_torch: dict[str, t.TorchBuild]) -> None:
    """Put the old pin back (triton==3.9.0 on the CUDA runner): both checks fail."""
    target = t.TARGETS["cuda"]
    torch = pypi_torch["cuda"]
    plan = t.plan(target, torch, requirement=f"torch=={t.TORCH_VERSION}")
    reqs = [*session_requirements("cuda", target, plan), Requirement("triton==3.9.0")]
    found = t.contradictions(target, torch, reqs)
    assert len(found) == 1
    assert found[0].startswith(
        "cuda: triton==3.9.0 contradicts torch 2.13.0's requirement triton=="
    )
    done = pip_resolves(target, torch, reqs, PYPI_ONLY)
    assert done.returncode != 0
    assert "triton" in done.stderr


def test_triton_required_on_rocm_is_caught() -> None:
    target = t.TARGETS["rocm"]
    found = t.contradictions(target, ROCM_TORCH, [Requirement("triton>=3.2")])
    assert found
    assert "pytorch-triton-rocm" in found[0]


def test_wrong_torch_builds_are_refused(pypi_torch: dict[str, t.TorchBuild]) -> None:
    cpu_build = t.TorchBuild("2.13.0+cpu", "file:///x.whl", ("filelock",))
    with pytest.raises(t.TargetError, match="the cuda target needs a CUDA build of torch"):
        t.plan(t.TARGETS["cuda"], cpu_build, requirement="torch==2.13.0")
    with pytest.raises(t.TargetError, match="the rocm target needs a ROCm build of torch"):
        t.plan(t.TARGETS["rocm"], pypi_torch["cuda"], requirement="torch==2.13.0")


# ---------------------------------------------------------------- choosing a target
def test_choose_target() -> None:
    assert t.choose_target("cuda", interpret=False, env={}, system="Linux").name == "cuda"
    assert t.choose_target("cuda", interpret=True, env={}, system="Linux").name == "cpu"
    assert t.choose_target("rocm", interpret=False, env={}, system="Linux").name == "rocm"
    assert t.choose_target("cpu", interpret=False, env={}, system="Linux").name == "cpu"
    assert t.choose_target("metal", interpret=False, env={}, system="Darwin").name == "macos"
    forced = {t.ENV_TARGET: "cuda"}
    assert t.choose_target("cpu", interpret=True, env=forced, system="Linux").name == "cuda"
    with pytest.raises(t.TargetError, match="NVFP4_TARGET='gpu': expected one of"):
        t.choose_target("cpu", interpret=True, env={t.ENV_TARGET: "gpu"})


def test_environment_overrides() -> None:
    assert t.torch_requirement({}) == f"torch=={t.TORCH_VERSION}"
    assert t.torch_requirement({t.ENV_TORCH_VERSION: " 2.14.1 "}) == "torch==2.14.1"
    assert t.torch_requirement({t.ENV_TORCH_VERSION: ""}) == f"torch=={t.TORCH_VERSION}"
    with pytest.raises(t.TargetError, match="expected a version"):
        t.torch_requirement({t.ENV_TORCH_VERSION: "latest"})
    url = "https://example.invalid/whl/rocm"
    assert t.index_args(t.TARGETS["rocm"], {t.ENV_TORCH_INDEX: url}) == ["--extra-index-url", url]
    assert t.index_args(t.TARGETS["cpu"], {}) == []
    with pytest.raises(t.TargetError, match="the rocm target needs NVFP4_TORCH_INDEX_URL"):
        t.index_args(t.TARGETS["rocm"], {})


def test_driver_probe_matches_core() -> None:
    """The noxfile's probe (it runs before anything is installed) and core's are one table."""
    from nvfp4.hardware import DRIVER_PATHS

    assert t.DRIVER_PATHS == DRIVER_PATHS


def test_no_static_constraints_file_pins_triton() -> None:
    """Triton is pinned only from the torch build (install_targets); no file may pin it."""
    for path in (ROOT / ".ci").rglob("*.txt"):
        for line in path.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                assert canonicalize_name(Requirement(line).name) not in t.TRITON_DISTRIBUTIONS


def _fake_lookup(builds: dict[str, t.TorchBuild | None]):
    """A ``lookup`` for :func:`install_targets.choose_torch`: the build each index serves
    (key: the index URL, '' for the configured one; None: unreachable)."""

    def lookup(pip, requirement, extra):
        build = builds[extra[-1] if extra else ""]
        if build is None:
            raise t.TargetError("pip cannot find torch: unreachable")
        return build

    return lookup


CUDA_TORCH = t.TorchBuild(
    version=t.TORCH_VERSION,
    url="(PyPI)",
    requires=(
        'nvidia-cublas==13.1.1.3; platform_system == "Linux"',
        'triton==3.8.0; platform_system == "Linux"',
    ),
)
CPU_TORCH = t.TorchBuild(
    version=f"{t.TORCH_VERSION}+cpu", url="(CPU index)", requires=("filelock",)
)


def test_a_cpu_machine_takes_pytorchs_cpu_index_over_a_cuda_build() -> None:
    """The cpu target: where the configured index offers only a CUDA build, the CPU index's
    build is taken; where that index is unreachable, or the configured index already serves a
    CPU build, or NVFP4_TORCH_INDEX_URL is set, or the target is a GPU one, nothing changes."""
    cpu, cuda = t.TARGETS["cpu"], t.TARGETS["cuda"]
    req = f"torch=={t.TORCH_VERSION}"
    lookup = _fake_lookup({"": CUDA_TORCH, t.PYTORCH_CPU_INDEX: CPU_TORCH})
    torch, index = t.choose_torch(PIP, cpu, req, {}, lookup=lookup)
    assert torch == CPU_TORCH
    assert index == ["--extra-index-url", t.PYTORCH_CPU_INDEX]
    plan = t.plan(cpu, torch, requirement=req, index=index)
    assert any("offers only a CUDA build" in r for r in plan.reasons)
    assert f"triton=={t.INTERPRETER_TRITON}" in plan.constraints

    unreachable = _fake_lookup({"": CUDA_TORCH, t.PYTORCH_CPU_INDEX: None})
    assert t.choose_torch(PIP, cpu, req, {}, lookup=unreachable) == (CUDA_TORCH, [])
    served = _fake_lookup({"": CPU_TORCH, t.PYTORCH_CPU_INDEX: None})
    assert t.choose_torch(PIP, cpu, req, {}, lookup=served) == (CPU_TORCH, [])
    mine = "https://example.invalid/whl/mine"
    chosen = _fake_lookup({mine: CUDA_TORCH, t.PYTORCH_CPU_INDEX: CPU_TORCH})
    env = {t.ENV_TORCH_INDEX: mine}
    assert t.choose_torch(PIP, cpu, req, env, lookup=chosen) == (
        CUDA_TORCH,
        ["--extra-index-url", mine],
    )
    assert t.choose_torch(PIP, cuda, req, {}, lookup=lookup) == (CUDA_TORCH, [])


def test_gpu_and_cpu_builds_are_told_apart(pypi_torch: dict[str, t.TorchBuild]) -> None:
    """PyPI's Linux torch is a GPU build; this machine's configured one is a CPU build."""
    assert not t.is_cpu_build(pypi_torch["cuda"], t.TARGETS["cpu"])
    here = t.lookup_torch(PIP, f"torch=={t.TORCH_VERSION}")
    assert t.is_cpu_build(here, t.TARGETS["cpu"]), here


def test_the_parity_extra_installs_no_nvidia_package_on_a_cpu_machine() -> None:
    """What pip resolves for the suite's ``parity`` extra (torch, transformers, the T6 model's
    loader) with the torch a cpu session chooses: a CPU build of torch, and no nvidia, cuda or
    Triton distribution in the whole set (PyPI's default torch brings about 3 GB of them)."""
    target = t.TARGETS["cpu"]
    req = t.torch_requirement()
    torch, index = t.choose_torch(PIP, target, req)
    chosen = t.plan(target, torch, requirement=req, index=index)
    local = noxfile._local_packages()
    suite = noxfile.SUITE
    deps = [str(d) for d in noxfile._local_deps(suite)]
    with tempfile.TemporaryDirectory() as tmp:
        constraints = Path(tmp) / "constraints.txt"
        constraints.write_text(chosen.constraints_text())
        report = Path(tmp) / "report.json"
        args = [*PIP, "install", "--dry-run", "--ignore-installed", "--quiet"]
        args += ["--report", str(report), "-c", str(constraints), *chosen.index_args]
        done = subprocess.run(
            [*args, *deps, f"{suite}[parity]"], capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr[-2000:]
        items = json.loads(report.read_text())["install"]
    names = {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"] for i in items}
    assert "nvfp4-torch" in names
    assert "transformers" in names
    assert "nvfp4-checkpoints" in names
    assert set(local) >= {n for n in names if n.startswith("nvfp4")}
    gpu = sorted(n for n in names if n.startswith(("nvidia-", "cuda-", "triton", "pytorch-triton")))
    assert not gpu, f"the parity extra pulls GPU packages on a CPU machine: {gpu}"
    assert names["torch"] == torch.version
