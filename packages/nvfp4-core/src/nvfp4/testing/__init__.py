"""What the test suites of the nvfp4 packages, the conformance suite and the benchmarks
share. Installed code imports it, so nothing here imports pytest at module level.

* :mod:`nvfp4.testing.errors` - the spec's matmul error measure ``max|y - ref| / max|ref|``
  (:func:`relative_error`, :func:`error_figures`, :func:`assert_within`);
* :mod:`nvfp4.testing.data` - seeded test weights and activations (:func:`random_planes`,
  :func:`realistic_weight`, :func:`activations`, the shapes of a Llama layer
  :func:`llama_layer_shapes`), :func:`raw_planes` (unchecked), :func:`unit_scale_planes`
  (the weight is its codes), :func:`cancelling_blocks` (a sum no float32 order gets near),
  :func:`cancelling_halves` (sums that cancel across K's halves) and the crafted activations of the encoder tests (:func:`rows_across_magnitudes`,
  :func:`zero_blocks`, :func:`nonfinite_blocks`, :func:`scattered_inf`,
  :func:`q8_exact_halves`);
* :mod:`nvfp4.testing.modules` - :func:`module_from_file`: a script, benchmark or build
  hook that is not an installed module, imported from its path;
* :mod:`nvfp4.testing.properties` - Hypothesis settings and strategies of the property
  tests (it imports hypothesis, so this package does not import it);
* :mod:`nvfp4.testing.oracles` - the pytest hooks of the oracle rule; a suite's
  ``conftest.py`` takes them with::

      from nvfp4.testing import pytest_configure, pytest_sessionfinish  # noqa: F401
"""

from __future__ import annotations

from .data import (
    activations,
    cancelling_blocks,
    cancelling_halves,
    globals_for,
    llama_layer_shapes,
    nonfinite_blocks,
    q8_exact_halves,
    random_planes,
    raw_planes,
    realistic_weight,
    rows_across_magnitudes,
    scattered_inf,
    unit_scale_planes,
    unrouted_nonfinite_rows,
    zero_blocks,
)
from .errors import as_float64, assert_within, error_figures, relative_error
from .modules import module_from_file
from .oracles import OPTIONAL_ORACLE, REQUIRE_ORACLES_ENV, pytest_configure, pytest_sessionfinish

__all__ = [
    "OPTIONAL_ORACLE",
    "REQUIRE_ORACLES_ENV",
    "activations",
    "as_float64",
    "assert_within",
    "cancelling_blocks",
    "cancelling_halves",
    "error_figures",
    "globals_for",
    "llama_layer_shapes",
    "module_from_file",
    "nonfinite_blocks",
    "pytest_configure",
    "pytest_sessionfinish",
    "q8_exact_halves",
    "random_planes",
    "raw_planes",
    "realistic_weight",
    "relative_error",
    "rows_across_magnitudes",
    "scattered_inf",
    "unit_scale_planes",
    "unrouted_nonfinite_rows",
    "zero_blocks",
]
