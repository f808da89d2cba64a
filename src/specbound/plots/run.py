"""Figure of ``specbound run``: tokens/s and tokens per target call per method."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from specbound.plots import save_figure


def plot_run(rows: list[dict], path) -> Path:
    """Two bar charts side by side; ``rows`` hold ``method``, ``tokens_per_second`` and
    ``tokens_per_target_call``."""
    labels = [row["method"] for row in rows]
    figure, (speed_axis, calls_axis) = plt.subplots(1, 2, figsize=(10, 4))
    speed_axis.bar(labels, [row["tokens_per_second"] for row in rows], color="tab:blue")
    speed_axis.set_ylabel("tokens / s")
    speed_axis.set_title("wall-clock speed")
    calls_axis.bar(labels, [row["tokens_per_target_call"] for row in rows], color="tab:orange")
    calls_axis.set_ylabel("tokens per target call")
    calls_axis.set_title("tokens per target forward")
    for axis in (speed_axis, calls_axis):
        axis.tick_params(axis="x", rotation=20)
    return save_figure(figure, path)
