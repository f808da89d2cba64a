"""The multi-step study's tables and report section (SPEC.md §7): per (temperature,
configuration) the per-step means of every verifier's E[τ | tree] on the same drafted steps
and their paired gains, the realised tokens per target call, and the ladder where the
multi-step optimum was computed.
"""

from __future__ import annotations

import math
from pathlib import Path

from specbound.plots.studies import plot_multistep_lengths
from specbound.statistics import grouped_per_token_means, per_token_mean
from specbound.studies.document import Heading, Image, Paragraph, Table, estimate, slug
from specbound.studies.records import StudyResults
from specbound.verifiers import get_verifier


# -- summaries ------------------------------------------------------------------------------
def _difference(step: dict, key: str):
    expected = step["expected"]
    return expected[key] - expected["tokenwise"] if key in expected else None


def _ladder(key: str, minus: str | None = None):
    def value(step: dict):
        ladder = step["ladder"]
        if ladder is None:
            return None
        return ladder[key] - (ladder[minus] if minus else 0.0)

    return value


STEP_VALUES = {
    "tokenwise": lambda step: step["expected"]["tokenwise"],
    "block": lambda step: step["expected"].get("block"),
    "traversal": lambda step: step["expected"]["traversal"],
    "block_gain": lambda step: _difference(step, "block"),
    "traversal_gain": lambda step: _difference(step, "traversal"),
    "univer": lambda step: step["expected"].get("univer"),
    "univer_gain": lambda step: _difference(step, "univer"),
    "realised": lambda step: step["accepted"],
    "tree_size": lambda step: step["tree_size"],
    "ladder_tokenwise": _ladder("tokenwise"),
    "ladder_multistep": _ladder("multistep"),
    "best_lossless": _ladder("best_lossless"),
    "coupling_bound": _ladder("coupling_bound"),
    "gap_multistep": _ladder("best_lossless", "multistep"),
    "gap_tokenwise": _ladder("best_lossless", "tokenwise"),
    "coupling_gap": _ladder("coupling_bound", "best_lossless"),
}


def _per_step_mean(steps: list[dict], value) -> tuple[float, float] | None:
    """Mean of ``value`` per drafted step, standard error over prompts; None when no step has one."""
    kept = [step for step in steps if value(step) is not None]
    if not kept:
        return None
    mean, error, _ = grouped_per_token_means(kept, lambda step: (), value)[()]
    return mean, error


def multistep_summary(results: StudyResults) -> list[dict]:
    """Per (temperature, configuration), in the settings' order: the per-step means of every
    ``STEP_VALUES`` entry and the realised tokens per target call (Σ tokens / Σ calls, its
    standard error over prompts)."""
    order = {label: index for index, label in enumerate(results.settings["configs"])}
    runs_by_group, steps_by_group = {}, {}
    for run in results.runs:
        runs_by_group.setdefault((run["temperature"], run["config"]), []).append(run)
    for step in results.positions:
        steps_by_group.setdefault((step["temperature"], step["config"]), []).append(step)
    summary = []
    for key in sorted(runs_by_group, key=lambda key: (key[0], order.get(key[1], len(order)))):
        runs, steps = runs_by_group[key], steps_by_group.get(key, [])
        row = {
            "temperature": key[0], "config": key[1], "family": runs[0]["family"], "depth": runs[0]["depth"],
            "verifiers": runs[0]["verifiers"], "decided_by": runs[0]["decided_by"], "optimum": runs[0]["optimum"],
            "prompts": len(runs), "steps": len(steps),
            "tokens_per_call": per_token_mean([len(run["tokens"]) for run in runs],
                                              [run["engine"]["target_calls"] for run in runs]),
        }
        row.update({name: _per_step_mean(steps, value) for name, value in STEP_VALUES.items()})
        summary.append(row)
    return summary


def multistep_table(results: StudyResults) -> tuple[list[str], list[list]]:
    headers = ["T", "config", "prompts", "steps", "drafted nodes", "token-wise", "block", "traversal", "UniVer",
               "block − token-wise", "traversal − token-wise", "UniVer − token-wise", "realised (decided by)",
               "tokens/call realised"]
    rows = [
        [f"{row['temperature']:g}", row["config"], str(row["prompts"]), str(row["steps"]),
         estimate(row["tree_size"], 2), estimate(row["tokenwise"]), estimate(row["block"]),
         estimate(row["traversal"]), estimate(row["univer"]), estimate(row["block_gain"]),
         estimate(row["traversal_gain"]), estimate(row["univer_gain"]),
         f"{estimate(row['realised'])} ({row['decided_by']})", estimate(row["tokens_per_call"], 3)]
        for row in multistep_summary(results)
    ]
    return headers, rows


def ladder_table(results: StudyResults) -> tuple[list[str], list[list]]:
    headers = ["T", "config", "steps", "token-wise", "block / traversal", "best lossless verifier",
               "coupling bound", "best lossless − block/traversal", "best lossless − token-wise", "optimum"]
    rows = []
    for row in multistep_summary(results):
        computed = row["optimum"] == "computed"
        rows.append([
            f"{row['temperature']:g}", row["config"], str(row["steps"]), estimate(row["ladder_tokenwise"]),
            estimate(row["ladder_multistep"]), estimate(row["best_lossless"]), estimate(row["coupling_bound"]),
            estimate(row["gap_multistep"]), estimate(row["gap_tokenwise"]),
            "computed" if computed else row["optimum"],
        ])
    return headers, rows


# -- the report -----------------------------------------------------------------------------
def _curve(rows: list[dict], key: str) -> tuple[list[float], list[float]]:
    values = [row[key] or (math.nan, math.nan) for row in rows]
    return [value[0] for value in values], [value[1] for value in values]


def _figures(rows: list[dict]) -> list[tuple[str, list, str]]:
    """(file name, panels, caption) of one temperature's figures: E[τ | tree] per verifier
    against γ (chains) and the tree shape, and the ladder where it was computed."""
    chains = [row for row in rows if row["family"] == "chain"]
    trees = [row for row in rows if row["family"] != "chain"]
    panels = []
    for family, xlabel, x_values in (
        (chains, "chain lookahead γ", [row["depth"] for row in chains]),
        (trees, "tree shape (n×d: n drafts per node, d levels; sparse: budget/depth)",
         [row["config"].removeprefix("tree ") for row in trees]),
    ):
        if family:
            labels = {key: get_verifier(name).label for key, name in family[0]["verifiers"].items()}
            if len({row["verifiers"]["tokenwise"] for row in family}) > 1:  # i.i.d. trees beside the others
                labels["tokenwise"] = "RRS of each tree's draft scheme"
            panels.append((xlabel, x_values, {("token-wise: " if key == "tokenwise" else "") + label:
                                              _curve(family, key) for key, label in labels.items()}, {}))
    figures = [("verifiers", panels,
                "expected accepted drafts given the drafted tree, per step and verifier, on the same steps")]
    computed = [row for row in rows if row["best_lossless"] is not None]
    if computed:
        figures.append(("ladder", [(
            "configuration", [row["config"] for row in computed],
            {"token-wise": _curve(computed, "ladder_tokenwise"),
             "block / traversal": _curve(computed, "ladder_multistep")},
            {"best lossless verifier": _curve(computed, "best_lossless"),
             "coupling bound": _curve(computed, "coupling_bound")},
        )], "the ladder, exact over the drafts at each step's prefix"))
    return figures


def multistep_report(results: StudyResults, figure_dir: Path) -> list:
    dataset = results.settings["dataset"]
    summary = multistep_summary(results)
    blocks = [
        Heading(2, f"Multi-step verification: token-wise, block and traversal on the same drafted steps "
                   f"({dataset}; SPEC.md §7)"),
        Paragraph(
            "Each configuration decodes every prompt with the engine; the drafts of a step are drawn once (a chain: "
            "one draw per node; a tree: without replacement), and on that very drafted tree the exact expected "
            "number of accepted drafts E[τ | tree] of each verifier is computed from the target and draft rows of "
            "its nodes (SPEC.md §7.3): token-wise (speculative sampling on chains, RRS without replacement on trees), "
            "block verification (chains), traversal verification (on a chain it is block verification) and "
            "UniVer (SPEC.md §7.5: block verification on a chain, traversal on trees drawn without replacement, so "
            "its column checks that identity there; on the i.i.d. trees, drafted with replacement and decided by "
            "UniVer with Global Resolution plans, token-wise is RRS). Means "
            "per drafted step ± one standard error over prompts; the differences are paired (same steps). "
            "'Realised' is the accepted count of the verifier the engine followed, which E[τ | tree] of that "
            "verifier estimates without the sampling noise; tokens per target call are the engine's."
        ),
        Table(*multistep_table(results)),
        Paragraph(
            "The ladder (SPEC.md §7.4), where the vocabulary is small enough to enumerate the drafted tree's law "
            "and the target's law of sequences (`TreeDrafter`, full forwards at every prefix): at each step's "
            "prefix, each rung exact over the drafts — token-wise ≤ block / traversal ≤ the best lossless verifier "
            "of these drafts ≤ the coupling bound (no lossless verifier reaches it). These are means over the "
            "drafts, not given the drafted tree, so they are less noisy than the table above and are not paired "
            "with it. On chains block verification is the best lossless verifier, so their gap is 0 up to the "
            "LP's tolerance; on trees traversal falls below it. Real vocabularies are far beyond the enumeration: "
            "there the last column says why."
        ),
        Table(*ladder_table(results)),
    ]
    for temperature in results.settings["temperatures"]:
        rows = [row for row in summary if row["temperature"] == temperature]
        for name, panels, caption in _figures(rows):
            path = figure_dir / f"multistep_{name}_{slug(dataset)}_T{temperature:g}.png"
            plot_multistep_lengths(panels, path, f"{dataset}, T = {temperature:g}: {caption}")
            blocks.append(Image(f"{path.parent.name}/{path.name}", f"{dataset}, temperature {temperature:g}: {caption} "
                                "(±2 s.e. over prompts)"))
    return blocks
