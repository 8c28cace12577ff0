"""The tuner's plans file, ``$XDG_CACHE_HOME/nvfp4/plans.json``: where it lives, reading it
(every value checked; a malformed file refused in one line naming the file, the entry and what
was expected) and writing it (a temporary and a rename). Shared by the backend's plan choice
(:mod:`nvfp4_cpu.plan`) and the tuner (:mod:`nvfp4_cpu.tune`)."""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

from ._native import Native

__all__ = [
    "FILE_VERSION",
    "machine_key",
    "plans_file",
    "read_plans",
    "stored_blocking",
    "write_plans",
]

FILE_VERSION = 1
#: Largest plans file read (a real one holds a few entries).
MAX_FILE_BYTES = 1 << 20
_WARNED: set[str] = set()


def plans_file() -> Path:
    """``$XDG_CACHE_HOME/nvfp4/plans.json`` (``~/.cache/nvfp4/plans.json`` when unset or not
    absolute, as the XDG spec says)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".cache"
    return root / "nvfp4" / "plans.json"


def machine_key(isa: str, caches: tuple[int, int, int]) -> str:
    """The entry a machine's plan is stored under: CPU model, level, caches."""
    from nvfp4.hardware import cpu_model

    return f"{cpu_model() or 'unknown CPU'} | {isa} | {caches[0]},{caches[1]},{caches[2]}"


def _blocking(path: Path, key: str, entry: Any) -> tuple[int, int, int]:
    """One entry's (kc, kp, group), each value checked."""
    if not isinstance(entry, dict):
        raise ValueError(f"{path}: entry {key!r}: expected an object, found {type(entry).__name__}")
    out = []
    allowed = {
        "kc": lambda v: v == 0 or (256 <= v <= 16384 and v % 256 == 0),
        "kp": lambda v: v in (16, 32),
        "group": lambda v: v in (4, 8),
    }
    for name, ok in allowed.items():
        v = entry.get(name)
        if isinstance(v, bool) or not isinstance(v, int) or not ok(v):
            raise ValueError(
                f"{path}: entry {key!r}: {name} must be "
                + {
                    "kc": "0 or a multiple of 256 in [256, 16384]",
                    "kp": "16 or 32",
                    "group": "4 or 8",
                }[name]
                + f", found {v!r:.60}"
            )
        out.append(v)
    return out[0], out[1], out[2]


def read_plans(path: Path) -> dict[str, Any]:
    """The stored entries (empty when there is no file); ValueError, one line, for a file that
    is not what the tuner writes."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return {}
    if not path.is_file():
        raise ValueError(f"{path}: expected a regular file")
    if size > MAX_FILE_BYTES:
        raise ValueError(f"{path}: expected at most {MAX_FILE_BYTES} bytes, found {size}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not UTF-8 JSON ({str(exc).splitlines()[0]:.80})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, found {type(data).__name__}")
    if data.get("version") != FILE_VERSION:
        raise ValueError(
            f"{path}: key 'version': expected {FILE_VERSION}, found {data.get('version')!r:.40}"
        )
    plans = data.get("plans")
    if not isinstance(plans, dict):
        raise ValueError(f"{path}: key 'plans': expected an object, found {type(plans).__name__}")
    for key, entry in plans.items():
        _blocking(path, key, entry)
    return plans


def stored_blocking(
    native: Native, isa: str, caches: tuple[int, int, int]
) -> tuple[int, int, int] | None:
    """The tuned (kc, kp, group) for this machine and level, or None. A malformed file is
    reported once per process as a one-line warning and ignored."""
    path = plans_file()
    try:
        entry = read_plans(path).get(machine_key(isa, caches))
    except (ValueError, OSError) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if msg not in _WARNED:
            _WARNED.add(msg)
            warnings.warn(f"nvfp4-cpu: tuned plans ignored: {msg}", stacklevel=3)
        return None
    return None if entry is None else _blocking(path, machine_key(isa, caches), entry)


def write_plans(path: Path, plans: dict[str, Any]) -> None:
    """Writes the file through a temporary in the same directory and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"version": FILE_VERSION, "plans": plans}, indent=1, sort_keys=True)
    fd, tmp = tempfile.mkstemp(prefix=".plans-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
