"""The pytest plugin that certifies an NVFP4 backend.

Registered as a ``pytest11`` entry point, so it is loaded in every pytest session of an
environment where ``nvfp4-conformance`` is installed; it stays inert until the conformance
tiers (:mod:`nvfp4_conformance.tiers`) are collected or ``--nvfp4-backend`` is given.

Options:

``--nvfp4-backend NAME`` (fallback ``$NVFP4_BACKEND``)
    The backend under test, resolved with :func:`nvfp4.get_backend` - the path users take.
    Missing, unavailable or incompatible is a usage error (exit status 4) that says why:
    certification never silently skips.
``--nvfp4-spec VERSION``
    The spec version to certify; default: the newest one that this suite, nvfp4-core and
    the backend all implement.
``--nvfp4-certificate PATH``
    Write the certificate to ``PATH`` (JSON) and its Markdown twin next to it (``.md``).

Markers:

``requires_capability(name)``
    The test is skipped when the backend does not declare ``name`` (a
    :data:`nvfp4.backend.CAPABILITIES` key); the certificate lists the capability as "not
    certified". Every other skip (or xfail) of a conformance test fails the run.
``min_spec(version)``
    The test applies from that spec version on.

Fixtures: ``nvfp4_backend`` (the backend object), ``nvfp4_spec_version``,
``nvfp4_tolerance`` - ``nvfp4_tolerance(path, dtype)``, the number of the spec version being
certified (every tier asks it, never the newest version's default) - and ``nvfp4_record`` -
``nvfp4_record(case_id, **figures)`` stores measured figures (errors, tolerances, counts)
that go into the certificate.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import pytest

from . import SUITE_SPEC_VERSIONS, attribution, emulation, sizing
from .recording import ConformanceRun, TestOutcome, tier_of

__all__ = ["RUN_KEY", "TIERS_DIR", "is_conformance_item", "stable_test_id"]

RUN_KEY = pytest.StashKey[ConformanceRun]()
#: The directory of the shipped tier tests.
TIERS_DIR = Path(__file__).resolve().parent / "tiers"
#: Environment variable naming the backend when ``--nvfp4-backend`` is absent.
BACKEND_ENV = "NVFP4_BACKEND"


# --------------------------------------------------------------------------- options
def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("nvfp4", "NVFP4 conformance")
    group.addoption(
        "--nvfp4-backend",
        dest="nvfp4_backend",
        default=None,
        metavar="NAME",
        help=f"NVFP4 backend to certify (entry-point name; default ${BACKEND_ENV}).",
    )
    group.addoption(
        "--nvfp4-spec",
        dest="nvfp4_spec",
        default=None,
        metavar="VERSION",
        help="NVFP4 spec version to certify (default: newest implemented by suite, core and backend).",
    )
    group.addoption(
        "--nvfp4-tiers",
        dest="nvfp4_tiers",
        default=None,
        metavar="T0,T1,...",
        help="run only these tiers (the certificate is then marked partial).",
    )
    group.addoption(
        "--nvfp4-certificate",
        dest="nvfp4_certificate",
        default=None,
        metavar="PATH",
        help="write the conformance certificate to PATH (JSON) and PATH with .md (Markdown).",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "requires_capability(name): NVFP4 conformance test of a backend capability; skipped "
        "(and reported 'not certified') when the backend does not declare it",
    )
    config.addinivalue_line(
        "markers", "min_spec(version): NVFP4 conformance test that applies from that spec on"
    )
    config.addinivalue_line(
        "markers",
        f"{sizing.MARKER}(case, stand_in): NVFP4 conformance case sized for a GPU; left out "
        "under the Triton interpreter, where its stand-in runs (nvfp4_conformance.sizing)",
    )
    run = ConformanceRun(certificate_path=config.getoption("nvfp4_certificate"))
    config.stash[RUN_KEY] = run
    _COLLECT_RUN["run"] = run
    if config.getoption("nvfp4_backend"):
        _resolve(run, config)


def _run(config: pytest.Config) -> ConformanceRun:
    return config.stash[RUN_KEY]


def _version_key(v: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in v.split("."))
    except ValueError:
        return (-1,)


def _resolve(run: ConformanceRun, config: pytest.Config) -> None:
    """Find the backend and the spec version, or stop the session with a usage error."""
    if run.backend is not None:
        return
    import nvfp4
    from nvfp4.registry import BackendUnavailable, discover

    name = config.getoption("nvfp4_backend") or os.environ.get(BACKEND_ENV) or None
    if not name:
        raise pytest.UsageError(
            "the NVFP4 conformance tiers need a backend: pass --nvfp4-backend NAME or set "
            f"{BACKEND_ENV} (installed backends: {', '.join(sorted(discover())) or 'none'})"
        )
    try:
        backend = nvfp4.get_backend(name)
    except BackendUnavailable as exc:
        raise pytest.UsageError(f"--nvfp4-backend {name}: {exc}") from None
    except Exception as exc:  # a broken plugin: still a usage error that says why
        raise pytest.UsageError(
            f"--nvfp4-backend {name}: get_backend raised {type(exc).__name__}: {exc}"
        ) from None

    backend_specs = tuple(getattr(backend.info, "spec_versions", ()) or ())
    common = set(SUITE_SPEC_VERSIONS) & set(nvfp4.SUPPORTED_SPEC_VERSIONS) & set(backend_specs)
    sides = (
        f"suite {', '.join(SUITE_SPEC_VERSIONS)}; nvfp4-core "
        f"{', '.join(nvfp4.SUPPORTED_SPEC_VERSIONS)}; backend {name!r} "
        f"{', '.join(backend_specs) or 'none'}"
    )
    requested = config.getoption("nvfp4_spec")
    if requested:
        if requested not in common:
            raise pytest.UsageError(
                f"--nvfp4-spec {requested}: not implemented by all of ({sides})"
            )
        spec = requested
    elif common:
        spec = max(common, key=_version_key)
    else:
        raise pytest.UsageError(f"no NVFP4 spec version in common ({sides})")

    run.backend_name = name
    run.backend = backend
    # failures are explained only by the deviations declared for this backend: by the
    # registry's seen_in, or by the backend itself (ids of the registry of the certified
    # version only)
    try:
        attribution.declare_for(name, getattr(backend.info, "deviations", ()) or (), spec)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    run.spec_version = spec
    try:
        avail = backend.availability()
        device = avail.device or "unspecified by the backend"
    except Exception as exc:  # availability() must not raise; say so rather than crash
        device = f"unknown (availability() raised {type(exc).__name__})"
    run.extra["backend_device"] = device
    if sizing.interpreting():
        device = "Triton interpreter on CPU"
    run.extra["emulation"] = emulation.detect()
    under = emulation.describe(run.extra["emulation"])
    if under:  # an emulated CPU is never presented as the machine: "aarch64 under emulation"
        device = f"{under}: {device}"
    run.extra["device"] = device


# ------------------------------------------------------------------------ collection
def is_conformance_item(item: pytest.Item) -> bool:
    """Whether ``item`` is one of the shipped tier tests."""
    path = getattr(item, "path", None)
    if path is None:
        return False
    try:
        Path(path).resolve().relative_to(TIERS_DIR)
    except ValueError:
        return False
    return True


def stable_test_id(item: pytest.Item) -> str:
    """A stable id for a tier test, whatever the rootdir: ``test_t4_matmul.py::test_qmm[...]``."""
    rest = item.nodeid.split("::", 1)[1] if "::" in item.nodeid else item.name
    return f"{Path(str(item.path)).name}::{rest}"


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    conformance = [item for item in items if is_conformance_item(item)]
    if not conformance:
        return
    run = _run(config)
    _resolve(run, config)
    tiers = config.getoption("nvfp4_tiers")
    if tiers:
        wanted = {t.strip().upper() for t in tiers.split(",") if t.strip()}
        unknown = wanted - {f"T{i}" for i in range(8)}
        if unknown:
            raise pytest.UsageError(f"--nvfp4-tiers: unknown tiers {sorted(unknown)} (T0..T7)")
        run.tiers_selected = frozenset(wanted)
    # T7 (sharding, spec 1.2) is collected only for spec >= 1.2 or when named
    from .t7 import t7_applies

    if not t7_applies(run.spec_version, run.tiers_selected):
        t7 = {id(i) for i in conformance if tier_of(stable_test_id(i)) == "T7"}
        items[:] = [i for i in items if id(i) not in t7]
        conformance = [i for i in conformance if id(i) not in t7]
    if tiers:
        dropped = [i for i in conformance if tier_of(stable_test_id(i)) not in wanted]
        if dropped:
            keep = set(map(id, dropped))
            items[:] = [i for i in items if id(i) not in keep]
            config.hook.pytest_deselected(items=dropped)
            conformance = [i for i in conformance if id(i) not in keep]
    if sizing.interpreting():
        # GPU-sized cases: their stand-ins run instead; the certificate says which
        big = [i for i in conformance if i.get_closest_marker(sizing.MARKER)]
        if big:
            keep = set(map(id, big))
            items[:] = [i for i in items if id(i) not in keep]
            config.hook.pytest_deselected(items=big)
            conformance = [i for i in conformance if id(i) not in keep]
    from nvfp4.backend import CAPABILITIES

    declared = run.declared_capabilities
    for item in conformance:
        key = stable_test_id(item)
        outcome = run.outcome(key)
        for cap_marker in item.iter_markers("requires_capability"):
            cap = str(cap_marker.args[0])
            if cap not in CAPABILITIES:
                raise pytest.UsageError(
                    f"{item.nodeid}: requires_capability({cap!r}) is not a capability "
                    f"({', '.join(sorted(CAPABILITIES))})"
                )
            if cap not in outcome.capabilities:
                outcome.capabilities.append(cap)
        missing = [c for c in outcome.capabilities if c not in declared]
        if missing:
            reason = (
                f"capability {', '.join(repr(c) for c in missing)} not declared by backend "
                f"{run.backend_name!r}: not certified"
            )
            run.capability_skips[key] = ", ".join(missing)
            item.add_marker(pytest.mark.skip(reason=reason))
        spec_marker = item.get_closest_marker("min_spec")
        if spec_marker is not None and run.spec_version is not None:
            need = str(spec_marker.args[0])
            if _version_key(run.spec_version) < _version_key(need):
                run.spec_skips[key] = need
                item.add_marker(
                    pytest.mark.skip(
                        reason=f"applies from spec {need}; certifying {run.spec_version}"
                    )
                )


def pytest_deselected(items: list[pytest.Item]) -> None:
    if not items:
        return
    run = items[0].config.stash.get(RUN_KEY, None)
    if run is None:
        return
    for item in items:
        if is_conformance_item(item):
            key = stable_test_id(item)
            run.deselected += 1
            run.outcomes.pop(key, None)
            tier = tier_of(key)
            reason = _left_out_reason(run, tier, item)
            run.left_out[(tier, reason)] = run.left_out.get((tier, reason), 0) + 1


def _left_out_reason(run: ConformanceRun, tier: str, item: pytest.Item) -> str:
    """Why a deselected conformance test ``item`` of ``tier`` did not run, in the
    certificate's words."""
    if run.tiers_selected is None or tier in run.tiers_selected:
        sized = sizing.left_out_reason(item)  # a GPU-sized case under the interpreter
        return sized or "deselected by pytest options (-k, -m or --deselect)"
    reason = f"not selected: --nvfp4-tiers {item.config.getoption('nvfp4_tiers')}"
    if tier == "T6" and sizing.interpreting():
        # the nox sessions leave T6 out under the interpreter; the certificate says why
        reason += (
            " (Triton interpreter on CPU: T6's 160 greedy decode steps of a 135M-parameter"
            " model would take hours; T6 needs the GPU)"
        )
    return reason


def pytest_report_header(config: pytest.Config) -> list[str]:
    run = config.stash.get(RUN_KEY, None)
    if run is None or run.backend is None:
        return []
    info = run.backend.info
    return [
        f"nvfp4 conformance: backend {info.name} {info.version or '(no version)'}, "
        f"spec {run.spec_version}, device: {run.extra.get('device')}",
        f"nvfp4 capabilities declared: {', '.join(sorted(info.capabilities)) or 'none'}",
    ]


# ---------------------------------------------------------------------------- results
def _short_message(call: pytest.CallInfo[Any]) -> str:
    """The failure's own lines (40 at most); an exception group (Hypothesis's "distinct
    failures") with the first line of each error it holds, so none is left out."""
    if call.excinfo is None:
        return ""
    text = call.excinfo.exconly()
    # an exception group (Python 3.11's, or the backport Hypothesis raises on 3.10)
    subs = getattr(call.excinfo.value, "exceptions", None)
    if isinstance(subs, tuple) and all(isinstance(e, BaseException) for e in subs):
        for i, sub in enumerate(subs, 1):
            first = (str(sub).strip().splitlines() or [""])[0]
            text += f"\n  [{i}] {type(sub).__name__}: {first}"
    lines = text.splitlines()
    if len(lines) > 40:
        lines = [*lines[:40], f"... ({len(lines) - 40} more lines)"]
    return "\n".join(lines)


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[Any]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if not is_conformance_item(item):
        return report
    run = _run(item.config)
    key = stable_test_id(item)
    o: TestOutcome = run.outcome(key)
    o.duration_s += float(report.duration)
    o.hypothesis = bool(getattr(getattr(item, "obj", None), "is_hypothesis_test", False))
    if hasattr(report, "wasxfail"):
        o.outcome = "skipped"
        o.skip_kind = "illegal"
        o.message = f"xfail is not allowed in a conformance run: {report.wasxfail}"
    elif report.failed:
        o.outcome = "failed" if report.when == "call" else "error"
        o.message = _short_message(call) or report.longreprtext[-2000:]
    elif report.skipped:
        o.outcome = "skipped"
        o.message = _skip_reason(report)
        if key in run.capability_skips:
            o.skip_kind = "capability"
        elif key in run.spec_skips:
            o.skip_kind = "spec"
        else:
            o.skip_kind = "illegal"
    elif report.when == "call" and o.outcome not in ("failed", "error"):
        o.outcome = "passed"
    return report


def pytest_collectreport(report: pytest.CollectReport) -> None:
    """A tier module that fails to import is a failed test of the certificate."""
    if not report.failed:
        return
    path = Path(str(report.fspath)) if report.fspath else None
    if path is None or not str(path.resolve()).startswith(str(TIERS_DIR)):
        return
    run = _COLLECT_RUN.get("run")
    if run is None:
        return
    o = run.outcome(f"{path.name}::<collection>")
    o.outcome = "error"
    o.message = report.longreprtext[-2000:]


#: The run of the current session, for hooks that get no config (pytest_collectreport).
_COLLECT_RUN: dict[str, ConformanceRun] = {}


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    run = session.config.stash.get(RUN_KEY, None)
    if run is None or run.backend is None:
        return
    if run.illegal_skips() and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    run.exit_status = int(session.exitstatus)
    import time

    run.finished = time.time()
    if run.certificate_path:
        from .certificate import write_certificate

        json_path, md_path = write_certificate(run, run.certificate_path)
        run.extra["written"] = [str(json_path), str(md_path)]


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    run = config.stash.get(RUN_KEY, None)
    if run is None or run.backend is None:
        return
    from .certificate import capability_status

    tr = terminalreporter
    tr.section("NVFP4 conformance")
    tr.write_line(
        f"backend {run.backend_name} ({run.backend.info.version or 'no version'}), spec "
        f"{run.spec_version}, device: {run.extra.get('device')}"
    )
    tiers: dict[str, dict[str, int]] = {}
    for o in run.outcomes.values():
        counts = tiers.setdefault(o.tier, {})
        counts[o.outcome] = counts.get(o.outcome, 0) + 1
    for tier in sorted(tiers):
        counts = tiers[tier]
        tr.write_line(f"  {tier}: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    status = capability_status(run)
    for cap, (state, why) in sorted(status.items()):
        tr.write_line(f"  capability {cap}: {state}" + (f" ({why})" if why else ""))
    for o in run.illegal_skips():
        tr.write_line(
            f"FAILED (skip without a declared missing capability): {o.nodeid}: {o.message}",
            red=True,
        )
    if run.deselected:
        tr.write_line(
            f"  {run.deselected} conformance tests deselected: the certificate is partial"
        )
        for (tier, reason), n in sorted(run.left_out.items()):
            tr.write_line(f"    {tier}: {n} tests left out: {reason}")
    for path in run.extra.get("written", []):
        tr.write_line(f"certificate written: {path}")


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def nvfp4_conformance_run(request: pytest.FixtureRequest) -> ConformanceRun:
    """The run's state (backend, spec version, records)."""
    run = _run(request.config)
    if run.backend is None:
        pytest.fail("no NVFP4 backend under test: pass --nvfp4-backend NAME", pytrace=False)
    return run


def _t6_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the T6 checkpoint is written: ``$NVFP4_T6_CACHE`` (kept between runs), else
    this run's temporary folder."""
    from .t6 import CACHE_ENV

    cache = os.environ.get(CACHE_ENV)
    folder = Path(cache) if cache else tmp_path_factory.getbasetemp() / "t6"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def nvfp4_t6_model(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """T6's model (:class:`nvfp4_conformance.t6.T6Model`: SmolLM2-135M-Instruct in float32
    and as an NVFP4 ModelOpt checkpoint), built once per run; a model that cannot be built
    fails the test (a conformance run never skips)."""
    from . import t6

    try:
        golden = t6.load_golden()
        return t6.build_model(golden, _t6_folder(tmp_path_factory))
    except t6.T6ModelUnavailable as exc:
        pytest.fail(f"the T6 model: {exc}", pytrace=False)
    except Exception as exc:  # an unreadable golden file
        pytest.fail(f"t6_golden.json could not be read: {type(exc).__name__}: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def nvfp4_t6_checkpoint(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, float, bool]:
    """T6's NVFP4 checkpoint alone (T7's greedy parity): ``(path, seconds to get it,
    reused)``. A checkpoint already written (by this run's T6, or by an earlier run into
    ``$NVFP4_T6_CACHE``) is reused once its sha256 is the golden file's; else the model is
    built (:func:`nvfp4_t6_model`)."""
    import time

    from . import t6

    t0 = time.time()
    try:
        cached = t6.cached_checkpoint(t6.load_golden(), _t6_folder(tmp_path_factory))
    except Exception as exc:  # an unreadable golden file
        pytest.fail(f"t6_golden.json could not be read: {type(exc).__name__}: {exc}", pytrace=False)
    if cached is not None:
        return cached, time.time() - t0, True
    model = request.getfixturevalue("nvfp4_t6_model")
    return model.checkpoint, time.time() - t0, False


@pytest.fixture(scope="session")
def nvfp4_backend(nvfp4_conformance_run: ConformanceRun) -> Any:
    """The backend under test, as :func:`nvfp4.get_backend` returned it."""
    return nvfp4_conformance_run.backend


@pytest.fixture(scope="session")
def nvfp4_spec_version(nvfp4_conformance_run: ConformanceRun) -> str:
    """The spec version being certified."""
    assert nvfp4_conformance_run.spec_version is not None
    return nvfp4_conformance_run.spec_version


@pytest.fixture(scope="session")
def nvfp4_tolerance(nvfp4_spec_version: str) -> Callable[[str, Any], float]:
    """``nvfp4_tolerance(path, dtype)``: the number of the spec version being certified
    (:func:`nvfp4_conformance.spec_tolerances.tolerance_lookup`)."""
    from .spec_tolerances import tolerance_lookup

    try:
        return tolerance_lookup(nvfp4_spec_version)
    except ImportError as exc:
        pytest.fail(
            f"nvfp4.tolerances is missing from the installed nvfp4-core: {exc}", pytrace=False
        )


@pytest.fixture
def nvfp4_record(
    request: pytest.FixtureRequest, nvfp4_conformance_run: ConformanceRun
) -> Callable[..., None]:
    """``nvfp4_record(case_id, **figures)``: store what this test measured for one case
    (``max_abs_err``, ``max_rel_err``, ``tolerance``, counts...) in the certificate."""
    node = request.node
    nodeid = stable_test_id(node) if isinstance(node, pytest.Item) else node.nodeid

    def record(case: str, **figures: Any) -> None:
        nvfp4_conformance_run.record(nodeid, case, figures)

    return record


def pytest_unconfigure(config: pytest.Config) -> None:
    run = config.stash.get(RUN_KEY, None)
    if _COLLECT_RUN.get("run") is run:
        _COLLECT_RUN.pop("run", None)
    if run is not None and run.backend_name is not None:
        # the run's declaration ends with it (an in-process run inside another session,
        # as the suite's own tests make, leaves attribution as it found it)
        attribution.declare_for(None)
