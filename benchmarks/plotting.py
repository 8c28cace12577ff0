"""The one way the benchmark scripts get matplotlib: its ``pyplot`` on the Agg backend
(files only, no display), or ``None`` when matplotlib is not installed (the scripts then
write their JSON and Markdown without a figure)."""

from __future__ import annotations

from typing import Any


def pyplot() -> Any | None:
    """``matplotlib.pyplot`` drawing to files, or ``None`` without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt
