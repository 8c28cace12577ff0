"""The whole-model results document: its JSON schema, validation, files and Markdown.

One file per engine, ``reports/engines/whole-model/<engine>.json`` (format
:data:`FORMAT`, schema ``nvfp4_engines/data/whole-model-v1.schema.json``): beside the
engines' conformance certificates rather than inside them, because a certificate records a
pytest run of the suite against an adapter's kernels (its own versioned schema, which a
third-party reader relies on), while these figures come from the engine's own generation
loop on a whole model. The engines matrix renders both (:func:`markdown`).
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = [
    "FOLDER",
    "FORMAT",
    "ResultsError",
    "load_all",
    "markdown",
    "schema",
    "validate",
    "write",
]

FORMAT = 1
#: The folder of the results, under the engines' reports folder.
FOLDER = "whole-model"


class ResultsError(ValueError):
    """A results document that does not match its schema."""


@cache
def schema() -> dict[str, Any]:
    text = resources.files("nvfp4_engines").joinpath(f"data/whole-model-v{FORMAT}.schema.json")
    loaded: dict[str, Any] = json.loads(text.read_text(encoding="utf-8"))
    return loaded


def validate(doc: Any, where: str = "results") -> None:
    """Raise :class:`ResultsError` listing every violation of the schema (``$.path:
    message``), and where the summary disagrees with the prompts."""
    import jsonschema

    checker = jsonschema.Draft202012Validator(schema())
    errors = [f"{e.json_path}: {e.message}" for e in checker.iter_errors(doc)]
    if not errors:
        s, prompts = doc["summary"], doc["prompts"]
        for key in ("tokens_matched", "tokens_expected"):
            total = sum(p[key] for p in prompts)
            if s[key] != total:
                errors.append(f"$.summary.{key}: {s[key]}, the prompts sum to {total}")
        for i, p in enumerate(prompts):
            if (p["divergence"] is None) != (p["tokens_matched"] == p["tokens_expected"]):
                errors.append(
                    f"$.prompts[{i}].divergence: {p['divergence']!r} with "
                    f"{p['tokens_matched']} of {p['tokens_expected']} tokens matched"
                )
    if errors:
        raise ResultsError(
            f"{where}: not a valid whole-model results document: " + "; ".join(errors)
        )


def write(doc: dict[str, Any], folder: Path) -> Path:
    """Validate ``doc`` and write it as ``folder/<engine>.json``."""
    validate(doc, doc.get("engine", "results"))
    folder.mkdir(parents=True, exist_ok=True)
    dest = folder / f"{doc['engine']}.json"
    dest.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return dest


def load_all(folder: Path) -> list[dict[str, Any]]:
    """Every results document in ``folder`` (none when it does not exist), validated,
    ordered by engine."""
    docs = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        doc = json.loads(path.read_text(encoding="utf-8"))
        validate(doc, str(path.name))
        docs.append(doc)
    return sorted(docs, key=lambda d: str(d["engine"]))


def _divergences(doc: dict[str, Any]) -> str:
    cells = []
    for p in doc["prompts"]:
        d = p["divergence"]
        if d is not None:
            if d["near_tie"]:
                why = "near tie"
            elif d["reference_margin"] < 2 * p["max_abs_logit_diff"]:
                # a margin m can flip under logit changes of m / 2 (see nvfp4_conformance.t6)
                why = f"above the threshold, within 2 x the engine's max logit diff {p['max_abs_logit_diff']:.3g}"
            else:
                why = "clear"
            cells.append(
                f"{p['name']} step {d['step']} (reference margin {d['reference_margin']:.3f}, {why})"
            )
    return "; ".join(cells) or "none"


def markdown(docs: list[dict[str, Any]]) -> list[str]:
    """The "Whole model" section of ``docs/engines.md`` (no lines when there are no
    results)."""
    if not docs:
        return []
    lines = [
        "## Whole model (T6 greedy parity)",
        "",
        "Each engine runs its own generation, greedy, 40 new tokens, on nvfp4's conversion of "
        "the T6 checkpoint (SmolLM2-135M-Instruct, every decoder linear NVFP4) to its format, "
        "for the golden prompts' token ids (`python -m nvfp4_engines.whole_model`). It is held "
        "to the reference backend's tokens of the activation mode its matmul computes in "
        "(`t6_golden.json`; W4A8: int8 Q8_0 activations). First divergence: the step and the "
        "reference's top-1/top-2 margin there (a near tie below the golden file's "
        "threshold, or within twice the largest logit difference between engine and reference on "
        "that prompt, where a margin can flip). KL(reference || engine), top-1 agreement with "
        "the reference tokens and the largest logit difference: teacher-forced on the "
        "reference tokens, over every step.",
        "",
    ]
    header = [
        "engine",
        "adapter",
        "format",
        "compared with",
        "tokens",
        "verdict",
        "first divergences",
        "mean KL",
        "top-1",
        "max abs logit diff",
        "time",
    ]
    rows = []
    for d in docs:
        s = d["summary"]
        rows.append(
            [
                f"{d['engine']} ({d['release']})",
                f"`{d['adapter']}`",
                d["checkpoint"]["converted_to"],
                d["reference"]["activation_mode"].upper(),
                f"{s['tokens_matched']} of {s['tokens_expected']}",
                s["verdict"],
                _divergences(d),
                f"{s['mean_kl_reference_to_engine']:.3g}",
                f"{s['top1_agreement']:.4f}",
                f"{s['max_abs_logit_diff']:.3g}",
                f"{d['timings_s']['total']:.0f} s",
            ]
        )
    lines += [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(r) + " |" for r in rows),
    ]
    return lines
