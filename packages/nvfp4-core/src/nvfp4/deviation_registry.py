"""The deviation registry, read from ``spec/<X.Y>/deviations.toml`` (1.2's, and 1.5's that
adds to it).

The registry is spec data (``nvfp4.md``, section "Conformance classes and declared
deviations"): every way a real engine was seen to depart from the spec, with the rule it
departs from, its scope (``real`` checkpoints or ``malformed`` input only), its severity
(``benign``, ``lossy``, ``unsafe``), its bound and the evidence. This module reads it and
restates none of it. Where the file is found (:func:`data_file`): an installed wheel carries
it as package data, ``nvfp4/spec_data/<X.Y>/deviations.toml`` (``hatch_build.py``); a source
checkout reads the repository's ``spec/<X.Y>/``.

Registries are versioned with the spec: a spec version uses the newest registry released at or
before it (:func:`registry_version`: 1.2-1.4 use 1.2's, 1.5 its own), so a certificate of an
older version is attributed as it was when that version was released. 1.5's registry is 1.2's
entries unchanged plus a deviation of T7, with a bound kind and a tier 1.2's file may not
use (:data:`SINCE`).

The file is input like any other: every value is checked for type and range where it is
read, and an error is one line naming the file, the entry, the key, the expected and the
found (:class:`DeviationRegistryError`, a ``ValueError``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from .spec import version_key
from .spec_files import spec_file, tomllib

if TYPE_CHECKING:
    from collections.abc import Mapping
    from importlib.resources.abc import Traversable

__all__ = [
    "BOUNDS",
    "CLASSES",
    "SCOPES",
    "SEVERITIES",
    "Deviation",
    "DeviationRegistryError",
    "data_file",
    "deviation",
    "deviations",
    "parse",
    "registry_version",
]

#: The conformance classes, best first (the ``verdict`` of a certificate).
CLASSES: Final = ("conformant", "compatible", "incompatible")
#: Who meets a deviation: real checkpoints / models, or malformed input only.
SCOPES: Final = ("real", "malformed")
#: How bad it is; ``unsafe`` makes an engine ``incompatible`` even when declared.
SEVERITIES: Final = ("benign", "lossy", "unsafe")
#: Bound kinds -> whether ``bound_value`` is required (a number) or forbidden.
BOUNDS: Final[Mapping[str, bool]] = {
    "ulps": True,
    "element_relative": True,
    "max_relative": True,
    "global_relative": True,
    "scale_steps": True,
    "partials_relative": True,
    "refuses": False,
    "unbounded": False,
}
TIERS: Final = ("T0", "T1", "T2", "T3", "T4", "T5", "T6", "T7")
#: Bound kinds and tiers a registry may use only from the spec version given (1.2's file
#: predates them).
SINCE: Final[Mapping[str, str]] = {"partials_relative": "1.5", "T7": "1.5"}
#: The spec versions that released a registry file, oldest first.
REGISTRY_VERSIONS: Final = ("1.2", "1.5")
#: The newest registry: the one a run without a spec version uses.
REGISTRY_SPEC_VERSION: Final = REGISTRY_VERSIONS[-1]
_ID: Final = re.compile(r"[a-z0-9_]{1,64}")
_ENGINE: Final = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_MAX_TEXT: Final = 2000
_MAX_BYTES: Final = 1 << 20
_MAX_ENTRIES: Final = 1000
_FIELDS: Final = frozenset(
    {
        "id",
        "rule",
        "differs",
        "scope",
        "severity",
        "bound",
        "bound_value",
        "bound_text",
        "why",
        "tiers",
        "seen_in",
        "evidence",
        "emulated",
        "impact",
    }
)


class DeviationRegistryError(ValueError):
    """The registry file is malformed; the one-line message names where and what."""


@dataclass(frozen=True)
class Deviation:
    """One declared deviation (the fields of ``deviations.toml``; see the spec)."""

    id: str
    rule: str
    differs: str
    scope: str
    severity: str
    bound: str
    bound_value: float | None
    bound_text: str
    why: str
    tiers: tuple[str, ...]
    seen_in: tuple[str, ...]
    evidence: tuple[str, ...]
    emulated: bool
    #: Measured effect on the T6 model (key -> number), where measured.
    impact: Mapping[str, float] | None = None

    @property
    def admissible(self) -> bool:
        """Whether it can explain a failure of a ``compatible`` engine (not ``unsafe``)."""
        return self.severity != "unsafe"


def registry_version(spec: str | None = None) -> str:
    """The registry spec version ``spec`` uses: the newest of :data:`REGISTRY_VERSIONS` at or
    before it (``None``: the newest; a version before 1.2, which has no classes, 1.2's).
    Raises ValueError for a malformed version."""
    if spec is None:
        return REGISTRY_SPEC_VERSION
    if not re.fullmatch(r"\d+\.\d+", str(spec)):
        raise ValueError(f"deviation registry: expected a spec version X.Y, found {spec!r}")
    older = [v for v in REGISTRY_VERSIONS if version_key(v) <= version_key(spec)]
    return older[-1] if older else REGISTRY_VERSIONS[0]


def data_file(spec: str | None = None) -> Traversable:
    """``deviations.toml`` of the registry ``spec`` uses (:func:`registry_version`): the
    package data of an installed wheel, else the checkout's ``spec/<version>/``. Raises
    FileNotFoundError naming both places."""
    return spec_file(registry_version(spec), "deviations.toml", "deviation registry")


def _allowed(names: tuple[str, ...], version: str) -> tuple[str, ...]:
    """``names`` less those :data:`SINCE` reserves for a newer registry than ``version``."""
    return tuple(
        n for n in names if n not in SINCE or version_key(SINCE[n]) <= version_key(version)
    )


def _text(where: str, entry: Mapping[str, Any], key: str) -> str:
    value = entry.get(key)
    if not isinstance(value, str) or not value.strip() or len(value) > _MAX_TEXT:
        raise DeviationRegistryError(
            f"{where}: key {key!r}: expected a non-empty string of at most {_MAX_TEXT} "
            f"characters, found {_show(value)}"
        )
    return value


def _choice(where: str, entry: Mapping[str, Any], key: str, allowed: tuple[str, ...]) -> str:
    value = entry.get(key)
    if value not in allowed:
        raise DeviationRegistryError(
            f"{where}: key {key!r}: expected one of {', '.join(allowed)}, found {_show(value)}"
        )
    return str(value)


def _strings(
    where: str, entry: Mapping[str, Any], key: str, pattern: re.Pattern[str] | None = None
) -> tuple[str, ...]:
    value = entry.get(key)
    ok = isinstance(value, list) and 0 < len(value) <= 100
    ok = ok and all(isinstance(v, str) and 0 < len(v) <= _MAX_TEXT for v in value)  # type: ignore[union-attr]
    if ok and pattern is not None:
        ok = all(pattern.fullmatch(v) for v in value)  # type: ignore[union-attr]
    if not ok or len(set(value)) != len(value):  # type: ignore[arg-type]
        what = f"strings matching {pattern.pattern}" if pattern is not None else "strings"
        raise DeviationRegistryError(
            f"{where}: key {key!r}: expected a non-empty list of distinct {what}, "
            f"found {_show(value)}"
        )
    return tuple(value)  # type: ignore[arg-type]


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _impact(where: str, value: Any) -> Mapping[str, float] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not value or len(value) > 50:
        raise DeviationRegistryError(
            f"{where}: key 'impact': expected a table of numbers, found {_show(value)}"
        )
    out: dict[str, float] = {}
    for k, v in value.items():
        if not _ID.fullmatch(k) or isinstance(v, bool) or not isinstance(v, (int, float)):
            raise DeviationRegistryError(
                f"{where}: key 'impact.{k}': expected a finite number, found {_show(v)}"
            )
        if not math.isfinite(v) or v < 0:
            raise DeviationRegistryError(
                f"{where}: key 'impact.{k}': expected a finite number >= 0, found {v!r}"
            )
        out[k] = float(v)
    return out


def _entry(source: str, index: int, entry: Any, version: str) -> Deviation:
    where = f"{source}: deviation {index}"
    if not isinstance(entry, dict):
        raise DeviationRegistryError(f"{where}: expected a table, found {_show(entry)}")
    ident = entry.get("id")
    if not isinstance(ident, str) or not _ID.fullmatch(ident):
        raise DeviationRegistryError(
            f"{where}: key 'id': expected a string matching {_ID.pattern}, found {_show(ident)}"
        )
    where = f"{source}: deviation {ident!r}"
    unknown = sorted(set(entry) - _FIELDS)
    if unknown:
        raise DeviationRegistryError(
            f"{where}: unknown key {unknown[0]!r}; expected only {', '.join(sorted(_FIELDS))}"
        )
    scope = _choice(where, entry, "scope", SCOPES)
    severity = _choice(where, entry, "severity", SEVERITIES)
    bound = _choice(where, entry, "bound", _allowed(tuple(BOUNDS), version))
    value = entry.get("bound_value")
    if BOUNDS[bound]:
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value < 0
        ):
            raise DeviationRegistryError(
                f"{where}: key 'bound_value': expected a finite number >= 0 for bound "
                f"{bound!r}, found {_show(value)}"
            )
        value = float(value)
    elif value is not None:
        raise DeviationRegistryError(
            f"{where}: key 'bound_value': expected none for bound {bound!r}, found {_show(value)}"
        )
    if bound == "unbounded" and scope != "malformed" and severity == "benign":
        raise DeviationRegistryError(
            f"{where}: key 'bound': 'unbounded' needs scope 'malformed' or severity 'lossy' / "
            f"'unsafe', found scope {scope!r} and severity {severity!r}"
        )
    emulated = entry.get("emulated")
    if not isinstance(emulated, bool):
        raise DeviationRegistryError(
            f"{where}: key 'emulated': expected true or false, found {_show(emulated)}"
        )
    tiers = _strings(where, entry, "tiers")
    known = _allowed(TIERS, version)
    bad = [t for t in tiers if t not in known]
    if bad:
        raise DeviationRegistryError(
            f"{where}: key 'tiers': expected tiers among {', '.join(known)}, found {bad[0]!r}"
        )
    return Deviation(
        id=ident,
        rule=_text(where, entry, "rule"),
        differs=_text(where, entry, "differs"),
        scope=scope,
        severity=severity,
        bound=bound,
        bound_value=value,
        bound_text=_text(where, entry, "bound_text"),
        why=_text(where, entry, "why"),
        tiers=tiers,
        seen_in=_strings(where, entry, "seen_in", _ENGINE),
        evidence=_strings(where, entry, "evidence"),
        emulated=emulated,
        impact=_impact(where, entry.get("impact")),
    )


def parse(
    text: str, source: str = "deviations.toml", version: str = REGISTRY_SPEC_VERSION
) -> tuple[Deviation, ...]:
    """The deviations of the registry file of spec ``version`` (one of
    :data:`REGISTRY_VERSIONS`) whose text is ``text`` (``source`` names it in errors), in
    file order. Raises :class:`DeviationRegistryError` for anything malformed."""
    if len(text.encode("utf-8", "surrogatepass")) > _MAX_BYTES:
        raise DeviationRegistryError(
            f"{source}: expected at most {_MAX_BYTES} bytes, found {len(text.encode())}"
        )
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise DeviationRegistryError(f"{source}: not TOML: {exc}") from None
    stated = data.get("spec_version")
    if stated != version:
        raise DeviationRegistryError(
            f"{source}: key 'spec_version': expected {version!r}, found {_show(stated)}"
        )
    extra = sorted(set(data) - {"spec_version", "deviation"})
    if extra:
        raise DeviationRegistryError(
            f"{source}: unknown key {extra[0]!r}; expected only spec_version and [[deviation]]"
        )
    entries = data.get("deviation")
    if not isinstance(entries, list) or not 0 < len(entries) <= _MAX_ENTRIES:
        raise DeviationRegistryError(
            f"{source}: key 'deviation': expected 1 to {_MAX_ENTRIES} [[deviation]] tables, "
            f"found {_show(entries)}"
        )
    out = tuple(_entry(source, i, e, version) for i, e in enumerate(entries))
    seen: set[str] = set()
    for d in out:
        if d.id in seen:
            raise DeviationRegistryError(
                f"{source}: deviation {d.id!r}: id declared twice; expected each id once"
            )
        seen.add(d.id)
    return out


_CACHE: dict[str, tuple[Deviation, ...]] = {}


def deviations(spec: str | None = None) -> tuple[Deviation, ...]:
    """Every declared deviation of the registry spec ``spec`` uses (``None``: the newest), in
    file order (each file read once)."""
    version = registry_version(spec)
    if version not in _CACHE:
        source = data_file(version)
        _CACHE[version] = parse(source.read_text(encoding="utf-8"), str(source), version)
    return _CACHE[version]


def deviation(ident: str, spec: str | None = None) -> Deviation:
    """The deviation ``ident`` of the registry ``spec`` uses; KeyError naming the known ids
    when there is none."""
    for d in deviations(spec):
        if d.id == ident:
            return d
    raise KeyError(
        f"deviation registry {registry_version(spec)}: no deviation {ident!r}; expected one "
        f"of {', '.join(d.id for d in deviations(spec))}"
    )
