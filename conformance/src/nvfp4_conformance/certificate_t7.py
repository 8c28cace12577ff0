"""The certificate's T7 section (sharding, spec 1.2): the worst measured error per
parallel path and output dtype against its tolerance, with the case it came from, over
every world size; and the greedy parity of T6's model decoded tensor-parallel (tokens
matched per world size, and what the spawn cost). Present only when T7 ran, so a certificate without T7 (every 1.0 / 1.1
certificate) is what it was before T7 existed."""

from __future__ import annotations

from typing import Any

from .recording import ConformanceRun

__all__ = ["t7_markdown", "t7_section"]

#: test function -> the path it certifies.
_PATHS = {
    "test_row_parallel_qmm": "row_parallel",
    "test_row_parallel_qmm_cancelling": "row_parallel",
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
    rank: dict[tuple[str, str], tuple[float, float]] = {}
    for o in t7:
        path = _PATHS.get(o.nodeid.split("::", 1)[-1].split("[", 1)[0], "other")
        for c in o.cases:
            dtype = c.figures.get("dtype")
            if not isinstance(dtype, str):
                continue
            # the figure the case was judged by: the error beyond the accumulation floor
            # where the certified version has one for the path, else max_rel_err
            judged_by = _JUDGED if _JUDGED in c.figures else "max_rel_err"
            judged = _number(c.figures.get(judged_by))
            raw = _number(c.figures.get("max_rel_err"))
            if (path, dtype) not in rank or (judged, raw) > rank[path, dtype]:
                rank[path, dtype] = (judged, raw)
                worst.setdefault(path, {})[dtype] = {
                    "max_rel_err": _shown(raw),
                    "judged_by": judged_by,
                    "judged": _shown(judged),
                    "tolerance": c.figures.get("tolerance"),
                    "tolerance_of": c.figures.get("tolerance_of"),
                    "case": c.case,
                }
    counts: dict[str, int] = {}
    for o in t7:
        counts[o.outcome] = counts.get(o.outcome, 0) + 1
    section: dict[str, Any] = {
        "spec": T7_FROM_SPEC,
        "process_group": "torch.distributed, gloo",
        "world_sizes": list(WORLDS),
        "tests": counts,
        "worst": worst,
    }
    greedy = _greedy_parity(run, t7)
    if greedy:
        section["greedy_parity"] = greedy
    return {"t7": section}


#: The figure a case with an accumulation floor is judged by (spec 1.3 on).
_JUDGED = "max_rel_err_beyond_floor"


def _number(v: Any) -> float:
    """A recorded figure as a float (inf where it is missing or not a number)."""
    return float(v) if isinstance(v, (int, float)) else float("inf")


def _shown(v: float) -> float | str:
    """A figure for JSON (``"inf"`` for an infinity)."""
    return v if v != float("inf") else "inf"


def _greedy_parity(run: ConformanceRun, t7: list[Any]) -> dict[str, Any]:
    """Per world size: prompts, tokens matched of tokens expected, ranks agreeing; with the
    spawn's timings (empty when the greedy parity did not run)."""
    worlds: dict[str, dict[str, Any]] = {}
    for o in t7:
        for c in o.cases:
            f = c.figures
            if f.get("kind") != "sharded_parity":
                continue
            w = worlds.setdefault(
                str(f.get("world")),
                {"prompts": 0, "tokens_matched": 0, "tokens_expected": 0, "ranks_agree": True},
            )
            w["prompts"] += 1
            w["tokens_matched"] += int(f.get("tokens_matched") or 0)
            w["tokens_expected"] += int(f.get("tokens_expected") or 0)
            w["ranks_agree"] = w["ranks_agree"] and bool(f.get("ranks_agree"))
    if not worlds:
        return {}
    timing = run.extra.get("t7_greedy", {})
    for world, w in worlds.items():
        w.update(timing.get("worlds", {}).get(world, {}))
    return {
        "model": "T6's (SmolLM2-135M-Instruct, every decoder linear NVFP4)",
        "worlds": dict(sorted(worlds.items())),
        "spawn_seconds": timing.get("spawn_seconds"),
        "checkpoint_seconds": timing.get("checkpoint_seconds"),
        "checkpoint_reused": timing.get("checkpoint_reused"),
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
        f"{', '.join(str(w) for w in t7['world_sizes'])}. Worst error per path and dtype "
        "(the figure judged: beyond the accumulation floor where the version has one for "
        "the path):",
        "",
        "| path | dtype | worst judged | max_rel_err | tolerance | case |",
        "|---|---|---|---|---|---|",
    ]

    def fmt(v: Any) -> str:
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    for path, by_dtype in sorted(t7["worst"].items()):
        for dtype, e in sorted(by_dtype.items()):
            # certificates before the floor carry max_rel_err alone
            judged_by = e.get("judged_by", "max_rel_err")
            judged = f"{fmt(e.get('judged', e['max_rel_err']))} ({judged_by})"
            lines.append(
                f"| {path} | {dtype} | {judged} | {fmt(e['max_rel_err'])} "
                f"| {e['tolerance']} {e['tolerance_of']} | {e['case']} |"
            )
    greedy = t7.get("greedy_parity")
    if greedy:
        how = "reused, its sha256 checked" if greedy["checkpoint_reused"] else "built"
        lines += [
            "",
            f"Greedy parity, tensor-parallel, on {greedy['model']}: the golden tokens of T6 "
            f"(one spawn of ranks: {greedy['spawn_seconds']} s; the checkpoint {how} in "
            f"{greedy['checkpoint_seconds']} s):",
            "",
            "| world size | prompts | tokens matched | ranks agree | load s | shard s | decode s |",
            "|---|---|---|---|---|---|---|",
        ]
        for world, w in greedy["worlds"].items():
            lines.append(
                f"| {world} | {w['prompts']} | {w['tokens_matched']}/{w['tokens_expected']} "
                f"| {'yes' if w['ranks_agree'] else 'no'} | {w.get('load_seconds', '-')} "
                f"| {w.get('shard_seconds', '-')} | {w.get('decode_seconds', '-')} |"
            )
    return lines
