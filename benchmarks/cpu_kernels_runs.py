"""The goals of several ``cpu_kernels.py`` runs side by side: how a ratio moves between runs.

One run of ``cpu_kernels.py`` gives every goal's ratio on one machine in one process. On a
shared 2-vCPU VM a ratio near its target can land on either side of it from run to run with
the same code, and that is what this table shows: each goal's value in every run given, with
the lowest and highest round of that run (``rounds`` in the run's own summary) and its
verdict.

    python benchmarks/cpu_kernels_runs.py REV [REV ...] [--isa avx2] [--out PATH]

Each REV is a git revision whose ``benchmarks/results/cpu_kernels.json`` is one run
(``git show REV:benchmarks/results/cpu_kernels.json``), or the path of such a JSON file.
The runs are ordered by start time. ``--isa`` keeps the goals of one of our ISA levels (the
id suffix ``[avx2]``, ``[avx512]``; default: every goal with a target). Writes
``docs/benchmark_results/cpu_kernels_runs.md`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULT = "benchmarks/results/cpu_kernels.json"
sys.path.insert(0, str(ROOT / "benchmarks"))


def subject(rev: str) -> str:
    """The first line of the message of the commit ``rev`` (what the run was taken for),
    cut to 120 characters."""
    proc = subprocess.run(
        ["git", "-C", str(ROOT), "log", "-1", "--format=%s", rev],
        capture_output=True,
        text=True,
        check=False,
    )
    line = proc.stdout.strip() if proc.returncode == 0 else ""
    return line if len(line) <= 120 else line[:117] + "..."


def load_run(ref: str) -> tuple[str, dict[str, Any]]:
    """The run behind ``ref`` (a JSON path or a git revision) and the label it is shown under."""
    path = Path(ref)
    if path.is_file():
        text, label = path.read_text(), path.name
        data_note = ""
    else:
        proc = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{ref}:{RESULT}"],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise SystemExit(
                f"cpu_kernels_runs: {ref}: neither a file nor a revision holding {RESULT} "
                f"({proc.stderr.strip() or 'git show failed'})"
            )
        text, label = proc.stdout, ref
        data_note = subject(ref)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"cpu_kernels_runs: {ref}: not JSON ({exc})") from exc
    for key in ("goals", "results", "machine", "started_unix"):
        if key not in data:
            raise SystemExit(f"cpu_kernels_runs: {ref}: no '{key}' (expected a cpu_kernels run)")
    data["_commit_subject"] = data_note
    return label, data


def cell(g: dict[str, Any] | None) -> str:
    if g is None or g.get("value") is None:
        return "-"
    verdict = "met" if g.get("met") else "**not met**"
    rounds = g.get("rounds")
    spread = f" ({rounds[0]:.2f}-{rounds[1]:.2f})" if rounds else ""
    return f"{g['value']:.2f}{spread} {verdict}"


def render(runs: list[tuple[str, dict[str, Any]]], isa: str | None) -> str:
    ids: list[str] = []
    targets: dict[str, str] = {}
    texts: dict[str, str] = {}
    for _, data in runs:
        for g in data["goals"]:
            if g["target"] == "context" or (isa and f"[{isa}]" not in g["id"]):
                continue
            if g["id"] not in targets:
                ids.append(g["id"])
                targets[g["id"]] = g["target"]
                texts[g["id"]] = g["goal"]
    lines = [
        "# CPU NVFP4 kernels: the goals across runs",
        "",
        "Produced by `benchmarks/cpu_kernels_runs.py` from the runs below (each one run of "
        "`benchmarks/cpu_kernels.py`; the newest run's own summary is `cpu_kernels.md`). A cell "
        "is the run's ratio of medians, the lowest and highest round of that run in brackets, "
        "and its verdict. A goal met in one run and missed in the next with the same kernels, "
        "or whose rounds straddle its target, is decided by the shared machine, not by a margin "
        "(the commit column says what changed between runs). A value may lie outside its own "
        "round range: the ratio of medians takes each arm's median over all its calls, which "
        "may come from different rounds.",
        "",
        "| run | started (UTC) | machine | rounds | run time | commit |",
        "|---|---|---|---:|---:|---|",
    ]
    for label, data in runs:
        started = time.strftime("%Y-%m-%d %H:%M", time.gmtime(data["started_unix"]))
        lines.append(
            f"| {label} | {started} | {data['machine'].get('cpu', '?')}, "
            f"{data['machine'].get('cpus', '?')} CPUs, {data.get('threads', '?')} threads | "
            f"{data.get('rounds', 1)} | {data.get('duration_s', 0):.0f} s | "
            f"{data.get('_commit_subject') or '-'} |"
        )
    lines += [
        "",
        "| id | goal | target | " + " | ".join(label for label, _ in runs) + " |",
        "|---|---|---|" + "---|" * len(runs),
    ]
    for gid in ids:
        row = [next((g for g in data["goals"] if g["id"] == gid), None) for _, data in runs]
        lines.append(
            f"| {gid} | {texts[gid]} | {targets[gid]} | " + " | ".join(cell(g) for g in row) + " |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", metavar="REV", help="git revisions or JSON paths")
    p.add_argument("--isa", help="only the goals of this ISA level (avx2, avx512)")
    p.add_argument("--out", type=Path, default=ROOT / "docs/benchmark_results/cpu_kernels_runs.md")
    args = p.parse_args()
    runs = [load_run(ref) for ref in args.runs]
    # runs recorded before the best-call and per-round ratios were kept get both, recomputed
    # from their rows (values and verdicts stay as recorded)
    from cpu_kernels import add_best_ratios

    for _, data in runs:
        add_best_ratios(data)
    runs.sort(key=lambda r: r[1]["started_unix"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(runs, args.isa))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
