"""Property-based tests (Hypothesis), as the test suites run them: reproducible (examples
derived from the test, no example database, no deadline) and drawing activation matrices
of whole 16-element blocks.

Test code only: it imports hypothesis, which installed code does not have, so
:mod:`nvfp4.testing` does not import this module; a test imports it by name::

    from nvfp4.testing.properties import draw_activations, reproducible
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ..spec import BLOCK_SIZE

__all__ = ["draw_activations", "reproducible"]


def reproducible(max_examples: int) -> settings:
    """Hypothesis settings for a property test: ``max_examples`` examples, the same on
    every run (``derandomize``, no database), no deadline, and neither slow data generation
    nor large examples reported as a health problem (the kernels under test are slow)."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def draw_activations(
    data: st.DataObject, elements: st.SearchStrategy[float], max_rows: int = 5, max_blocks: int = 5
) -> npt.NDArray[np.float32]:
    """A float32 activation matrix ``[M, 16 * blocks]`` of ``elements``, with ``M`` in
    ``1 .. max_rows`` and ``blocks`` in ``1 .. max_blocks``, drawn from ``data``."""
    m = data.draw(st.integers(1, max_rows), label="m")
    kb = data.draw(st.integers(1, max_blocks), label="k_blocks")
    x: Any = data.draw(hnp.arrays(np.float32, (m, BLOCK_SIZE * kb), elements=elements), label="x")
    return np.asarray(x, dtype=np.float32)
