"""Figures of the studies and their report."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from specbound.plots import save_figure


def _error_bars(errors) -> np.ndarray:
    """Two standard errors; NaN (one prompt) draws no bar."""
    return 2 * np.nan_to_num(np.asarray(errors, dtype=np.float64), nan=0.0)


def plot_acceptance_curves(x_values, verifier_curves: dict, optimum_curves: dict, xlabel: str, title: str, path) -> Path:
    """Acceptance per token against temperature or n: verifiers as solid lines with ±2
    standard-error bars, the optima α* dashed (curves map a label to (means [k], errors [k]))."""
    figure, axes = plt.subplots(figsize=(7.4, 4.8))
    colors = iter(plt.cm.tab20.colors)  # eleven curves and more: tab10 runs out
    for label, (means, errors) in verifier_curves.items():
        axes.errorbar(x_values, means, yerr=_error_bars(errors), marker="o", ms=4, lw=1.4, capsize=3,
                      color=next(colors), label=label)
    for label, (means, errors) in optimum_curves.items():
        axes.errorbar(x_values, means, yerr=_error_bars(errors), marker="s", ms=4, lw=1.6, ls="--", capsize=3,
                      color=next(colors), label=label)
    axes.set_xticks(list(x_values))
    axes.set_xlabel(xlabel)
    axes.set_ylabel("acceptance per token (mean ± 2 s.e. over prompts)")
    axes.set_title(title, fontsize=11)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, loc="best", ncol=2)
    return save_figure(figure, path)


def plot_rejections(labels, measured, predicted, theorem, horizon: float, path, title: str) -> Path:
    """Mean rejections per sequence for each decoding configuration: measured by the engine
    (±2 s.e.), predicted along the same traces for the engine's rounds, and the papers'
    K = ∞ formula (Thm 1 / Thm 3). Each argument maps to (means [k], errors [k])."""
    positions = np.arange(len(labels))
    figure, axes = plt.subplots(figsize=(max(6.5, 1.1 * len(labels) + 2), 4.6))
    axes.errorbar(positions - 0.12, measured[0], yerr=_error_bars(measured[1]), fmt="o", color="tab:red",
                  capsize=3, label="measured by the engine")
    axes.errorbar(positions, predicted[0], yerr=_error_bars(predicted[1]), fmt="s", color="tab:blue",
                  capsize=3, label="predicted along the trace (engine's rounds)")
    axes.errorbar(positions + 0.12, theorem[0], yerr=_error_bars(theorem[1]), fmt="^", color="black",
                  capsize=3, label="Thm 1 / Thm 3 along the trace (K = ∞)")
    axes.set_xticks(positions, labels, rotation=20)
    axes.set_ylim(0, None)
    axes.set_ylabel(f"rejections per sequence (T = {horizon:g})")
    axes.set_title(title, fontsize=11)
    axes.grid(alpha=0.3, axis="y")
    axes.legend(fontsize=8, loc="lower left")
    return save_figure(figure, path)


def plot_bias_front(total_variation: float, sweeps: dict, path, title: str) -> Path:
    """Per-token mean rejection probability vs per-token mean bias: the front line from
    (0, TV) to (TV, 0) (mean TV(p_t, q_t) along the traces) and each method's ε sweep
    (label -> (biases [k], rejections [k], epsilons [k]))."""
    figure, axes = plt.subplots(figsize=(6.6, 5.4))
    axes.plot([0, total_variation], [total_variation, 0], color="tab:green", lw=2,
              label=f"Pareto front: rejection + bias = mean TV = {total_variation:.3f}")
    axes.fill_between([0, total_variation, 1], [total_variation, 0, 0], [1, 1, 1], color="tab:green", alpha=0.07)
    axes.plot([0], [total_variation], "k*", ms=10, label="speculative sampling (lossless, ε = 0)")
    axes.plot([total_variation], [0], "kX", ms=8, label="always accept the draft")
    # labels of the first sweep above right of its points, of the next ones below left, so
    # that they stay apart where the sweeps meet (large ε)
    offsets = [((4, 3), "left", "bottom"), ((-4, -3), "right", "top"), ((4, -3), "left", "top")]
    for index, (marker, (label, (biases, rejections, epsilons))) in enumerate(zip("os^D", sweeps.items())):
        line, = axes.plot(biases, rejections, marker=marker, ms=5, lw=1, label=label)
        offset, horizontal, vertical = offsets[index % len(offsets)]
        for bias, rejection, epsilon in zip(biases, rejections, epsilons):
            axes.annotate(f"ε={epsilon:g}", (bias, rejection), fontsize=7, xytext=offset, textcoords="offset points",
                          ha=horizontal, va=vertical, color=line.get_color())
    limit = 1.15 * total_variation + 0.01
    axes.set_xlim(0, limit)
    axes.set_ylim(0, limit)
    axes.set_xlabel("bias per token: mean TV(output law, target)")
    axes.set_ylabel("rejection probability per token (mean)")
    axes.set_title(title, fontsize=11)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, loc="upper right")
    return save_figure(figure, path)


def plot_speed_gain(epsilons, gains: dict, path, title: str) -> Path:
    """Measured tokens per target call relative to the lossless chain, against ε
    (label -> gains [k])."""
    figure, axes = plt.subplots(figsize=(6.4, 4.2))
    for marker, (label, values) in zip("os^D", gains.items()):
        axes.plot(epsilons, values, marker=marker, lw=1.4, label=label)
    axes.axhline(1.0, color="black", lw=1, ls="--", label="lossless chain (ε = 0)")
    axes.set_xlabel("ε")
    axes.set_ylabel("tokens per target call ÷ lossless chain's")
    axes.set_title(title, fontsize=11)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    return save_figure(figure, path)


def plot_multistep_lengths(panels, path, title: str) -> Path:
    """Accepted drafts per step against the decoding configuration, one panel per family
    (chains against γ, trees against their shape): one solid line per verifier, the optima
    dashed, with ±2 standard-error bars, the lines set slightly apart so that equal ones
    (block and traversal on a chain) both show. ``panels``: (xlabel, x values [k], verifier
    curves, optimum curves), curves mapping a label to (means [k], errors [k]); a NaN mean
    draws no point. Numeric x values are spaced by value, others evenly."""
    figure, all_axes = plt.subplots(1, len(panels), figsize=(5.6 * len(panels), 4.6), squeeze=False)
    for axes, (xlabel, x_values, verifier_curves, optimum_curves) in zip(all_axes[0], panels):
        numeric = all(isinstance(value, (int, float)) for value in x_values)
        positions = np.asarray(x_values if numeric else range(len(x_values)), dtype=np.float64)
        spacing = np.min(np.diff(np.sort(positions))) if len(positions) > 1 else 1.0
        lines = [("-", curve) for curve in verifier_curves.items()]
        lines += [("--", curve) for curve in optimum_curves.items()]
        colors, markers = iter(plt.cm.tab10.colors), iter("o^vDsP" * len(lines))
        for index, (line_style, (label, (means, errors))) in enumerate(lines):
            dodge = (index - (len(lines) - 1) / 2) * 0.04 * spacing
            axes.errorbar(positions + dodge, means, yerr=_error_bars(errors), marker=next(markers), ms=4, lw=1.4,
                          ls=line_style, capsize=3, color=next(colors), label=label)
        axes.set_xticks(positions, [str(value) for value in x_values])
        axes.set_xlabel(xlabel)
        axes.set_ylabel("accepted drafts per step (mean ± 2 s.e.)")
        axes.set_ylim(0, None)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8, loc="best")
    figure.suptitle(title, fontsize=11)
    return save_figure(figure, path)
