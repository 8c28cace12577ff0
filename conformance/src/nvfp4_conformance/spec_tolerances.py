"""The spec bounds a run checks against: those of the version it certifies.

Every tolerance the suite uses comes from :func:`tolerance_lookup` of the version being
certified (``--nvfp4-spec``, resolved by the plugin; fixture ``nvfp4_tolerance``), never from
``nvfp4.tolerances``' default, which is the newest version: a 1.0 certificate made after 1.1
ships must measure against 1.0's numbers. The same object gives the version's accumulation
floor of each matmul output (:meth:`SpecBounds.allowance`; from spec 1.3), so a 1.2
certificate made after 1.3 ships is judged without one.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["SpecBounds", "tolerance_lookup"]


class SpecBounds:
    """``bounds(path, dtype) -> float``: :func:`nvfp4.tolerances.tolerance` of one spec
    version; :meth:`allowance` its accumulation floor."""

    def __init__(self, spec_version: str) -> None:
        from nvfp4.tolerances import tolerance, tolerances_for

        tolerances_for(spec_version)  # an unknown version fails here, once
        self._tolerance = tolerance
        self.spec_version = spec_version
        try:
            from nvfp4.tolerances import accumulation_floor
        except ImportError:  # an nvfp4-core before spec 1.3 knows no floor
            self.floor = None
        else:
            self.floor = accumulation_floor(spec_version)
        self.__doc__ = f"tolerance(path, dtype) of NVFP4 spec {spec_version}"

    def __call__(self, path: str, dtype: Any) -> float:
        return float(self._tolerance(path, dtype, spec=self.spec_version))

    def allowance(
        self, path: str, a: Any, w: Any, ref: Any, dtype: Any, expert_ids: Any = None
    ) -> npt.NDArray[np.float64] | None:
        """Every output element's accumulation floor (:func:`nvfp4.accumulation_floor.allowance`)
        for ``path``, or ``None`` where the version has none for it (before 1.3). ``a`` is
        what the path multiplies (x, or the activations the backend's encoder gave), ``w``
        the planes, ``ref`` the float64 reference ``[M, N]``, ``dtype`` the output dtype,
        ``expert_ids`` the routing of ``gather_qmm``."""
        if self.floor is None or path not in self.floor.paths:
            return None
        from nvfp4.accumulation_floor import absolute_sums, allowance

        sums = absolute_sums(a, w, expert_ids)
        return allowance(self.floor, sums, ref, dtype, int(w.k))


def tolerance_lookup(spec_version: str) -> SpecBounds:
    """The bounds of spec ``spec_version`` (:class:`SpecBounds`). Raises ``ImportError``
    when the installed nvfp4-core has no ``nvfp4.tolerances`` and
    :class:`nvfp4.SpecVersionError` when it has no numbers for ``spec_version``."""
    return SpecBounds(spec_version)
