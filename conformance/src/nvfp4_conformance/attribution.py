"""Attribution of failing cases to declared deviations, and the certificate's verdict
(spec 1.2, "Conformance classes and declared deviations").

When a bit-exact comparison fails, the tier asks :func:`explain_dequantize` or
:func:`explain_encoding` whether the backend's output is what the reference computes with
one declared deviation switched on (or two, where no single one explains it): the
emulations of :mod:`nvfp4.deviation_emulators`. A failing row-parallel sum (T7) asks
:func:`explain_row_parallel_sum` whether every element is within the bound of a declared
``partials_relative`` deviation (spec 1.5's registry). The answer (a list of deviation ids, or
``None``) is recorded with the failing case as ``explained_by`` (and, for a sum, how much of
each bound it uses: :func:`row_parallel_bounds_used`); nothing is loosened: the test still
fails. A backend that raises where an emulated ``refuses`` deviation refuses the
same input is explained by that deviation.

Only the deviations declared for the backend under test take part: those whose registry
entry's ``seen_in`` names it, and those its ``BackendInfo.deviations`` declares
(:func:`declare_for`, called by the plugin). Where two deviations of different engines make the same output (ggml's K multiple
of 64 and MLX's K multiple of 32 both refuse K = 48), each engine's failure is explained by
its own; a backend the registry names nowhere has no declared deviation, so its failures
stay unexplained until one enters the registry with evidence. Outside a run (no
:func:`declare_for`), every deviation of the newest registry takes part. A run attributes
with the registry of the spec version it certifies (:func:`nvfp4.deviation_registry.
registry_version`: 1.2's for 1.2-1.4), so an older version's certificate names only the
ids that version had.

:func:`verdict` turns a certificate's tests into its class: ``conformant`` (no failure),
``compatible`` (every failing test explained, by deviations none of which is ``unsafe``),
``incompatible`` (anything else).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from nvfp4 import deviation_emulators as emu
from nvfp4 import deviation_registry as registry
from nvfp4.planes import NVFP4Planes

from .checks import exact_mismatches

__all__ = [
    "declare_for",
    "decode_or_explain",
    "exact_or_explain",
    "explain_dequantize",
    "explain_encoding",
    "explain_refusal",
    "explain_row_parallel_sum",
    "row_parallel_bounds_used",
    "verdict",
    "within_bound",
]

_REFUSALS = tuple(d.id for d in registry.deviations() if d.emulated and d.bound == "refuses")
_DECODE = tuple(sorted(emu.DECODER_DEVIATIONS - set(_REFUSALS)))
_ENCODE = tuple(sorted(emu.ENCODER_DEVIATIONS - set(_REFUSALS)))
_SUMS = tuple(d.id for d in registry.deviations() if d.emulated and d.bound == "partials_relative")
#: The deviations declared for the backend under test (None: every deviation).
_declared: frozenset[str] | None = None
#: The spec version the run certifies (None: the newest registry's).
_spec: str | None = None


def declare_for(
    backend: str | None, declared: Iterable[str] = (), spec: str | None = None
) -> frozenset[str] | None:
    """Attribute failures only to the deviations of the registry spec ``spec`` uses (``None``:
    the newest) whose ``seen_in`` names ``backend`` and to the registry ids in ``declared``
    (the backend's own declaration; an id that registry does not hold is a ``ValueError``);
    ``backend=None``: to every deviation of the newest registry again. Returns that set."""
    global _declared, _spec
    if backend is None:
        _declared, _spec = None, None
        return None
    devs = registry.deviations(spec)
    own = frozenset(declared)
    known = {d.id for d in devs}
    if own - known:
        raise ValueError(
            f"backend {backend!r} declares deviations the registry does not hold: "
            f"{', '.join(sorted(own - known))} (registry of spec "
            f"{registry.registry_version(spec)})"
        )
    _declared = own | {d.id for d in devs if backend in d.seen_in}
    _spec = spec
    return _declared


def _candidates(ids: Sequence[str]) -> tuple[str, ...]:
    """``ids`` less those not declared for the backend under test (and those the certified
    version's registry does not hold), in order."""
    if _declared is None:
        return tuple(ids)
    return tuple(i for i in ids if i in _declared)


def _first(
    candidates: Sequence[str], matches: Callable[[tuple[str, ...]], bool]
) -> list[str] | None:
    """The first single deviation, then pair, whose emulation ``matches``."""
    for size in (1, 2):
        for chosen in itertools.combinations(candidates, size):
            try:
                if matches(chosen):
                    return list(chosen)
            except (ValueError, ArithmeticError):
                continue
    return None


def explain_dequantize(found: Any, planes: NVFP4Planes, dtype: str) -> list[str] | None:
    """The declared decoder deviations whose emulation gives exactly ``found`` (NaN
    matches NaN, -0 matches 0, as the tier compares), or ``None``."""
    f = np.asarray(found)

    def matches(chosen: tuple[str, ...]) -> bool:
        want = emu.dequantize(planes, dtype, deviations=chosen)
        return f.shape == want.shape and not exact_mismatches(f, want).any()

    return _first(_candidates(_DECODE), matches)


def _same_planes(got: NVFP4Planes, want: NVFP4Planes, chosen: Iterable[str]) -> bool:
    """Codes and scale bytes equal; the global equal, or within one float32 ulp where a
    ``global_relative`` deviation is chosen (its reciprocal's last rounding)."""
    if got.codes.shape != want.codes.shape or got.scales.shape != want.scales.shape:
        return False
    if not (np.array_equal(got.codes, want.codes) and np.array_equal(got.scales, want.scales)):
        return False
    g, w = np.float32(got.global_scale), np.float32(want.global_scale)
    if g == w:
        return True
    reciprocal = any(registry.deviation(i).bound == "global_relative" for i in chosen)
    return bool(reciprocal and abs(float(g) - float(w)) <= float(np.spacing(w)))


def explain_encoding(x: Any, input_scale: Any, got: NVFP4Planes) -> list[str] | None:
    """The declared encoder deviations whose emulation of
    :func:`nvfp4.reference.quantize_activations` gives ``got``'s planes, or ``None``."""

    def matches(chosen: tuple[str, ...]) -> bool:
        want = emu.quantize_activations(x, input_scale, deviations=chosen)
        return _same_planes(got, want, chosen)

    return _first(_candidates(_ENCODE), matches)


@functools.cache
def _refusals_most_specific_first() -> tuple[str, ...]:
    """The emulated refusals ordered by how many probe inputs they refuse, fewest first:
    where two refuse the same input (K = 48 is neither a multiple of 32 nor of 64), the
    narrower claim is the explanation."""
    probes = [
        np.ones((1, k), dtype) for k in range(16, 513, 16) for dtype in (np.float32, np.float16)
    ]

    def refused(ident: str) -> int:
        n = 0
        for x in probes:
            try:
                emu.quantize_activations(x, deviations=[ident])
            except emu.DeviationRefusal:
                n += 1
        return n

    return tuple(sorted(_REFUSALS, key=lambda i: (refused(i), _REFUSALS.index(i))))


def explain_refusal(run: Callable[[Sequence[str]], Any]) -> list[str] | None:
    """For a backend that raised: the emulated ``refuses`` deviation whose emulation
    ``run(deviations)`` raises :class:`nvfp4.deviation_emulators.DeviationRefusal` too (the
    most specific one where several do)."""
    for ident in _candidates(_refusals_most_specific_first()):
        try:
            run((ident,))
        except emu.DeviationRefusal:
            return [ident]
        except (ValueError, ArithmeticError):
            continue
    return None


def row_parallel_bounds_used(
    found: Any,
    ref: Any,
    floor: Any,
    partials: Sequence[Any],
    dtype: str,
) -> dict[str, float]:
    """For each declared ``partials_relative`` deviation taking part: the largest fraction of
    its bound (:func:`nvfp4.deviation_emulators.partials_relative_bound`) that an element of
    the row-parallel sum ``found`` uses beyond ``floor``, ``max(|found - ref| - floor, 0) /
    (b * gamma_w * sum_r |p_r|)``: at most 1 where every element is within the bound. It is
    ``inf`` where an element is outside a zero bound, where ``found`` is NaN and ``ref`` is not
    (or the other way round), where an infinite ``ref`` is not matched, or where the shapes
    differ. ``floor``: the accumulation floor of the unsharded call (``None``: none);
    ``partials``: each rank's float64 partial."""
    y = np.asarray(found, dtype=np.float64)
    want = np.asarray(ref, dtype=np.float64)
    idents = _candidates(_SUMS)
    if y.shape != want.shape:
        return dict.fromkeys(idents, float("inf"))
    nan = np.isnan(want)
    with np.errstate(invalid="ignore"):
        beyond = np.abs(y - want) - (0.0 if floor is None else np.asarray(floor, np.float64))
    beyond = np.maximum(beyond, 0.0)[~nan]
    # an infinite reference is matched exactly or not at all; NaN where ref is NaN only
    broken = not np.array_equal(np.isnan(y), nan) or bool(
        np.any((np.isinf(want) & (y != want))[~nan])
    )
    finite = ~np.isinf(want[~nan])
    used: dict[str, float] = {}
    for ident in idents:
        if broken:
            used[ident] = float("inf")
            continue
        b = float(registry.deviation(ident, _spec).bound_value or 0.0)
        bound = emu.partials_relative_bound(partials, dtype, b)[~nan]
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = np.where(beyond == 0, 0.0, beyond / bound)[finite]
        used[ident] = float(frac.max()) if frac.size else 0.0
    return used


def within_bound(used: Mapping[str, float]) -> list[str] | None:
    """The first deviation of :func:`row_parallel_bounds_used` whose bound holds every
    element (a fraction of at most 1), or ``None``."""
    first = next((ident for ident, f in used.items() if f <= 1), None)
    return None if first is None else [first]


def explain_row_parallel_sum(
    found: Any,
    ref: Any,
    floor: Any,
    partials: Sequence[Any],
    dtype: str,
) -> list[str] | None:
    """The declared ``partials_relative`` deviation within whose bound every element of a
    row-parallel sum ``found`` is (``|found - ref| <= floor + b * gamma_w * sum_r |p_r|``;
    NaN where ``ref`` is NaN, an infinity equal to ``ref``'s), or ``None``: :func:`within_bound`
    of :func:`row_parallel_bounds_used`."""
    return within_bound(row_parallel_bounds_used(found, ref, floor, partials, dtype))


def decode_or_explain(
    record: Callable[..., None], case: str, planes: NVFP4Planes, dtype: str, call: Callable[[], Any]
) -> Any:
    """``call()`` (a backend's decode of ``planes``); where it raises, the case is recorded
    with the emulated refusal that explains it (or ``None``) and the error propagates."""
    try:
        return call()
    except Exception:
        record(
            case,
            explained_by=explain_refusal(lambda d: emu.dequantize(planes, dtype, deviations=d)),
        )
        raise


def exact_or_explain(
    record: Callable[..., None],
    case: str,
    planes: NVFP4Planes,
    dtype: str,
    check: Callable[[], None],
    found: Any,
) -> None:
    """``check()`` (an exact comparison of a decode ``found`` of ``planes``); where it
    fails, the case is recorded with the decoder deviations that explain ``found``."""
    try:
        check()
    except AssertionError:
        record(case, explained_by=explain_dequantize(found, planes, dtype))
        raise


def failing_explanation(test: Mapping[str, Any]) -> list[str] | None:
    """What explains a failed certificate test, else ``None``.

    A test records its failing case last, then fails: its ``explained_by`` answers. A
    Hypothesis test (``hypothesis`` true) records every failing example it ran, while
    searching and shrinking, each with ``explained_by``, and may fail with several distinct
    errors at once: it is explained only when every such example is, by the union of their
    deviations (in order of first appearance); one unexplained example leaves the test
    unexplained."""
    cases = test.get("cases") or []
    if not cases:
        return None
    if not test.get("hypothesis"):
        last = cases[-1].get("explained_by")
        return list(last) if isinstance(last, list) and last else None
    failing = [c["explained_by"] for c in cases if "explained_by" in c]
    if not failing or not all(isinstance(ids, list) and ids for ids in failing):
        return None
    return list(dict.fromkeys(i for ids in failing for i in ids))


def verdict(
    tests: Sequence[Mapping[str, Any]], result: str, spec: str | None = None
) -> dict[str, Any]:
    """The certificate's ``verdict`` for spec version ``spec`` (``None``: the newest
    registry): its class, how many failing tests each deviation explains, the unexplained
    failing tests and the unsafe deviations claimed."""
    explained: dict[str, int] = {}
    unexplained: list[str] = []
    for t in tests:
        if t.get("outcome") not in ("failed", "error"):
            continue
        ids = t.get("explained_by")
        if not ids:
            unexplained.append(str(t.get("nodeid")))
            continue
        for i in ids:
            explained[i] = explained.get(i, 0) + 1
    unsafe = sorted(i for i in explained if not registry.deviation(i, spec).admissible)
    failing = bool(unexplained or explained) or result == "failed"
    if not failing:
        cls = "conformant"
    elif unexplained or unsafe or (result == "failed" and not explained):
        cls = "incompatible"
    else:
        cls = "compatible"
    return {
        "class": cls,
        "explained": dict(sorted(explained.items())),
        "unexplained": unexplained,
        "unsafe": unsafe,
        "registry_spec_version": registry.registry_version(spec),
    }
