"""Which torch, which Triton and which package index every nox session installs, and why.

One table (:data:`TARGETS`) says, for each kind of machine the sessions run on, where torch
comes from and who provides Triton:

* ``cpu``   - Linux without a GPU (this project's machines, ``ubuntu-latest``): the reference,
  cpu and metal backends, and the Triton backends under ``TRITON_INTERPRET=1``. torch 2.13.0,
  the CPU build where the index offers one (this project's machines carry its wheel on disk;
  a runner points ``NVFP4_TORCH_INDEX_URL`` at PyTorch's CPU wheel index).
* ``cuda``  - Linux with an NVIDIA GPU. torch from PyPI (its Linux wheels are CUDA builds) or
  from ``NVFP4_TORCH_INDEX_URL``; Triton is the release that torch build requires.
* ``rocm``  - Linux with an AMD GPU. torch from PyTorch's ROCm wheel index, which must be
  named in ``NVFP4_TORCH_INDEX_URL`` (it depends on the runner's ROCm release); Triton is the
  ``pytorch-triton-rocm`` that torch build requires, so nothing may require the ``triton``
  distribution (PyPI's ``triton`` is a CUDA build and would overwrite it).
* ``macos`` - macOS on Apple silicon (the metal backend). torch from PyPI; no Triton; MLX
  without the Linux-only ``[cpu]`` extra.

The rule that keeps the pins from contradicting torch: **Triton is never pinned against
torch.** The torch build that will be installed is looked up first (``pip install --dry-run
--no-deps --report``, metadata only); when it requires a Triton distribution, that
requirement is the pin; only when it requires none (a CPU build) is ``triton`` pinned to
:data:`INTERPRETER_TRITON`, the release the interpreter-mode workarounds were checked on.

Environment variables (documented in README and conformance/README.md):

``NVFP4_TORCH_VERSION``    the torch release to install (default :data:`TORCH_VERSION`)
``NVFP4_TORCH_INDEX_URL``  an index to take torch from (``--extra-index-url``); required by
                           the ``rocm`` target
``NVFP4_TARGET``           force a target (``cpu``, ``cuda``, ``rocm``, ``macos``)

The module imports nothing outside the standard library but ``packaging`` (which nox and
pip carry), so the noxfile and the tests of the repository both import it.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

__all__ = [
    "ENV_TARGET",
    "ENV_TORCH_INDEX",
    "ENV_TORCH_VERSION",
    "INTERPRETER_TRITON",
    "TARGETS",
    "TORCH_VERSION",
    "Plan",
    "Target",
    "TargetError",
    "TorchBuild",
    "choose_target",
    "choose_torch",
    "contradictions",
    "driver_evidence",
    "is_cpu_build",
    "lookup_torch",
    "plan",
]

#: The torch release every session pins unless NVFP4_TORCH_VERSION says otherwise: the CPU
#: wheel this project's machines carry on disk.
TORCH_VERSION = "2.13.0"
#: The Triton release pinned where the torch build requires none (the interpreter-mode runs
#: on a CPU build of torch): the interpreter workarounds were checked on it.
INTERPRETER_TRITON = "3.9.0"

#: PyTorch's CPU wheel index: where a ``cpu`` target takes torch when the configured index
#: only offers a CUDA build (PyPI's Linux wheels bring about 3 GB of nvidia libraries).
PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"

ENV_TORCH_VERSION = "NVFP4_TORCH_VERSION"
ENV_TORCH_INDEX = "NVFP4_TORCH_INDEX_URL"
ENV_TARGET = "NVFP4_TARGET"

#: Distributions that install the ``triton`` import package.
TRITON_DISTRIBUTIONS = ("triton", "pytorch-triton-rocm", "pytorch-triton")


class TargetError(Exception):
    """A target that cannot be installed as asked; the message is one line."""


@dataclass(frozen=True)
class Target:
    """One kind of machine the sessions install for."""

    name: str
    #: what it is, for the session's log
    summary: str
    #: ``pip --platform`` tags of its wheels, most specific first (the metadata test)
    pip_platforms: tuple[str, ...]
    #: the environment-marker values of such a machine (the metadata test)
    markers: Mapping[str, str]
    #: where torch comes from when NVFP4_TORCH_INDEX_URL is unset (None: it must be set)
    default_torch_source: str | None
    #: distributions nothing may require on this target, with the reason
    forbidden: Mapping[str, str] = field(default_factory=dict)


_LINUX_X86_64 = {
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
}
_LINUX_TAGS = (
    "manylinux_2_35_x86_64",
    "manylinux_2_34_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "linux_x86_64",
)

TARGETS: dict[str, Target] = {
    "cpu": Target(
        "cpu",
        "Linux without a GPU (reference, cpu, metal on MLX's CPU device; cuda and rocm under "
        "TRITON_INTERPRET=1)",
        _LINUX_TAGS,
        _LINUX_X86_64,
        "the configured index (this project's machines carry the CPU wheel; on a runner set "
        f"{ENV_TORCH_INDEX} to another index, else PyTorch's CPU wheel index when the "
        "configured one only offers a CUDA build)",
    ),
    "cuda": Target(
        "cuda",
        "Linux with an NVIDIA GPU",
        _LINUX_TAGS,
        _LINUX_X86_64,
        "PyPI (its Linux torch wheels are CUDA builds)",
    ),
    "rocm": Target(
        "rocm",
        "Linux with an AMD GPU (ROCm)",
        _LINUX_TAGS,
        _LINUX_X86_64,
        None,
        forbidden={
            "triton": "ROCm's torch brings pytorch-triton-rocm; PyPI's triton is a CUDA "
            "build that would overwrite it"
        },
    ),
    "macos": Target(
        "macos",
        "macOS on Apple silicon (metal)",
        ("macosx_14_0_arm64", "macosx_13_0_arm64", "macosx_12_0_arm64", "macosx_11_0_arm64"),
        {
            "sys_platform": "darwin",
            "platform_system": "Darwin",
            "platform_machine": "arm64",
            "os_name": "posix",
        },
        "PyPI",
    ),
}


#: Files that exist where a GPU driver is loaded, by vendor.
DRIVER_PATHS = {
    "nvidia": ("/dev/nvidiactl", "/proc/driver/nvidia/version"),
    "amd": ("/dev/kfd",),
}


def driver_evidence(vendor: str) -> str:
    """The path that shows a GPU driver of ``vendor`` ("nvidia" or "amd") is loaded here,
    or '' when there is none. A cheap probe: no library is loaded."""
    return next((p for p in DRIVER_PATHS[vendor] if Path(p).exists()), "")


def choose_target(
    hw: str,
    *,
    interpret: bool,
    env: Mapping[str, str] = os.environ,
    system: str | None = None,
) -> Target:
    """The target a session for backend ``hw`` installs on this machine."""
    forced = env.get(ENV_TARGET, "").strip()
    if forced:
        if forced not in TARGETS:
            raise TargetError(f"{ENV_TARGET}={forced!r}: expected one of {sorted(TARGETS)}")
        return TARGETS[forced]
    system = system or platform.system()
    if system == "Darwin":
        return TARGETS["macos"]
    if hw in ("cuda", "rocm") and not interpret:
        return TARGETS[hw]
    return TARGETS["cpu"]


@dataclass(frozen=True)
class TorchBuild:
    """What pip would install for the torch requirement: version, where from, and its
    requirements (the strings of its metadata, markers included)."""

    version: str
    url: str
    requires: tuple[str, ...]

    def requirements_on(self, target: Target) -> list[Requirement]:
        """Its requirements that apply on ``target`` (no extras asked)."""
        return [r for r in map(Requirement, self.requires) if applies(r, target.markers)]


def applies(req: Requirement, markers: Mapping[str, str], extras: Iterable[str] = ()) -> bool:
    """Whether ``req``'s marker holds on a machine with ``markers`` (with ``extras`` asked)."""
    if req.marker is None:
        return True
    env = {"python_version": "3.11", "python_full_version": "3.11.7", **markers}
    asked = [*extras] or [""]
    return any(req.marker.evaluate({**env, "extra": e}) for e in asked)


def torch_requirement(env: Mapping[str, str] = os.environ) -> str:
    version = env.get(ENV_TORCH_VERSION, "").strip() or TORCH_VERSION
    try:
        Version(version)
    except ValueError:
        raise TargetError(
            f"{ENV_TORCH_VERSION}={version!r}: expected a version such as 2.13.0"
        ) from None
    return f"torch=={version}"


def index_args(target: Target, env: Mapping[str, str] = os.environ) -> list[str]:
    """pip arguments that add the torch index of ``target`` (empty: the configured one)."""
    url = env.get(ENV_TORCH_INDEX, "").strip()
    if url:
        return ["--extra-index-url", url]
    if target.default_torch_source is None:
        raise TargetError(
            f"the {target.name} target needs {ENV_TORCH_INDEX}: PyTorch's wheel index for "
            "your ROCm release (see conformance/README.md)"
        )
    return []


def lookup_torch(
    pip: Sequence[str],
    requirement: str,
    extra_args: Sequence[str] = (),
    *,
    target: Target | None = None,
) -> TorchBuild:
    """Ask pip which torch it would install for ``requirement`` (metadata only: nothing is
    installed). With ``target``, as pip would on that platform (``--platform`` tags); the
    caller's pip configuration applies unless ``extra_args`` has ``--isolated``."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        args = [*pip, "install", "--dry-run", "--no-deps", "--quiet", "--report", str(report)]
        if "--isolated" in extra_args:  # a global option: before the command
            args.insert(len(pip), "--isolated")
            extra_args = [a for a in extra_args if a != "--isolated"]
        if target is not None:
            args += ["--target", str(Path(tmp) / "t"), "--only-binary=:all:"]
            args += ["--python-version", "3.11"]
            for tag in target.pip_platforms:
                args += ["--platform", tag]
        else:
            args += ["--ignore-installed"]
        done = subprocess.run(
            [*args, *extra_args, requirement], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            tail = " ".join(done.stderr.split())[-300:]
            raise TargetError(f"pip cannot find {requirement}: {tail}")
        items = json.loads(report.read_text())["install"]
    meta = items[0]["metadata"]
    return TorchBuild(
        version=str(meta["version"]),
        url=str(items[0].get("download_info", {}).get("url", "")),
        requires=tuple(meta.get("requires_dist", []) or ()),
    )


#: Distribution-name prefixes that only a GPU build of torch requires.
_GPU_PREFIXES = ("nvidia-", "cuda-", *TRITON_DISTRIBUTIONS)


def is_cpu_build(torch: TorchBuild, target: Target) -> bool:
    """Whether ``torch`` requires nothing GPU-only on ``target`` (no nvidia or cuda library,
    no Triton): a CPU build, whatever its version label says."""
    return not any(
        canonicalize_name(r.name).startswith(_GPU_PREFIXES) for r in torch.requirements_on(target)
    )


def choose_torch(
    pip: Sequence[str],
    target: Target,
    requirement: str,
    env: Mapping[str, str] = os.environ,
    *,
    lookup: Callable[[Sequence[str], str, Sequence[str]], TorchBuild] | None = None,
) -> tuple[TorchBuild, list[str]]:
    """The torch build a session on ``target`` installs, and the index arguments that take it.

    The configured index first (or ``NVFP4_TORCH_INDEX_URL``, which always wins). On the
    ``cpu`` target, when that offers only a GPU build, PyTorch's CPU wheel index is asked
    too, and its build taken if it is a CPU one: a machine without a GPU gets no nvidia
    package. ``lookup`` replaces :func:`lookup_torch` (tests)."""
    ask = lookup or (lambda p, r, extra: lookup_torch(p, r, extra))
    index = index_args(target, env)
    torch = ask(pip, requirement, index)
    if target.name != "cpu" or index or is_cpu_build(torch, target):
        return torch, index
    cpu_index = ["--extra-index-url", PYTORCH_CPU_INDEX]
    try:
        cpu = ask(pip, requirement, cpu_index)
    except TargetError:
        return torch, index  # unreachable: the GPU build, and the plan's reasons say so
    return (cpu, cpu_index) if is_cpu_build(cpu, target) else (torch, index)


@dataclass(frozen=True)
class Plan:
    """What a session installs: the constraints (one requirement a line), any requirement
    it must add (Triton for an interpreter run on a CPU build of torch), pip arguments for
    the torch index, and why, line by line, for the session's log."""

    target: Target
    torch: TorchBuild
    constraints: tuple[str, ...]
    extra_requirements: tuple[str, ...]
    index_args: tuple[str, ...]
    reasons: tuple[str, ...]

    def constraints_text(self) -> str:
        head = [
            "# Written by nox from .ci/install_targets.py: do not edit.",
            *(f"# {line}" for line in self.reasons),
        ]
        return "\n".join([*head, *self.constraints]) + "\n"


def _source(target: Target, index: Sequence[str]) -> str:
    """Where the plan's torch comes from, in words."""
    if not index:
        return target.default_torch_source or "?"
    if index[-1] == PYTORCH_CPU_INDEX and not os.environ.get(ENV_TORCH_INDEX, "").strip():
        return f"{PYTORCH_CPU_INDEX} (the configured index offers only a CUDA build)"
    return f"{index[-1]} ({ENV_TORCH_INDEX})"


def plan(
    target: Target,
    torch: TorchBuild,
    *,
    requirement: str,
    index: Sequence[str] = (),
    triton_backend: bool = False,
) -> Plan:
    """The installation of ``target`` given the torch build pip will take.

    ``triton_backend``: the session runs a Triton backend (cuda, rocm), so Triton must be
    installed; where torch brings none (a CPU build), the session adds ``triton`` itself."""
    reasons = [
        f"target {target.name}: {target.summary}",
        f"torch {torch.version} ({requirement}) from " + _source(target, index),
    ]
    constraints = [requirement]
    extra: list[str] = []
    brought = [
        r
        for r in torch.requirements_on(target)
        if canonicalize_name(r.name) in TRITON_DISTRIBUTIONS
    ]
    rocm_build = any(canonicalize_name(r.name) == "pytorch-triton-rocm" for r in brought)
    if target.name == "cuda" and (not brought or rocm_build):
        raise TargetError(
            f"the cuda target needs a CUDA build of torch, but pip takes torch {torch.version} "
            f"({torch.url or 'no url'}), which requires no CUDA Triton: set {ENV_TORCH_INDEX} "
            "to a CUDA wheel index, or run on a machine whose index serves one"
        )
    if target.name == "rocm" and not rocm_build:
        raise TargetError(
            f"the rocm target needs a ROCm build of torch, but pip takes torch {torch.version} "
            f"({torch.url or 'no url'}), which does not require pytorch-triton-rocm: check "
            f"{ENV_TORCH_INDEX}"
        )
    if brought:
        names = ", ".join(str(r).split(";")[0].strip() for r in brought)
        reasons.append(f"triton: the one this torch requires ({names}); not pinned by us")
    elif target.markers["platform_system"] == "Linux":
        constraints.append(f"triton=={INTERPRETER_TRITON}")
        reasons.append(
            f"triton: this torch requires none (a CPU build), so triton=={INTERPRETER_TRITON} "
            "(the release the interpreter-mode runs were checked on)"
        )
        if triton_backend:
            extra.append("triton")
    else:
        reasons.append("triton: none on this platform")
    return Plan(target, torch, tuple(constraints), tuple(extra), tuple(index), tuple(reasons))


def contradictions(
    target: Target,
    torch: TorchBuild,
    requirements: Iterable[Requirement],
) -> list[str]:
    """Where ``requirements`` (constraints and the packages' own dependencies, as applied
    on ``target``) contradict ``torch``'s requirements or the target's rules: one line each.

    Two requirements on the same distribution contradict when one pins a version (``==``)
    the other's specifier excludes."""
    found = []
    theirs = {canonicalize_name(r.name): r for r in torch.requirements_on(target)}
    for req in requirements:
        name = canonicalize_name(req.name)
        if name in target.forbidden:
            found.append(
                f"{target.name}: {req} is required, but {target.forbidden[name]} "
                f"(torch {torch.version})"
            )
        other = theirs.get(name)
        if other is None:
            continue
        for a, b in ((req, other), (other, req)):
            for pinned in _pinned_versions(a):
                if not b.specifier.contains(pinned, prereleases=True):
                    found.append(
                        f"{target.name}: {req} contradicts torch {torch.version}'s "
                        f"requirement {str(other).split(';')[0].strip()}"
                    )
                    break
            else:
                continue
            break
    return found


def _pinned_versions(req: Requirement) -> list[str]:
    return [
        s.version for s in req.specifier if s.operator in ("==", "===") and "*" not in s.version
    ]


def _main(argv: list[str]) -> int:
    """``python .ci/install_targets.py HW [--interpret]``: print the plan for backend HW."""
    hw = argv[0] if argv else "cpu"
    interpret = "--interpret" in argv
    try:
        target = choose_target(hw, interpret=interpret)
        requirement = torch_requirement()
        torch, index = choose_torch([sys.executable, "-m", "pip"], target, requirement)
        chosen = plan(target, torch, requirement=requirement, index=index)
    except TargetError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(chosen.constraints_text(), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
