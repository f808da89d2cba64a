"""Every figure of specbound (matplotlib, Agg backend): each function takes the numbers to
draw and a path, and knows nothing of how they were computed. ``save_figure`` is the one
way a figure reaches the disk."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

DPI = 130


def save_figure(figure, path) -> Path:
    """Lay out ``figure``, write it as a PNG at ``path`` (folders made), close it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, dpi=DPI)
    plt.close(figure)
    return path
