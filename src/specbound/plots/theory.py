"""Figures of ``specbound theory`` ([YIN] Fig. 2-4 analogues)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import MaxNLocator

from specbound.plots import save_figure


def plot_convergence(
    running_means, running_errors, analytic: float, horizon: int, path, setting: str = ""
) -> Path:
    """Monte Carlo mean of N_rej after n runs, ±2 standard errors, vs the exact value
    ([YIN] Fig. 2a analogue). ``setting`` is appended to the title (e.g. ", V = 7, seed 10")."""
    runs = np.arange(1, len(running_means) + 1)
    figure, axes = plt.subplots(figsize=(7, 4.2))
    axes.fill_between(
        runs, running_means - 2 * running_errors, running_means + 2 * running_errors,
        color="tab:blue", alpha=0.2, label="±2 standard errors",
    )
    axes.plot(runs, running_means, color="tab:blue", lw=1.2, label="Monte Carlo mean of N_rej")
    axes.axhline(
        analytic, color="black", ls="--", lw=1.2,
        label=f"exact E[N_rej] = {analytic:.3f} (Thm 1)",
    )
    axes.set_xscale("log")
    axes.set_xlabel("number of Monte Carlo runs")
    axes.set_ylabel("mean number of rejections N_rej")
    axes.set_title(
        f"Speculative sampling, T = {horizon}, K = ∞{setting}\n"
        f"acceleration T / E[N_rej] = {horizon / analytic:.2f}", fontsize=11,
    )
    axes.legend(loc="upper right")
    axes.grid(alpha=0.3)
    return save_figure(figure, path)


def plot_rejections_vs_drafts(
    num_drafts, analytic, limit: float, simulated_drafts, simulated_means, simulated_errors,
    horizon: int, path, setting: str = "",
) -> Path:
    """E[N_rej] vs the number of drafts M with its positive M → ∞ limit, Monte Carlo points
    (±2 standard errors) on the exact curve ([YIN] Fig. 2c analogue). ``setting`` is appended
    to the title (e.g. ", V = 7, seed 10")."""
    figure, axes = plt.subplots(figsize=(7, 4.2))
    axes.plot(num_drafts, analytic, color="tab:blue", lw=1.5, label="exact E[N_rej] (Thm 3)")
    axes.errorbar(
        simulated_drafts, simulated_means, yerr=2 * np.asarray(simulated_errors), fmt="o",
        color="tab:red", ms=5, capsize=3, label="Monte Carlo mean ±2 s.e.",
    )
    axes.axhline(limit, color="black", ls="--", lw=1.2, label=f"M → ∞ limit = {limit:.3f}")
    axes.set_xscale("log")
    axes.set_ylim(0, None)
    axes.set_xlabel("number of drafts M")
    axes.set_ylabel("expected number of rejections E[N_rej]")
    axes.set_title(f"Batch speculative decoding, T = {horizon}, K = ∞{setting}", fontsize=11)
    axes.legend(loc="lower left")
    axes.grid(alpha=0.3, which="both")
    return save_figure(figure, path)


def plot_batch_improvement(num_drafts, bernoulli_curves: dict, uniform_curves: dict, path) -> Path:
    """Single-token batch improvement BI(M) = TV − Π_m TV(p^m, q) from the closed forms,
    with the general formula as markers ([YIN] Fig. 3 analogue). Curves map a label to
    (closed form [k], general formula [k], M → ∞ limit)."""
    figure, panels = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    titles = ("draft Ber(u), target Ber(v): (u − v)(1 − u^{M−1})",
              "draft uniform on V, target uniform on V′: (1 − 1/r) − (1 − 1/r)^M")
    for axes, curves, title in zip(panels, (bernoulli_curves, uniform_curves), titles):
        for color, (label, (closed, general, limit)) in zip(plt.cm.tab10.colors, curves.items()):
            axes.plot(num_drafts, closed, color=color, lw=1.5, label=label)
            axes.plot(num_drafts, general, "o", color=color, ms=3.5, mfc="none")
            axes.axhline(limit, color=color, ls=":", lw=1)
        axes.set_title(title, fontsize=10)
        axes.set_xlabel("number of drafts M")
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8, loc="lower right")
    panels[0].set_ylabel("batch improvement BI (lines: closed form, ○: general)")
    figure.suptitle("Batch improvement vs M (dotted: M → ∞ limit)", fontsize=11)
    return save_figure(figure, path)


def plot_pareto_front(
    total_variation: float, random_points, sweeps: dict, path, annotate_epsilons=()
) -> Path:
    """Rejection probability vs bias: the Pareto front P(reject) + bias = TV, the achievable
    region above it, random acceptance vectors with their least bias Loss*(b), and ε sweeps
    (label -> (bias [k], rejection [k], epsilon [k])) ([YIN] Fig. 4 analogue). The ε values in
    ``annotate_epsilons`` are labelled on the first sweep (the others share its ε grid)."""
    figure, axes = plt.subplots(figsize=(6.6, 5.6))
    upper = max(1.0, float(np.max(random_points[:, 1])) + 0.02)
    axes.fill_between(
        [0, total_variation, 1], [total_variation, 0, 0], [upper] * 3, color="tab:green",
        alpha=0.08, label="achievable: P(reject) + bias ≥ TV",
    )
    axes.plot(
        [0, total_variation], [total_variation, 0], color="tab:green", lw=2,
        label=f"Pareto front (TV = {total_variation:.3f})",
    )
    axes.scatter(
        random_points[:, 0], random_points[:, 1], s=6, color="0.6",
        label="random b ~ U[0,1]^V with optimal R: (Loss*(b), P(reject))",
    )
    markers = ("o", "s", "^", "D")
    for marker, (label, (biases, rejections, epsilons)) in zip(markers, sweeps.items()):
        axes.plot(biases, rejections, marker=marker, ms=4, lw=1, label=label)
    first_biases, first_rejections, first_epsilons = next(iter(sweeps.values()))
    for bias, rejection, epsilon in zip(first_biases, first_rejections, first_epsilons):
        if any(np.isclose(epsilon, chosen) for chosen in annotate_epsilons):
            axes.annotate(f"ε={epsilon:.3g}", (bias, rejection), fontsize=7,
                          xytext=(-6, -4), textcoords="offset points", ha="right", va="top")
    axes.set_xlim(0, min(1.0, 1.6 * total_variation + 0.05))
    axes.set_ylim(0, min(upper, 1.6 * total_variation + 0.05))
    axes.set_xlabel("bias TV(O, p)")
    axes.set_ylabel("rejection probability 1 − Σ b·q")
    axes.set_title("Bias vs rejection, one token (p = target, q = draft)")
    axes.legend(fontsize=7.5, loc="upper right")
    axes.grid(alpha=0.3)
    return save_figure(figure, path)
