"""The Python versions the packages declare, where to find each one on a machine, and what
``nox -s build`` runs on each of them.

Every package says ``requires-python = ">=3.10"`` and names 3.10 to 3.13 in its classifiers
(:data:`SUPPORTED`; ``tests/test_supported_pythons.py`` holds each pyproject to it). The
sessions run on 3.11, the version whose torch CPU wheel this project's machines carry; no
other torch build can be had here without downloading a CUDA one of several GB. So on each
other version ``build`` installs the wheels it has just built of the distributions that need
no torch (:data:`TORCH_FREE`) and runs there (:func:`checks`):

* nvfp4-cpu's own tests against the installed wheel, every oracle required;
* the conformance suite on the cpu backend, tiers T0-T5 (T6 and T7 need torch);
* the ``nvfp4`` command: the tiny example checkpoint converted to every other flavour, each
  verified bit for bit against it, inspected, and cut for two tensor-parallel ranks.

The oldest version runs them with every third-party requirement at the floor the pyprojects
declare (:func:`floors`: numpy 1.26, ml_dtypes 0.5, gguf 0.19, ...), the others with the
newest releases, as the sessions do.

An interpreter of each version is looked for on ``PATH`` (``python3.12``), then among pyenv's
versions, then among those uv manages (:func:`find`); where there is none, ``uv python
install`` fetches one (python-build-standalone), so a fresh machine with network needs no
more set-up than README's command.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

#: Every Python minor version the packages declare, oldest first (the oldest is
#: ``requires-python``'s bound).
SUPPORTED: tuple[str, ...] = ("3.10", "3.11", "3.12", "3.13")
#: The version the sessions themselves run on (torch's CPU wheel on this project's machines).
SESSIONS = "3.11"
#: The distributions installed and run on the other versions: those that need no torch.
TORCH_FREE: tuple[str, ...] = (
    "nvfp4-core",
    "nvfp4-cpu",
    "nvfp4-checkpoints",
    "nvfp4-conformance",
)
#: The extras installed with them: nvfp4-cpu's tests, GGUF for the ``nvfp4`` round trip.
EXTRAS: dict[str, tuple[str, ...]] = {"nvfp4-cpu": ("test",), "nvfp4-checkpoints": ("gguf",)}
#: The model stack's floors (nvfp4-torch's ``models`` extra: transformers, accelerate, gguf,
#: safetensors) are run by ``nox -s torch-floors`` in the full run, on the sessions' Python;
#: torch stays at the pinned CPU build (no older one can be had here), numpy and ml_dtypes
#: at the newest (their floors run on the oldest Python, above).
TORCH_FLOORS_SKIP: tuple[str, ...] = ("torch", "numpy", "ml-dtypes")
#: The conformance tiers run there (T6 and T7 run a model through torch).
TIERS = "T0,T1,T2,T3,T4,T5"
#: Turns a skipped test into a failure (``nvfp4.testing.REQUIRE_ORACLES_ENV``).
REQUIRE_ORACLES = "NVFP4_REQUIRE_ORACLES"

_VERSION = re.compile(r"3\.\d+")
#: Run in the environment at the floors, with the constraints file: fails unless every
#: pinned distribution is installed at its pin (``8`` and ``8.0.0`` are one version).
_AT_FLOORS = """\
import importlib.metadata as md, sys
def key(v):
    parts = [int(p) for p in v.split(".")]
    while parts and parts[-1] == 0:
        parts.pop()
    return parts
bad = []
for line in open(sys.argv[1], encoding="utf-8"):
    name, want = line.strip().split("==")
    got = md.version(name)
    if key(got) != key(want):
        bad.append(f"{name} {got} (floor {want})")
sys.exit("not at the declared floors: " + ", ".join(bad) if bad else 0)
"""
_PROBE = "import sys; print('%d.%d' % sys.version_info[:2])"


def others() -> tuple[str, ...]:
    """The declared versions other than the sessions' own."""
    return tuple(v for v in SUPPORTED if v != SESSIONS)


def reports(python: str, version: str) -> bool:
    """Whether ``python`` runs and is Python ``version`` (a pyenv shim of a version that is
    not selected exits with an error)."""
    try:
        out = subprocess.run(
            [python, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and out.stdout.strip() == version


def _patch(path: Path, version: str) -> tuple[int, ...]:
    """The patch number of a pyenv folder ``3.12.1`` (-1 where it is not plain digits)."""
    rest = path.name.removeprefix(f"{version}.")
    return (int(rest),) if rest.isdigit() else (-1,)


def candidates(version: str, environ: Mapping[str, str] = os.environ) -> list[str]:
    """Where an interpreter of ``version`` may be, best first: ``python<version>`` on
    ``PATH``, then pyenv's ``versions/<version>.<patch>`` folders, newest patch first."""
    if not _VERSION.fullmatch(version):
        raise ValueError(f"expected a version like 3.12, found {version!r}")
    found = []
    for folder in environ.get("PATH", "").split(os.pathsep):
        exe = Path(folder or ".") / f"python{version}"
        if exe.is_file() and os.access(exe, os.X_OK):
            found.append(str(exe))
    root = Path(environ.get("PYENV_ROOT") or Path(environ.get("HOME", "~")).expanduser() / ".pyenv")
    folders = [p for p in (root / "versions").glob(f"{version}.*") if _patch(p, version) >= (0,)]
    for folder in sorted(folders, key=lambda p: _patch(p, version), reverse=True):
        exe = folder / "bin" / f"python{version}"
        if exe.is_file():
            found.append(str(exe))
    return found


def find(
    version: str,
    uv: str | None,
    environ: Mapping[str, str] = os.environ,
    probe: Callable[[str, str], bool] = reports,
) -> str | None:
    """An interpreter of ``version`` on this machine (:func:`candidates`, then one uv
    manages), or None."""
    for python in candidates(version, environ):
        if probe(python, version):
            return python
    if uv:
        out = subprocess.run(
            [uv, "python", "find", "--no-python-downloads", version],
            capture_output=True,
            text=True,
            check=False,
        )
        path = out.stdout.strip()
        if out.returncode == 0 and path and probe(path, version):
            return path
    return None


def checks(
    python: str,
    version: str,
    *,
    uv: str,
    root: Path,
    dist: Path,
    constraints: Path,
    work: Path,
    floors: Path | None = None,
) -> list[list[str]]:
    """The commands, one after another, that install :data:`TORCH_FREE` from ``dist`` for
    ``python`` (of ``version``) in ``work/venv`` (every third-party requirement at its
    declared floor where ``floors`` names :func:`floors`' file) and run the checks of the
    module docstring; the conformance certificate is written to ``work``."""
    venv = work / "venv"
    py = str(venv / "bin" / "python")
    nvfp4 = str(venv / "bin" / "nvfp4")
    ck = work / "checkpoints"
    tiny = ck / "tiny"
    wheels = [
        f"{name}[{','.join(EXTRAS[name])}]" if name in EXTRAS else name for name in TORCH_FREE
    ]
    install = [uv, "pip", "install", "-q", "--python", py, "-c", str(constraints)]
    install += refresh_args(TORCH_FREE)
    if floors is not None:
        install += ["-c", str(floors)]
    cpu_tests = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    certify = [py, "-m", "nvfp4_conformance", "run", "--backend", "cpu", "--certificate"]
    certificate = str(work / f"conformance-cpu-python{version}.json")
    commands = [
        [uv, "venv", "-q", "--clear", "--python", python, str(venv)],
        [*install, "--find-links", str(dist), *wheels],
        [py, "-c", f"import sys; assert sys.version.startswith('{version}.'), sys.version"],
        *([[py, "-c", _AT_FLOORS, str(floors)]] if floors is not None else []),
        ["env", f"{REQUIRE_ORACLES}=1", *cpu_tests, str(root / "packages" / "nvfp4-cpu" / "tests")],
        [*certify, certificate, "--", "--nvfp4-tiers", TIERS, "-p", "no:cacheprovider"],
        ["mkdir", "-p", str(ck)],
        [nvfp4, "example-checkpoint", str(tiny)],
    ]
    for flavour, dst in (
        ("compressed-tensors", ck / "ct"),
        ("mlx", ck / "mlx"),
        ("gguf", ck / "tiny.gguf"),
    ):
        commands += [
            [nvfp4, "convert", str(tiny), str(dst), "--to", flavour],
            [nvfp4, "verify", str(tiny), str(dst)],
            [nvfp4, "inspect", str(dst)],
        ]
    commands.append([nvfp4, "shard", str(tiny), str(ck / "tp2"), "--tp", "2"])
    return commands


def certificate_problem(path: Path, version: str) -> str | None:
    """What is wrong with the certificate a :func:`checks` run wrote for ``version``, or
    None: it must exist, name that Python, and count passed tests and nothing else."""
    try:
        cert = json.loads(path.read_text(encoding="utf-8"))
        python = str(cert["platform"]["versions"]["python"])
        summary = dict(cert["summary"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{path}: no readable certificate ({type(exc).__name__}: {exc})"
    if not python.startswith(f"{version}."):
        return f"{path}: platform.versions.python: expected {version}.x, found {python!r}"
    if not summary.get("passed") or set(summary) != {"passed"}:
        return f"{path}: summary: expected passed tests only, found {summary}"
    return None


def floors(
    pyprojects: Iterable[Path],
    version: str,
    names: Iterable[str] = TORCH_FREE,
    extras: Mapping[str, Iterable[str]] = EXTRAS,
    skip: Iterable[str] = (),
) -> dict[str, str]:
    """Every third-party requirement of ``names`` and their ``extras`` that applies on Python
    ``version``, at its declared floor: the highest ``>=`` bound any of them gives
    (``numpy>=1.26`` -> ``1.26``), but for the names in ``skip``. A floor is a claim: the
    oldest declared Python installs exactly these and runs the same checks, so a floor
    nobody runs cannot go stale."""
    skipped = {canonicalize_name(n) for n in skip}
    projects = {}
    for path in pyprojects:
        project = tomllib.loads(path.read_text(encoding="utf-8"))["project"]
        projects[str(project["name"])] = project
    environment = {"python_version": version, "python_full_version": f"{version}.0"}
    found: dict[str, Version] = {}
    for name in names:
        project = projects[name]
        texts = list(project.get("dependencies", []))
        for extra in extras.get(name, ()):
            texts += project["optional-dependencies"][extra]
        for text in texts:
            req = Requirement(text)
            if req.name in projects or canonicalize_name(req.name) in skipped:
                continue
            if req.marker and not req.marker.evaluate(environment):
                continue
            for spec in req.specifier:
                if spec.operator == ">=":
                    bound = Version(spec.version)
                    key = canonicalize_name(req.name)
                    found[key] = max(found.get(key, bound), bound)
    return {name: str(bound) for name, bound in sorted(found.items())}


def constraints_text(pins: Mapping[str, str]) -> str:
    """``pins`` as a constraints file (``name==version`` lines)."""
    return "".join(f"{name}=={v}\n" for name, v in pins.items())


def refresh_args(names: Iterable[str]) -> list[str]:
    """uv's arguments that make it read ``names`` from ``--find-links`` again: uv keeps a
    wheel it found there by folder, name and version, so a rebuilt ``dist/`` (same version,
    new code) would otherwise install the copy it cached the last time."""
    return [arg for name in names for arg in ("--refresh-package", name)]
