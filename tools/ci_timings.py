"""Where CI's time goes: per-session wall time and test counts from a timestamped nox log.

Two modes:

``python tools/ci_timings.py stamp``
    Copy standard input to standard output, each line prefixed with the wall-clock time
    (``HH:MM:SS``): ``bash .ci/run 2>&1 | python tools/ci_timings.py stamp > ci.log``.

``python tools/ci_timings.py table LOG [--json OUT.json]``
    Read such a log and print a Markdown table of every nox session (seconds, and the
    pytest counts of its last summary line), with the totals of README's test command (every
    session but the conformance ones) and of the main job (the conformance sessions); with
    ``--json``, write the same figures and this machine's CPU model and core count. Sessions
    that ran in a lane inside another (``nox -s tests`` runs each package's test session so,
    its lines prefixed ``[package] ``) are listed with their own times, which overlap: the
    totals count their parent's wall time.

The figures README quotes come from the JSON ``docs/ci/timings.json`` (a repository test
checks them).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

_STAMP = re.compile(r"^(\d\d):(\d\d):(\d\d) (.*)$")
_START = re.compile(r"nox > Running session (\S+)")
_END = re.compile(r"nox > Session (\S+) (was successful|failed|aborted|was skipped)")
_COUNTS = re.compile(r"\b(\d+) (passed|failed|skipped|errors?|deselected)\b")
_PYTEST_SUMMARY = re.compile(r"\b\d+ passed\b.* in [\d.]+s")


#: A line printed by a session running inside another (``.ci/lanes.py``): ``[label] text``.
_LANE = re.compile(r"^\[([^\]]+)\] (.*)$")


@dataclass
class Session:
    name: str
    seconds: int = 0
    outcome: str = "unfinished"
    counts: dict[str, int] = field(default_factory=dict)
    #: the label of the lane it ran in (inside ``nox -s tests``), or "" for a top-level one;
    #: a session in a lane runs beside others, so its time is part of its parent's
    lane: str = ""


def stamp() -> int:
    for line in sys.stdin:
        sys.stdout.write(time.strftime("%H:%M:%S ") + line)
        sys.stdout.flush()
    return 0


def parse(lines: list[str]) -> list[Session]:
    """The sessions of a stamped log, in order (a day boundary is crossed at most once).
    Lines prefixed ``[label] `` belong to a session running in a lane beside others: their
    session and pytest counts are kept apart by label."""
    sessions: list[Session] = []
    open_at: dict[tuple[str, str], int] = {}
    current: dict[str, Session] = {}  # lane label -> its latest session
    last = 0
    offset = 0
    for line in lines:
        m = _STAMP.match(line)
        if not m:
            continue
        h, mi, s, text = int(m[1]), int(m[2]), int(m[3]), m[4]
        now = h * 3600 + mi * 60 + s + offset
        if now < last:  # past midnight
            offset += 86400
            now += 86400
        last = now
        lane = ""
        if in_lane := _LANE.match(text):
            lane, text = in_lane[1], in_lane[2]
        if start := _START.search(text):
            open_at[(lane, start[1])] = now
            current[lane] = Session(start[1], lane=lane)
            sessions.append(current[lane])
        elif end := _END.search(text):
            name = end[1]
            for sess in reversed(sessions):
                if sess.name == name and sess.lane == lane and sess.outcome == "unfinished":
                    sess.seconds = now - open_at.get((lane, name), now)
                    sess.outcome = end[2].replace("was ", "")
                    break
        elif _PYTEST_SUMMARY.search(text) and lane in current:
            current[lane].counts = {
                k.rstrip("s") if k.startswith("error") else k: int(n)
                for n, k in _COUNTS.findall(text)
            }
    return sessions


def is_main_job(name: str) -> bool:
    return name.startswith("conformance")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def figures(sessions: list[Session]) -> dict:
    top = [s for s in sessions if not s.lane]  # a lane's time is inside its parent's
    tests = sum(s.seconds for s in top if not is_main_job(s.name))
    main = sum(s.seconds for s in top if is_main_job(s.name))
    return {
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count()},
        "sessions": [asdict(s) for s in sessions],
        "test_command_seconds": tests,
        "main_job_seconds": main,
        "total_seconds": tests + main,
    }


def markdown(data: dict) -> str:
    rows = ["| session | wall time | tests | outcome |", "|---|--:|---|---|"]
    for s in data["sessions"]:
        counts = ", ".join(f"{n} {k}" for k, n in s["counts"].items()) or "-"
        name = f"`{s['name']}`" + (" (in a lane)" if s.get("lane") else "")
        rows.append(f"| {name} | {_clock(s['seconds'])} | {counts} | {s['outcome']} |")
    rows.append(f"| **README's test command** | **{_clock(data['test_command_seconds'])}** | | |")
    rows.append(f"| **the main job (conformance)** | **{_clock(data['main_job_seconds'])}** | | |")
    rows.append(f"| **`.ci/run` in all** | **{_clock(data['total_seconds'])}** | | |")
    return "\n".join(rows) + "\n"


def _clock(seconds: int) -> str:
    return f"{seconds // 60}:{seconds % 60:02d}"


def main(argv: list[str]) -> int:
    if argv[:1] == ["stamp"]:
        return stamp()
    if argv[:1] != ["table"] or len(argv) < 2:
        print(__doc__)
        return 2
    data = figures(parse(Path(argv[1]).read_text(errors="replace").splitlines()))
    if "--json" in argv:
        out = Path(argv[argv.index("--json") + 1])
        out.write_text(json.dumps(data, indent=1) + "\n")
    sys.stdout.write(markdown(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
