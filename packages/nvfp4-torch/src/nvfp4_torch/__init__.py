"""nvfp4_torch: NVFP4 in PyTorch, in one place.

* :mod:`nvfp4_torch.ops` - ``torch.ops.nvfp4.*``: a ``torch.library`` custom op for every
  verb (``qmm``, ``gather_qmm``, ``dequantize``, ``qmm_w4a4``, the W4A8 ones), run by the
  NVFP4 backend installed for the tensors' device, with fake kernels for ``torch.compile``;
* :mod:`nvfp4_torch.modules` - :class:`NVFP4Linear` and :class:`NVFP4Experts`;
* :mod:`nvfp4_torch.loader` - a transformers causal LM from an NVFP4 checkpoint of any
  flavour, its linears NVFP4 (``pip install 'nvfp4-torch[models]'``);
* :mod:`nvfp4_torch.decode`, :mod:`nvfp4_torch.lean_decoder` - greedy decoding and
  teacher-forced scoring; ``python -m nvfp4_torch generate`` (or ``nvfp4-generate``) on top;
* :mod:`nvfp4_torch.smollm2` - the small real model (SmolLM2-135M-Instruct) made NVFP4, which
  the conformance suite's tier T6 decodes;
* :mod:`nvfp4_torch.parity` - the figures that compare two greedy runs (token parity,
  margins, KL).
* :mod:`nvfp4_torch.testing` - tiny random decoder models (llama, mistral, qwen2) for the
  tests of an integration.

Importing the package imports nothing heavy; the names below load their module on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._version import __version__

__all__ = ["NVFP4Experts", "NVFP4Linear", "__version__", "load_causal_lm", "load_model"]

#: Public names, by the module that defines them (imported on first use).
_LAZY = {
    "NVFP4Linear": "modules",
    "NVFP4Experts": "modules",
    "load_causal_lm": "loader",
    "load_model": "loader",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
