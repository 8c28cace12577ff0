"""The certificate's T7 section (sharding, spec 1.2 draft): the worst measured error per
parallel path and output dtype against its tolerance, with the case it came from, over
every world size. Present only when T7 ran, so a certificate without T7 (every 1.0 / 1.1
certificate) is what it was before T7 existed."""

from __future__ import annotations

from typing import Any

from .recording import ConformanceRun

__all__ = ["t7_markdown", "t7_section"]

#: test function -> the path it certifies.
_PATHS = {
    "test_row_parallel_qmm": "row_parallel",
    "test_column_parallel_qmm": "column_parallel",
    "test_expert_parallel_gather_qmm": "expert_parallel",
}


def t7_section(run: ConformanceRun) -> dict[str, Any]:
    """``{"t7": {...}}`` when T7 ran, else ``{}`` (merged into the certificate)."""
    t7 = [o for o in run.outcomes.values() if o.tier == "T7"]
    if not t7:
        return {}
    from .t7 import T7_FROM_SPEC, WORLDS

    worst: dict[str, dict[str, dict[str, Any]]] = {}
    for o in t7:
        path = _PATHS.get(o.nodeid.split("::", 1)[-1].split("[", 1)[0], "other")
        for c in o.cases:
            dtype, err = c.figures.get("dtype"), c.figures.get("max_rel_err")
            if not isinstance(dtype, str):
                continue
            number = float("inf") if not isinstance(err, (int, float)) else float(err)
            entry = worst.setdefault(path, {}).get(dtype)
            if entry is None or number > entry["max_rel_err"]:
                worst[path][dtype] = {
                    "max_rel_err": number if number != float("inf") else "inf",
                    "tolerance": c.figures.get("tolerance"),
                    "tolerance_of": c.figures.get("tolerance_of"),
                    "case": c.case,
                }
    counts: dict[str, int] = {}
    for o in t7:
        counts[o.outcome] = counts.get(o.outcome, 0) + 1
    return {
        "t7": {
            "spec": f"{T7_FROM_SPEC} (draft)",
            "process_group": "torch.distributed, gloo",
            "world_sizes": list(WORLDS),
            "tests": counts,
            "worst": worst,
        }
    }


def t7_markdown(cert: dict[str, Any]) -> list[str]:
    """The Markdown lines of the T7 section (none when T7 did not run)."""
    t7 = cert.get("t7")
    if not t7:
        return []
    lines = [
        "",
        f"## T7 sharded (spec {t7['spec']})",
        "",
        f"Ranks: {t7['process_group']}, world sizes "
        f"{', '.join(str(w) for w in t7['world_sizes'])}. Worst error per path and dtype:",
        "",
        "| path | dtype | worst max_rel_err | tolerance | case |",
        "|---|---|---|---|---|",
    ]
    for path, by_dtype in sorted(t7["worst"].items()):
        for dtype, e in sorted(by_dtype.items()):
            err = e["max_rel_err"]
            shown = f"{err:.3g}" if isinstance(err, float) else str(err)
            lines.append(
                f"| {path} | {dtype} | {shown} | {e['tolerance']} {e['tolerance_of']} "
                f"| {e['case']} |"
            )
    return lines
