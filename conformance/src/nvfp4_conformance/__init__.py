"""nvfp4_conformance: the NVFP4 conformance suite.

A pytest plugin (entry point ``pytest11``: ``nvfp4_conformance = "nvfp4_conformance.plugin"``)
and the tier tests that ship inside this package. One command certifies a backend against
the spec, on the installed wheels::

    pytest --pyargs nvfp4_conformance.tiers --nvfp4-backend reference \\
        --nvfp4-certificate reports/conformance-reference.json
    # or, the same run:
    python -m nvfp4_conformance run --backend reference \\
        --certificate reports/conformance-reference.json

Tiers (one module each under :mod:`nvfp4_conformance.tiers`): T0 codec, T1 planes and
layouts, T2 activation quantization, T3 dequantization, T4 matmul, T5 golden fixtures,
T6 greedy parity on SmolLM2-135M-Instruct. The certificate (JSON and a Markdown twin)
records every measured error against its tolerance and the capabilities certified and not
certified.

T6 loads and decodes the model with nvfp4-torch (the ``parity`` extra); the suite itself
holds no model code. Public besides the plugin: :func:`read_certificate` (a certificate file,
checked against its schema) and :func:`load_t6_golden` (T6's golden tokens, what engines'
whole-model runs compare with).
"""

from __future__ import annotations

from ._version import __version__
from .certificate_read import read_certificate
from .t6 import GOLDEN_RESOURCE as T6_GOLDEN_RESOURCE
from .t6 import NEW_TOKENS as T6_NEW_TOKENS
from .t6 import load_golden as load_t6_golden

#: Spec versions this suite has tests for (the run uses the newest one that the suite,
#: nvfp4-core and the backend under test all implement, unless --nvfp4-spec says otherwise).
SUITE_SPEC_VERSIONS: tuple[str, ...] = ("1.0", "1.1", "1.2", "1.3", "1.4", "1.5")

__all__ = [
    "SUITE_SPEC_VERSIONS",
    "T6_GOLDEN_RESOURCE",
    "T6_NEW_TOKENS",
    "__version__",
    "load_t6_golden",
    "read_certificate",
]
