"""The studies' tables, as (headers, rows) of plain values: the command line prints them,
the report renders them. Cells holding a (mean, standard error) pair print as "m ± se"."""

from __future__ import annotations

import math

from specbound.studies.acceptance import METHOD_LABELS, acceptance_summary, bound_of, gap_summary
from specbound.studies.bias import REFERENCE, bias_summary
from specbound.studies.records import StudyResults
from specbound.studies.rejections import rejections_summary

DEFAULT_TEMPERATURE = 0.7  # [HU]'s default
DEFAULT_NUM_DRAFTS = 3


def estimate(value, digits: int = 4) -> str:
    """(mean, se[, count]) -> "mean ± se"; a lone number prints with ``digits`` decimals."""
    if value is None:
        return "—"
    if isinstance(value, tuple):
        mean, error = round(value[0], digits) + 0.0, value[1]  # + 0.0: no "-0.0000"
        if math.isnan(error):
            return f"{mean:.{digits}f}"
        return f"{mean:.{digits}f} ± {error:.{digits}f}"
    if isinstance(value, float):
        return "∞" if math.isinf(value) else f"{round(value, digits) + 0.0:.{digits}f}"
    return str(value)


def phase_table(studies: list[StudyResults]) -> tuple[list[str], list[list]]:
    """Wall-clock minutes per phase of each study's finished runs (generation by the engine,
    scoring forwards, exact computations), and the share of each."""
    phases = sorted({phase for results in studies for seconds in results.timings.values() for phase in seconds}
                    - {"total"})
    headers = ["study", "dataset", "runs", *phases, "total", "per run"]
    rows = []
    for results in studies:
        totals = {phase: sum(seconds.get(phase, 0.0) for seconds in results.timings.values()) for phase in phases}
        total = results.total_seconds
        cells = [f"{totals[phase] / 60:.1f} min ({100 * totals[phase] / total:.0f}%)" if total else "—" for phase in phases]
        per_run = f"{total / len(results.timings):.0f} s" if results.timings else "—"
        rows.append([results.settings["study"], results.settings["dataset"], str(len(results.timings)), *cells,
                     f"{total / 60:.1f} min", per_run])
    return headers, rows


def dataset_label(results: StudyResults) -> str:
    return results.settings["dataset"]


def headline_setting(results: StudyResults) -> tuple[float, int]:
    """The (temperature, n) of the main table: [HU]'s defaults when they were run."""
    temperatures, counts = results.settings["temperatures"], results.settings["num_drafts"]
    temperature = DEFAULT_TEMPERATURE if DEFAULT_TEMPERATURE in temperatures else temperatures[0]
    num_drafts = DEFAULT_NUM_DRAFTS if DEFAULT_NUM_DRAFTS in counts else counts[0]
    return temperature, num_drafts


def acceptance_table(studies: list[StudyResults]) -> tuple[list[str], list[list]]:
    """[HU]'s layout: one row per method, one column per dataset, at each dataset's headline
    (temperature, n); per-token acceptance ± standard error over prompts."""
    summaries = [(acceptance_summary(results), headline_setting(results)) for results in studies]
    methods = [m for m in METHOD_LABELS if any(m in results.settings["methods"] for results in studies)]
    headers = ["method"] + [
        f"{dataset_label(results)} (T={temperature:g}, n={count})"
        for results, (_, (temperature, count)) in zip(studies, summaries)
    ]
    rows = []
    for method in methods:
        row = [METHOD_LABELS[method]]
        for summary, (temperature, count) in summaries:
            row.append(estimate(summary.get((temperature, count, method))))
        rows.append(row)
    return headers, rows


def gap_table(results: StudyResults) -> tuple[list[str], list[list]]:
    """Each verifier's gap to its draft scheme's optimum α*, per (temperature, n): the
    per-token mean of α*_t − α_t ± its standard error over prompts; a positive gap is
    acceptance the verifier leaves unused."""
    gaps = gap_summary(results)
    verifiers = [m for m in results.settings["methods"] if bound_of(m) in results.settings["methods"]]
    headers = ["T", "n"] + [f"{METHOD_LABELS[m]}: α* − α" for m in verifiers]
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
        row = [METHOD_LABELS[method]]
        for value in values:
            key = (value, count, method) if by == "temperature" else (temperature, value, method)
            row.append(estimate(summary.get(key)))
        rows.append(row)
    return headers, rows


def rejections_table(results: StudyResults) -> tuple[list[str], list[list]]:
    headers = [
        "T", "config", "prompts", "measured N_rej", "predicted N_rej", "measured − predicted",
        "Thm 1/3 (K=∞)", "T/N_rej measured", "T/N_rej Thm", "tokens/call measured", "tokens/call predicted",
    ]
    rows = [
        [
            f"{row['temperature']:g}", row["config"], str(row["prompts"]),
            estimate(row["measured_rejections"], 2), estimate(row["predicted_rejections"], 2),
            estimate(row["difference"], 2), estimate(row["theorem_rejections"], 2),
            estimate(row["measured_acceleration"], 2), estimate(row["theorem_acceleration"], 2),
            estimate(row["measured_tokens_per_call"], 2), estimate(row["predicted_tokens_per_call"], 2),
        ]
        for row in rejections_summary(results)
    ]
    return headers, rows


def bias_table(results: StudyResults) -> tuple[list[str], list[list]]:
    summary = bias_summary(results)
    headers = [
        "T", "method", "ε", "bias per token", "rejection per token", "bias + rejection", "mean TV (front)",
        "tokens/call", "gain (tokens/call)", "gain (tokens/s)",
    ]
    rows = []
    for temperature in results.settings["temperatures"]:
        front = summary["front"].get(temperature)
        reference = summary["measured"].get((temperature, REFERENCE))
        if reference:
            rows.append([f"{temperature:g}", "lossless chain", "0", "0 (lossless)", estimate(front),
                         estimate(front), estimate(front), estimate(reference["tokens_per_call"], 3), "1", "1"])
        for method in results.settings["methods"]:
            for epsilon in results.settings["epsilons"]:
                point = summary["points"].get((temperature, method, epsilon), {})
                measured = summary["measured"].get((temperature, f"{method},ε={epsilon:g}"), {})
                total = point["bias"][0] + point["rejection"][0] if point else None
                rows.append([
                    f"{temperature:g}", method, f"{epsilon:g}", estimate(point.get("bias")), estimate(point.get("rejection")),
                    estimate(total), estimate(front),
                    estimate(measured.get("tokens_per_call"), 3), estimate(measured.get("gain_per_call"), 3),
                    estimate(measured.get("gain_per_second"), 3),
                ])
    return headers, rows
