"""The acceptance study's tables and report section [HU] §5: per-token means with standard
errors over prompts, each verifier's gap to its scheme's α*, the ablations over
temperature and n, the papers' qualitative findings checked on the numbers, and our table
beside [HU]'s published one (``published``): the orderings and the gaps to α*, not the values.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from specbound.plots.studies import plot_acceptance_curves
from specbound.statistics import grouped_per_token_means
from specbound.studies.acceptance_methods import (DEFAULT_NUM_DRAFTS, DEFAULT_TEMPERATURE, acceptance_methods,
                                                  bound_of, method_label)
from specbound.studies.document import Bullets, Heading, Image, Paragraph, Table, estimate, slug
from specbound.studies.published import MODEL_PAIR, NOT_COMPARABLE, PUBLISHED, PublishedTable
from specbound.studies.records import StudyResults


def acceptance_summary(results: StudyResults) -> dict[tuple, tuple[float, float, int]]:
    """(temperature, num_drafts, method) -> (per-token mean, standard error over prompts,
    positions). A method that could not be computed for some prompt at (temperature, n) has
    no entry there, so no average is taken over a subset of the prompts."""
    missing = {(run["temperature"], key) for run in results.runs for key in run.get("unavailable", {})}
    summary = {}
    for method in results.settings["methods"]:
        means = grouped_per_token_means(
            [record for record in results.positions if method in record["acceptance"]],
            group=lambda record: (record["temperature"], record["num_drafts"]),
            value=lambda record, method=method: record["acceptance"][method],
        )
        for (temperature, num_drafts), value in means.items():
            if (temperature, f"{method}, n={num_drafts}") not in missing:  # not on a subset of prompts
                summary[(temperature, num_drafts, method)] = value
    return summary


def difference_summary(results: StudyResults, first: str, second: str,
                       available: dict | None = None) -> dict[tuple, tuple[float, float, int]]:
    """(temperature, num_drafts) -> per-token mean of first_t − second_t over the positions
    where both are computed, its standard error over prompts and the positions. Paired: both
    values come from the same rows, so the prompt-to-prompt spread they share cancels and the
    error is the difference's own, usually far smaller than either mean's. Cells
    ``acceptance_summary`` (or ``available``, its value) leaves out for either method are left
    out."""
    available = acceptance_summary(results) if available is None else available
    means = grouped_per_token_means(
        [record for record in results.positions if {first, second} <= record["acceptance"].keys()],
        group=lambda record: (record["temperature"], record["num_drafts"]),
        value=lambda record: record["acceptance"][first] - record["acceptance"][second],
    )
    return {key: value for key, value in means.items() if {key + (first,), key + (second,)} <= available.keys()}


def gap_summary(results: StudyResults) -> dict[tuple, tuple[float, float, int]]:
    """(temperature, num_drafts, verifier) -> per-token mean of α*_t − α_t (the verifier's
    gap to its scheme's optimum at the same position), its standard error over prompts
    (paired, ``difference_summary``) and the positions."""
    available = acceptance_summary(results)
    differences = {}  # (α*, verifier) -> its difference_summary, over every n at once
    summary = {}
    for method in results.settings["methods"]:
        for num_drafts in results.settings["num_drafts"]:
            bound = bound_of(method, num_drafts)
            if bound not in results.settings["methods"]:
                continue
            if (bound, method) not in differences:
                differences[(bound, method)] = difference_summary(results, bound, method, available)
            for (temperature, count), value in differences[(bound, method)].items():
                if count == num_drafts:
                    summary[(temperature, count, method)] = value
    return summary


def unavailable_methods(results: StudyResults) -> dict[str, str]:
    """"method, n=k" -> why it has no exact value (first reason met), over all runs."""
    reasons = {}
    for run in results.runs:
        for key, reason in run.get("unavailable", {}).items():
            reasons.setdefault(key, reason)
    return reasons


# -- tables ---------------------------------------------------------------------------------
def headline_setting(results: StudyResults) -> tuple[float, int]:
    """The (temperature, n) of the main table: [HU]'s defaults when they were run."""
    temperatures, counts = results.settings["temperatures"], results.settings["num_drafts"]
    temperature = DEFAULT_TEMPERATURE if DEFAULT_TEMPERATURE in temperatures else temperatures[0]
    num_drafts = DEFAULT_NUM_DRAFTS if DEFAULT_NUM_DRAFTS in counts else counts[0]
    return temperature, num_drafts


def _methods_in(studies: list[StudyResults]) -> list[str]:
    return list(dict.fromkeys(method for results in studies for method in results.settings["methods"]))


def acceptance_table(studies: list[StudyResults]) -> tuple[list[str], list[list]]:
    """[HU]'s layout: one row per method, one column per dataset, at each dataset's headline
    (temperature, n); per-token acceptance ± standard error over prompts."""
    summaries = [(acceptance_summary(results), headline_setting(results)) for results in studies]
    headers = ["method"] + [
        f"{results.settings['dataset']} (T={temperature:g}, n={count})"
        for results, (_, (temperature, count)) in zip(studies, summaries)
    ]
    rows = [[method_label(method)] + [estimate(summary.get((temperature, count, method)))
                                      for summary, (temperature, count) in summaries]
            for method in _methods_in(studies)]
    return headers, rows


def gap_table(results: StudyResults) -> tuple[list[str], list[list]]:
    """Each verifier's gap to its draft scheme's optimum α*, per (temperature, n): the
    per-token mean of α*_t − α_t ± its standard error over prompts; a positive gap is
    acceptance the verifier leaves unused."""
    gaps = gap_summary(results)
    verifiers = [m for m in results.settings["methods"] if any(key[2] == m for key in gaps)]
    headers = ["T", "n"] + [f"{method_label(m)}: α* − α" for m in verifiers]
    rows = []
    for temperature in results.settings["temperatures"]:
        for count in results.settings["num_drafts"]:
            rows.append([f"{temperature:g}", str(count)]
                        + [estimate(gaps.get((temperature, count, method))) for method in verifiers])
    return headers, rows


def ablation_table(results: StudyResults, by: str) -> tuple[list[str], list[list]]:
    """Acceptance per method against temperature (``by="temperature"``, at the headline n)
    or against n (``by="num_drafts"``, at the headline temperature)."""
    summary = acceptance_summary(results)
    temperature, count = headline_setting(results)
    values = results.settings["temperatures"] if by == "temperature" else results.settings["num_drafts"]
    headers = ["method"] + [f"T={value:g}" if by == "temperature" else f"n={value}" for value in values]
    rows = []
    for method in results.settings["methods"]:
        row = [method_label(method)]
        for value in values:
            key = (value, count, method) if by == "temperature" else (temperature, value, method)
            row.append(estimate(summary.get(key)))
        rows.append(row)
    return headers, rows


# -- report ---------------------------------------------------------------------------------
# The papers' qualitative claims checked on the numbers: (what, first method, second method).
PAPER_COMPARISONS = (
    ("α* without vs with replacement", "optimal_without_replacement", "optimal_with_replacement"),
    ("RRS without vs with replacement", "rrs_without_replacement", "rrs"),
    ("greedy vs RRS without replacement", "greedy", "rrs_without_replacement"),
    ("K-SEQ vs RRS", "kseq", "rrs"),
    ("Global Resolution vs K-SEQ", "global_resolution", "kseq"),
    ("Global Resolution vs RRS", "global_resolution", "rrs"),
)


def acceptance_report(studies: list[StudyResults], figure_dir: Path) -> list:
    blocks = [
        Heading(2, "Acceptance study (Hu et al., SPEC.md §5)"),
        Paragraph(
            "At every position of real generations (the target's own text, sampled by the engine), each method's "
            "acceptance is computed exactly from that position's (target, draft) distributions — not by sampling. "
            "The target rows are the laws the engine sampled each token from; the draft rows come from one forward "
            "of the draft over the whole generation. Numbers are per-token averages: every generated position of "
            "every prompt counts once; ± is one standard error over prompts (prompts as independent clusters). "
            "α* is the best acceptance any lossless verifier can reach with the same drafts."
        ),
        *_tail_blocks(studies),
        *scale_blocks(studies),
        Heading(3, "Acceptance per token, method × dataset"),
        Table(*acceptance_table(studies)),
        *_published_section(studies),
    ]
    for results in studies:
        dataset = results.settings["dataset"]
        summary = acceptance_summary(results)
        temperature, count = headline_setting(results)
        missing = unavailable_methods(results)
        if missing:
            blocks.append(Paragraph(f"{dataset}: not computed (no exact algorithm at this size), shown as —: "
                                    + "; ".join(f"{key} ({reason})" for key, reason in missing.items())))
        blocks += [Heading(3, f"{dataset}: gaps to the optimum"), Table(*gap_table(results))]
        data = write_prompt_means(results, figure_dir.parent / f"acceptance_{slug(dataset)}_prompts.csv")
        blocks.append(Paragraph(
            f"{dataset}, per prompt: `{data.name}` (one line per prompt, temperature and n: its positions and each "
            "method's mean over them, and the largest tail bound B). Every per-token mean, standard error and "
            "paired difference of this report is recomputable from it, and runs of other sessions can be pooled "
            "with it (the position records themselves are not kept)."))
        blocks += _findings(results, summary)
        settings = results.settings
        for by, values, label in (("temperature", settings["temperatures"], "temperature"),
                                  ("num_drafts", settings["num_drafts"], "number of drafts n")):
            if len(values) < 2:
                continue
            blocks += [Heading(3, f"{dataset}: acceptance vs {label}"), Table(*ablation_table(results, by))]
            path = figure_dir / f"acceptance_{slug(dataset)}_vs_{by}.png"
            keys = [(value, count) if by == "temperature" else (temperature, value) for value in values]
            optimum, verifiers = {}, {}
            for method in settings["methods"]:
                if not any(key + (method,) in summary for key in keys):
                    continue
                curve = ([summary.get(key + (method,), (math.nan,))[0] for key in keys],
                         [summary.get(key + (method,), (math.nan, math.nan))[1] for key in keys])
                entry = acceptance_methods().get(method)
                is_optimum = entry is not None and entry.verifier is None
                (optimum if is_optimum else verifiers)[method_label(method)] = curve
            fixed = f"n = {count}" if by == "temperature" else f"T = {temperature:g}"
            plot_acceptance_curves(values, verifiers, optimum, label,
                                   f"{dataset}: exact acceptance vs {label} ({fixed})", path)
            blocks.append(Image(f"{path.parent.name}/{path.name}",
                                f"{dataset}: acceptance per token vs {label}, {fixed}; dashed: optima α*"))
    return blocks


def prompt_means(results: StudyResults) -> tuple[list[str], list[list]]:
    """One row per (prompt, temperature, n) in record order: its positions, each method's
    mean over them (empty where not computed at every one of them) and the largest tail
    bound B among them (empty without a tail cut). The per-token mean of a method is
    Σ mean·positions / Σ positions over the rows of a (temperature, n)."""
    methods = results.settings["methods"]
    groups = defaultdict(list)
    for record in results.positions:
        groups[(record["prompt_id"], record["temperature"], record["num_drafts"])].append(record)
    rows = []
    for (prompt, temperature, count), records in groups.items():
        means = [repr(float(np.mean([r["acceptance"][m] for r in records])))
                 if all(m in r["acceptance"] for r in records) else "" for m in methods]
        bounds = [r["tail_bound"] for r in records if "tail_bound" in r]
        rows.append([prompt, repr(temperature), count, len(records), *means, repr(max(bounds)) if bounds else ""])
    return ["prompt_id", "temperature", "num_drafts", "positions", *methods, "max_tail_bound"], rows


def write_prompt_means(results: StudyResults, path: Path) -> Path:
    """``prompt_means`` as a CSV file at ``path``; returns ``path``."""
    headers, rows = prompt_means(results)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(headers)
        writer.writerows(rows)
    return path


PAPER_UNITS = 1024 * 4  # Hu et al.'s table: 1024 prompts on each of four tasks, one temperature


def scale_projection(studies: list[StudyResults]) -> dict | None:
    """The measured mean wall time per unit (over every finished unit of ``studies``, each
    phase and in all) and what Hu et al.'s ``PAPER_UNITS`` units would take at that rate:
    None without timings."""
    timings = [seconds for results in studies for seconds in results.timings.values() if "total" in seconds]
    if not timings:
        return None
    mean = {phase: float(np.mean([seconds.get(phase, 0.0) for seconds in timings]))
            for phase in ("generate", "score", "acceptance", "total")}
    return {"units": len(timings), "mean": mean, "paper_hours": PAPER_UNITS * mean["total"] / 3600}


def scale_blocks(studies: list[StudyResults]) -> list:
    """What the paper's scale costs here, from this report's own per-unit wall times."""
    projection = scale_projection(studies)
    if projection is None:
        return []
    mean, hours = projection["mean"], projection["paper_hours"]
    return [Heading(3, "Cost at the paper's scale"), Paragraph(
        f"Measured here: {projection['units']:,} units, {mean['total']:.1f} s each on average (wall clock per unit: "
        f"generation {mean['generate']:.1f} s, scoring forwards {mean['score']:.1f} s, exact part "
        f"{mean['acceptance']:.1f} s; units of shorter generations cost less). At that rate Hu et al.'s table, "
        f"{PAPER_UNITS:,} units (1024 prompts × 4 tasks × 128 tokens), takes {hours:.1f} h on this machine, and "
        f"about {hours / 4:.1f} h on 4 or {hours / 16:.1f} h on 16 Ray workers like it (`--ray`: each worker "
        "decodes its own batches; Ray's own cost per unit is milliseconds, docs/studies.md “Scale-out with Ray”).")]


def _tail_blocks(studies: list[StudyResults]) -> list:
    """How far the tail cut can have moved any number (records without it: exact)."""
    lines = []
    for results in studies:
        budget = results.settings.get("tail_budget", 0.0)
        bounds = [record["tail_bound"] for record in results.positions if "tail_bound" in record]
        if budget > 0 and bounds:
            masses = np.array([record["tail_mass"] for record in results.positions])
            lines.append(
                f"{results.settings['dataset']}: budget {budget:g}; dropped mass per position at most "
                f"{masses[:, 0].max():.1e} (target), {masses[:, 1].max():.1e} (draft); bound B at most "
                f"{max(bounds):.1e}, mean {np.mean(bounds):.1e}"
            )
    if not lines:
        return []
    return [Paragraph(
        "Before the exact computations each row pair drops its lightest tokens (weight p + F·q, "
        "F = Σ_{i<n} 1/(1 − S_i)), renormalised, while B = δp + δq·F stays within a budget (δ: dropped masses, "
        "S_i: mass of the draft’s i largest tokens, one cut per number of drafts n). Σ min(p, q) and every α* "
        "move by at most B (proof in `specbound.bounds.tail`); the tests check B for the verifiers too. At the "
        "default budget 10⁻⁶ and n = 3 it keeps 30,000 of 151,936 tokens per row on average on the llama.cpp "
        "backend's float32 rows (443 MMLU positions, "
        "`benchmarks/results/studies/tail_kept_tokens_amx_xeon.json`). "
        "Per position:"
    ), Bullets(lines)]


def _findings(results: StudyResults, summary: dict) -> list:
    """The papers' qualitative findings (``PAPER_COMPARISONS``) and every gap to α*,
    checked on these numbers: each comparison's paired difference ± 2 s.e., and a verdict
    only where it lies beyond them (``paired_higher``)."""
    lines = []
    settings = results.settings
    gaps_to_optimum = gap_summary(results)
    differences = {(first, second): difference_summary(results, first, second, summary)
                   for _, first, second in PAPER_COMPARISONS}
    for temperature in settings["temperatures"]:
        for count in settings["num_drafts"]:
            def value(method):
                entry = summary.get((temperature, count, method))
                return None if entry is None or math.isnan(entry[0]) else entry[0]

            facts = []
            for what, first, second in PAPER_COMPARISONS:
                a, b = value(first), value(second)
                difference = differences[(first, second)].get((temperature, count))
                if a is not None and b is not None and difference is not None:
                    winner = paired_higher(first, second, difference)
                    verdict = f"{method_label(winner)} higher" if winner else "not resolved"
                    facts.append(f"{what}: {a:.4f} vs {b:.4f}, difference {_signed(difference)} ({verdict})")
            gaps = [f"{m} {estimate(gaps_to_optimum[(temperature, count, m)])}" for m in settings["methods"]
                    if (temperature, count, m) in gaps_to_optimum]
            if gaps:
                facts.append("gaps to α*: " + ", ".join(gaps))
            if facts:
                lines.append(f"T = {temperature:g}, n = {count}: " + "; ".join(facts) + ".")
    if not lines:
        return []
    return [Paragraph("Findings of the papers, checked here (per-token means; each difference paired over the "
                                "same positions, ± 2 standard errors over prompts):"), Bullets(lines)]


def _higher(first: str, second: str, a: float, b: float) -> str | None:
    """The method of the larger value, None for a tie."""
    return first if a > b else second if b > a else None


# -- beside the published table ---------------------------------------------------------------
def _two_errors(value):
    """(mean, se, positions) -> (mean, 2 se): an interval of two standard errors."""
    return None if value is None else (value[0], 2 * value[1])


def paired_higher(first: str, second: str, difference) -> str | None:
    """The method a paired difference first − second (``difference_summary``'s (mean, se,
    positions)) puts higher, where its mean lies more than two standard errors from 0; None
    where it does not, where it is missing, or has no error estimate (one prompt)."""
    if difference is None or math.isnan(difference[1]):
        return None
    mean, error = difference[0], difference[1]
    if mean > 2 * error:
        return first
    if mean < -2 * error:
        return second
    return None


def _signed(value) -> str:
    """(mean, se, ...) -> "+mean ± 2 se": a paired difference and its two standard errors
    ("—" for none)."""
    if value is None:
        return "—"
    mean, error = round(value[0], 4) + 0.0, value[1]
    return f"{mean:+.4f}" if math.isnan(error) else f"{mean:+.4f} ± {2 * error:.4f}"


def published_gap(published: PublishedTable, method: str, num_drafts: int) -> float | None:
    """[HU]'s α* − α for ``method`` from their figures, where both are published."""
    bound = bound_of(method, num_drafts)
    if bound is None or not {method, bound} <= published.acceptance.keys():
        return None
    return published.acceptance[bound] - published.acceptance[method]


def beside_published_table(results: StudyResults, published: PublishedTable | None) -> tuple[list[str], list[list]]:
    """One row per method at the headline (T, n): ours, per-token mean ± 2 s.e., and its gap
    to its α* (``gap_summary``, paired, ± 2 s.e.); then [HU]'s figure and their gap, where
    ``published`` is given (no published columns otherwise)."""
    summary, gaps = acceptance_summary(results), gap_summary(results)
    temperature, count = headline_setting(results)
    headers = ["method", "ours (± 2 s.e.)", "ours: α* − α"]
    if published is not None:
        headers += [f"Hu et al., {published.task}", "Hu et al.: α* − α"]
    rows = []
    for method in results.settings["methods"]:
        key = (temperature, count, method)
        row = [method_label(method), estimate(_two_errors(summary.get(key))), estimate(_two_errors(gaps.get(key)))]
        if published is not None:
            row += [estimate(published.acceptance.get(method), 3), estimate(published_gap(published, method, count), 3)]
        rows.append(row)
    return headers, rows


def ordering_verdicts(results: StudyResults, published: PublishedTable) -> list[str]:
    """For each of ``PAPER_COMPARISONS`` that [HU]'s figures order: their ordering, ours at
    the headline (T, n), and whether they agree; ours is judged by the paired per-token
    difference of the two methods (``difference_summary``), only where it lies more than two
    standard errors from 0 ("not resolved at this sample size" otherwise)."""
    summary = acceptance_summary(results)
    temperature, count = headline_setting(results)
    lines = []
    for what, first, second in PAPER_COMPARISONS:
        if not {first, second} <= published.acceptance.keys():
            continue
        theirs = _higher(first, second, published.acceptance[first], published.acceptance[second])
        if theirs is None:
            continue
        ours_first, ours_second = summary.get((temperature, count, first)), summary.get((temperature, count, second))
        line = (f"{what}: Hu et al. {method_label(theirs)} higher ({published.acceptance[first]:.3f} vs "
                f"{published.acceptance[second]:.3f})")
        if ours_first is None or ours_second is None:
            lines.append(line + "; ours not measured.")
            continue
        difference = difference_summary(results, first, second, summary).get((temperature, count))
        ours = paired_higher(first, second, difference)
        values = (f"{ours_first[0]:.4f} vs {ours_second[0]:.4f}, difference {_signed(difference)} "
                  "(± 2 s.e., paired over prompts)")
        if ours is None:
            lines.append(line + f"; ours {values}: not resolved at this sample size.")
        else:
            agreement = "the orderings agree" if ours == theirs else "the orderings differ"
            lines.append(line + f"; ours {method_label(ours)} higher ({values}): {agreement}.")
    return lines


def published_blocks(results: StudyResults) -> list:
    """One dataset's table beside [HU]'s task (``PUBLISHED``), with the ordering verdicts;
    a dataset without published figures gets our columns and says why."""
    dataset = results.settings["dataset"]
    published = PUBLISHED.get(dataset)
    temperature, count = headline_setting(results)
    beside = f" beside Hu et al.'s {published.task}" if published else ""
    blocks = [Heading(4, f"{dataset} (T = {temperature:g}, n = {count}){beside}"),
              Table(*beside_published_table(results, published))]
    if published is None:
        blocks.append(Paragraph(NOT_COMPARABLE.get(dataset, f"{dataset}: no published counterpart in Hu et al.")))
        return blocks
    blocks.append(Paragraph(f"Published figures: {published.source}."))
    verdicts = ordering_verdicts(results, published)
    return blocks + ([Bullets(verdicts)] if verdicts else [])


def _published_section(studies: list[StudyResults]) -> list:
    """Every dataset beside [HU]'s published figures, when some dataset has a counterpart."""
    if not any(results.settings["dataset"] in PUBLISHED.keys() | NOT_COMPARABLE.keys() for results in studies):
        return []
    return [
        Heading(3, "Beside Hu et al.'s published table"),
        Paragraph(
            f"Hu et al. measured {MODEL_PAIR}, not our pair, so what is compared is the ordering of the methods and "
            "their gaps to α*, not the values. Their figures are quoted in SPEC.md §4.2 and §5 without their "
            "setting and without standard errors (the paper's defaults: 1024 prompts per task, 128 tokens, "
            "T = 0.7, n = 3); ours are at each dataset's headline setting, ± two standard errors over prompts. "
            "Our ordering of two methods is judged by their paired per-token difference (both from the same "
            "rows, its standard error over prompts), only where it lies more than two standard errors from 0."
        ),
        *[block for results in studies for block in published_blocks(results)],
    ]
