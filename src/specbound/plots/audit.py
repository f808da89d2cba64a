"""Figure of ``specbound audit``: the pooled PIT test's statistic and each position's test."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from specbound.plots import save_figure


def plot_audit(edges, fractions, tolerance: float, position_p_values, level: float, path,
               sharpening: float | None = None, detectable_sharpening: float | None = None) -> Path:
    """Left: the share of PIT values at or below each edge minus the edge (0 for an engine
    with the reference's law) with the tolerance band; middle: −log10 of each position's
    p-value against the level's line; right (with ``sharpening``): the sharpness test's
    temperature error, against the error the audit detects with probability 0.99.
    # [B−1], [B−1], [T]"""
    edges, fractions = np.asarray(edges), np.asarray(fractions)
    panels = 3 if sharpening is not None else 2
    figure, axes = plt.subplots(1, panels, figsize=(5 * panels, 4))
    pooled_axis, positions_axis = axes[:2]
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
    if sharpening is not None:
        sharp_axis = axes[2]
        if detectable_sharpening is not None and np.isfinite(detectable_sharpening):
            sharp_axis.axhspan(-detectable_sharpening, detectable_sharpening, color="tab:grey", alpha=0.2,
                               label="below what it detects")
        sharp_axis.axhline(0.0, color="black", linewidth=0.8)
        sharp_axis.bar([0], [sharpening], width=0.4, color="tab:purple", label="measured")
        sharp_axis.set_xlim(-1, 1)
        sharp_axis.set_xticks([])
        sharp_axis.set_ylabel("temperature error ε (sampled as at T/(1 + ε))")
        sharp_axis.set_title("sharpness")
        sharp_axis.legend()
    return save_figure(figure, path)
