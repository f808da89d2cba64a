"""Figure of ``specbound audit``: the pooled PIT test's statistic and each position's test."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from specbound.plots import save_figure


def plot_audit(edges, fractions, tolerance: float, position_p_values, level: float, path) -> Path:
    """Left: the share of PIT values at or below each edge minus the edge (0 for an engine
    with the reference's law) with the tolerance band; right: −log10 of each position's
    p-value against the level's line.  # [B−1], [B−1], [T]"""
    edges, fractions = np.asarray(edges), np.asarray(fractions)
    figure, (pooled_axis, positions_axis) = plt.subplots(1, 2, figsize=(10, 4))
    pooled_axis.axhspan(-tolerance, tolerance, color="tab:green", alpha=0.2, label="tolerance")
    pooled_axis.axhline(0.0, color="black", linewidth=0.8)
    pooled_axis.plot(edges, fractions - edges, "o-", color="tab:blue", label="sampled")
    pooled_axis.set_xlabel("edge of the reference's ranking (PIT)")
    pooled_axis.set_ylabel("share at or below the edge − edge")
    pooled_axis.set_title("pooled PIT, every position")
    pooled_axis.legend()
    scores = -np.log10(np.maximum(np.asarray(position_p_values, dtype=float), 1e-300))
    positions_axis.bar(np.arange(1, scores.size + 1), scores, color="tab:orange")
    positions_axis.axhline(-np.log10(level), color="tab:red", linestyle="--", label=f"level {level:g}")
    positions_axis.set_xlabel("position (new token)")
    positions_axis.set_ylabel("−log10 p (this position alone)")
    positions_axis.set_title("per position")
    positions_axis.legend()
    return save_figure(figure, path)
