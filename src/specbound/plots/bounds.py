"""Figure of ``specbound bounds plot``: α* and every verifier's exact acceptance against n."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from specbound.plots import save_figure

SCHEME_COLOURS = ("tab:blue", "tab:green", "tab:red", "tab:purple", "tab:orange", "tab:brown")


def plot_acceptance_vs_drafts(numbers: dict, path) -> Path:
    """α* curves (solid, filled dots) and verifier acceptance (dashed, hollow markers drawn
    on top, so a verifier that reaches α* shows as a ring around its dot) against n;
    colour = draft scheme. ``numbers`` is ``tables.bounds.acceptance_vs_drafts``'s."""
    drafts = numbers["num_drafts"]
    figure, axes = plt.subplots(figsize=(9.5, 4.8))
    schemes = list(dict.fromkeys([*numbers["optimum"], *(v["scheme"] for v in numbers["verifiers"].values())]))
    colours = dict(zip(schemes, SCHEME_COLOURS))

    def draw(values, **style):
        points = [(n, value) for n, value in zip(drafts, values) if value is not None]
        if points:
            axes.plot(*zip(*points), **style)

    for scheme, values in numbers["optimum"].items():
        draw(values, color=colours[scheme], lw=2.6, marker="o", markersize=6,
             label=f"α* {scheme.replace('_', ' ')}")
    markers = iter("sDv^<>Px*h+")
    for name, verifier in numbers["verifiers"].items():
        draw(verifier["acceptance"], color=colours[verifier["scheme"]], lw=1.1, ls="--",
             marker=next(markers), markersize=11, markerfacecolor="none", markeredgewidth=1.4,
             zorder=3, label=f"{name} verifier")
    axes.set_xlabel("number of drafts n")
    axes.set_ylabel("acceptance P(output ∈ drafts)")
    axes.set_xticks(drafts)
    legend = ", ".join(f"{colours[scheme].removeprefix('tab:')} {scheme.replace('_', ' ')}" for scheme in schemes)
    axes.set_title("Optimal acceptance α* (solid) and exact verifier acceptance (dashed), "
                   f"V = {len(numbers['target'])}\ncolour = draft scheme: {legend}", fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return save_figure(figure, path)
