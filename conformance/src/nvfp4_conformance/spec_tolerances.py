"""The spec tolerances a run checks against: those of the version it certifies.

Every tolerance the suite uses comes from :func:`tolerance_lookup` of the version being
certified (``--nvfp4-spec``, resolved by the plugin; fixture ``nvfp4_tolerance``), never from
``nvfp4.tolerances``' default, which is the newest version: a 1.0 certificate made after 1.1
ships must measure against 1.0's numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["tolerance_lookup"]


def tolerance_lookup(spec_version: str) -> Callable[[str, Any], float]:
    """``lookup(path, dtype) -> float``: :func:`nvfp4.tolerances.tolerance` of spec
    ``spec_version``. Raises ``ImportError`` when the installed nvfp4-core has no
    ``nvfp4.tolerances`` and :class:`nvfp4.SpecVersionError` when it has no numbers for
    ``spec_version``."""
    from nvfp4.tolerances import tolerance, tolerances_for

    tolerances_for(spec_version)  # an unknown version fails here, once

    def lookup(path: str, dtype: Any) -> float:
        return float(tolerance(path, dtype, spec=spec_version))

    lookup.__doc__ = f"tolerance(path, dtype) of NVFP4 spec {spec_version}"
    return lookup
