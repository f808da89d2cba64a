"""``specbound report``: one Markdown file and its HTML twin from a results directory.

The report gathers every study found below the directory (each study's results are a
folder with a ``settings.json``, see ``records``), and writes ``report.md``,
``report.html`` and the PNG figures into ``<results>/report/``: the models and settings
used, the run time, the tables of ``tables`` and the figures of ``figures``, and the
papers' qualitative findings checked on our numbers.
"""

from __future__ import annotations

import datetime
import html
import math

import numpy as np
import re
from dataclasses import dataclass
from pathlib import Path

from specbound.studies import figures, tables
from specbound.studies.acceptance import METHOD_LABELS, acceptance_summary, gap_summary, unavailable_methods
from specbound.studies.bias import REFERENCE, bias_summary
from specbound.studies.records import SETTINGS_FILE, StudyResults, read_results
from specbound.studies.rejections import rejections_summary

REPORT_FOLDER = "report"
STUDY_ORDER = ("acceptance", "rejections", "bias")
SWEEP_LABELS = {"decoding_opt": "Decoding-OPT (R = norm((p − q)+))", "decoding_uno": "Decoding-UNO (R = p)"}


# -- a tiny document model, rendered twice ------------------------------------------------
@dataclass(frozen=True)
class Heading:
    level: int
    text: str


@dataclass(frozen=True)
class Paragraph:
    text: str  # `code` spans allowed


@dataclass(frozen=True)
class Bullets:
    items: list  # `code` spans allowed


@dataclass(frozen=True)
class Table:
    headers: list
    rows: list


@dataclass(frozen=True)
class Image:
    path: str  # relative to the report
    caption: str


def _cell(value) -> str:
    return tables.estimate(value) if not isinstance(value, str) else value


def to_markdown(blocks) -> str:
    lines = []
    for block in blocks:
        if isinstance(block, Heading):
            lines += ["#" * block.level + " " + block.text, ""]
        elif isinstance(block, Paragraph):
            lines += [block.text, ""]
        elif isinstance(block, Bullets):
            lines += [f"- {item}" for item in block.items] + [""]
        elif isinstance(block, Table):
            lines.append("| " + " | ".join(map(str, block.headers)) + " |")
            lines.append("|" + "---|" * len(block.headers))
            for row in block.rows:
                lines.append("| " + " | ".join(_cell(value).replace("|", "\\|") for value in row) + " |")
            lines.append("")
        elif isinstance(block, Image):
            lines += [f"![{block.caption}]({block.path})", "", f"*{block.caption}*", ""]
    return "\n".join(lines)


def _inline_html(text: str) -> str:
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text, quote=False))


def to_html(blocks, title: str) -> str:
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto;line-height:1.45}"
        "table{border-collapse:collapse;margin:1em 0;font-size:0.9em}"
        "td,th{border:1px solid #bbb;padding:3px 8px;text-align:right}th{background:#eee}"
        "td:first-child,th:first-child{text-align:left}img{max-width:100%}"
        "figcaption{font-style:italic;color:#444}code{background:#f4f4f4}</style>",
        "</head><body>",
    ]
    for block in blocks:
        if isinstance(block, Heading):
            parts.append(f"<h{block.level}>{_inline_html(block.text)}</h{block.level}>")
        elif isinstance(block, Paragraph):
            parts.append(f"<p>{_inline_html(block.text)}</p>")
        elif isinstance(block, Bullets):
            parts.append("<ul>" + "".join(f"<li>{_inline_html(item)}</li>" for item in block.items) + "</ul>")
        elif isinstance(block, Table):
            parts.append("<table><tr>" + "".join(f"<th>{html.escape(str(h))}</th>" for h in block.headers) + "</tr>")
            for row in block.rows:
                parts.append("<tr>" + "".join(f"<td>{html.escape(_cell(value))}</td>" for value in row) + "</tr>")
            parts.append("</table>")
        elif isinstance(block, Image):
            parts.append(f'<figure><img src="{html.escape(block.path)}" alt="{html.escape(block.caption)}">'
                         f"<figcaption>{html.escape(block.caption)}</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts)


# -- finding and describing results ---------------------------------------------------------
def find_results(directory) -> list[StudyResults]:
    """Every study's results below ``directory`` (itself included), in study order."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"results: {directory} is not a directory")
    found = [read_results(path.parent) for path in sorted(directory.rglob(SETTINGS_FILE))
             if REPORT_FOLDER not in path.relative_to(directory).parts]
    found = [results for results in found if results.runs]
    if not found:
        raise ValueError(f"results: no study results (a folder with {SETTINGS_FILE} and finished runs) below {directory}")
    return sorted(found, key=lambda r: (STUDY_ORDER.index(r.settings["study"]), r.settings["dataset"]))


def _settings_blocks(studies: list[StudyResults], root: Path) -> list:
    overview = []
    blocks = []
    for results in studies:
        settings = results.settings
        models = settings["models"]
        folder = str(results.directory.relative_to(root)) or "."
        overview.append([
            settings["study"], settings["dataset"], folder,
            f"{models.get('target')} / {models.get('draft')} ({models.get('dtype')})",
            str(len(results.runs)), f"{results.total_seconds / 60:.1f} min",
        ])
        shown = [[key, _setting(value)] for key, value in settings.items()
                 if key not in ("study", "dataset", "models")]
        blocks += [Heading(3, f"{settings['study']} / {settings['dataset']} settings"), Table(["setting", "value"], shown)]
    first = studies[0].settings["models"]
    return [
        Heading(2, "Models, settings and run time"),
        Paragraph(
            f"Target `{first.get('target')}`, draft `{first.get('draft')}`, {first.get('dtype')}; vocabulary of "
            f"{first.get('vocab_size')} tokens shared by both; prompts formatted as {first.get('prompt_format')}. "
            "Target and draft logits go through the same processing (temperature, top-k, top-p). Run time is the "
            "wall-clock of the finished runs (generation, scoring and exact computations), on this machine."
        ),
        Table(["study", "dataset", "folder", "target / draft", "runs", "run time"], overview),
        Paragraph("Where the time went (wall-clock; generate = the engine's generation, score = the two "
                  "scoring forwards, the rest = exact computations from the rows):"),
        Table(*tables.phase_table(studies)),
        *blocks,
    ]


def _setting(value) -> str:
    if isinstance(value, list):
        return ", ".join(_setting(item) for item in value)
    if value is None:
        return "—"
    return f"{value:g}" if isinstance(value, float) else str(value)


# -- the acceptance study -------------------------------------------------------------------
def _acceptance_blocks(studies: list[StudyResults], figure_dir: Path) -> list:
    blocks = [
        Heading(2, "Acceptance study (Hu et al., SPEC §5)"),
        Paragraph(
            "At every position of real generations (the target's own text, sampled by the engine), each method's "
            "acceptance is computed exactly from that position's (target, draft) distributions — not by sampling. "
            "The target rows are the laws the engine sampled each token from; the draft rows come from one forward "
            "of the draft over the whole generation. Numbers are per-token averages: every generated position of "
            "every prompt counts once; ± is one standard error over prompts (prompts as independent clusters). "
            "α* is the best acceptance any lossless verifier can reach with the same drafts."
        ),
        *_tail_blocks(studies),
        Heading(3, "Acceptance per token, method × dataset"),
        Table(*tables.acceptance_table(studies)),
    ]
    for results in studies:
        dataset = tables.dataset_label(results)
        summary = acceptance_summary(results)
        temperature, count = tables.headline_setting(results)
        missing = unavailable_methods(results)
        if missing:
            blocks.append(Paragraph(f"{dataset}: not computed (no exact algorithm at this size), shown as —: "
                                    + "; ".join(f"{key} ({reason})" for key, reason in missing.items())))
        blocks += [Heading(3, f"{dataset}: gaps to the optimum"), Table(*tables.gap_table(results))]
        blocks += _acceptance_findings(results, summary)
        settings = results.settings
        for by, values, label in (("temperature", settings["temperatures"], "temperature"),
                                  ("num_drafts", settings["num_drafts"], "number of drafts n")):
            if len(values) < 2:
                continue
            blocks += [Heading(3, f"{dataset}: acceptance vs {label}"), Table(*tables.ablation_table(results, by))]
            path = figure_dir / f"acceptance_{_slug(dataset)}_vs_{by}.png"
            keys = [(value, count) if by == "temperature" else (temperature, value) for value in values]
            curves = {
                METHOD_LABELS[m]: ([summary.get(key + (m,), (math.nan,))[0] for key in keys],
                                   [summary.get(key + (m,), (math.nan, math.nan))[1] for key in keys])
                for m in settings["methods"] if any(key + (m,) in summary for key in keys)
            }
            optimum = {label: curve for label, curve in curves.items() if label.startswith("α*")}
            verifiers = {label: curve for label, curve in curves.items() if not label.startswith("α*")}
            fixed = f"n = {count}" if by == "temperature" else f"T = {temperature:g}"
            figures.plot_acceptance_curves(
                values, verifiers, optimum, label, f"{dataset}: exact acceptance vs {label} ({fixed})", path
            )
            blocks.append(Image(f"{path.parent.name}/{path.name}",
                                f"{dataset}: acceptance per token vs {label}, {fixed}; dashed: optima α*"))
    return blocks


def _tail_blocks(studies: list[StudyResults]) -> list:
    """How far the tail cut can have moved any number (records without it: exact)."""
    lines = []
    for results in studies:
        budget = results.settings.get("tail_budget", 0.0)
        bounds = [record["tail_bound"] for record in results.positions if "tail_bound" in record]
        if budget > 0 and bounds:
            masses = np.array([record["tail_mass"] for record in results.positions])
            lines.append(
                f"{tables.dataset_label(results)}: budget {budget:g}; dropped mass per position at most "
                f"{masses[:, 0].max():.1e} (target), {masses[:, 1].max():.1e} (draft); bound B at most "
                f"{max(bounds):.1e}, mean {np.mean(bounds):.1e}"
            )
    if not lines:
        return []
    return [Paragraph(
        "Before the exact computations each row pair drops its least likely tokens (smallest max(p, q)), "
        "renormalised, while B = δp + δq·Σ_{i<n} 1/(1 − S_i) stays within a budget (δ: dropped masses, S_i: mass "
        "of the draft’s i largest tokens, one cut per number of drafts n). Σ min(p, q) and every α* move by at "
        "most B (proof in `specbound.studies.acceptance`); the tests check B for the verifiers too. It keeps "
        "about two thousand tokens of the vocabulary at n = 3 (median) and makes the exact computations ~10× faster. Per position:"
    ), Bullets(lines)]


def _acceptance_findings(results: StudyResults, summary: dict) -> list:
    """The papers' qualitative findings, checked on these numbers."""
    lines = []
    settings = results.settings
    gaps_to_optimum = gap_summary(results)
    for temperature in settings["temperatures"]:
        for count in settings["num_drafts"]:
            def value(method):
                entry = summary.get((temperature, count, method))
                return None if entry is None or math.isnan(entry[0]) else entry[0]  # no comparison with NaN

            without, with_ = value("optimal_without_replacement"), value("optimal_with_replacement")
            rrs_without, rrs = value("rrs_without_replacement"), value("rrs")
            facts = []
            if without is not None and with_ is not None:
                facts.append(f"α* without replacement {without:.4f} vs with {with_:.4f} "
                             f"({'without wins' if without > with_ else 'with wins' if with_ > without else 'tie'})")
            if rrs_without is not None and rrs is not None:
                facts.append(f"RRS without {rrs_without:.4f} vs with {rrs:.4f}")
            greedy = value("greedy")
            if greedy is not None and rrs_without is not None:
                facts.append(f"greedy {greedy:.4f} vs RRS without replacement {rrs_without:.4f} "
                             f"({'greedy wins' if greedy > rrs_without else 'greedy loses' if greedy < rrs_without else 'tie'})")
            gaps = [f"{m} {tables.estimate(gaps_to_optimum[(temperature, count, m)])}" for m in settings["methods"]
                    if (temperature, count, m) in gaps_to_optimum]
            if gaps:
                facts.append("gaps to α*: " + ", ".join(gaps))
            if facts:
                lines.append(f"T = {temperature:g}, n = {count}: " + "; ".join(facts) + ".")
    if not lines:
        return []
    return [Paragraph("Findings of the papers, checked here (per-token means):"), Bullets(lines)]


# -- the rejections study -------------------------------------------------------------------
def _rejections_blocks(results: StudyResults, figure_dir: Path) -> list:
    dataset = tables.dataset_label(results)
    summary = rejections_summary(results)
    blocks = [
        Heading(2, f"Theory vs practice: rejections ({dataset}; Yin et al., SPEC §1–§3)"),
        Paragraph(
            "Each configuration (M drafts at the root, lookahead γ; γ = ∞ drafts to the horizon, the paper's K = ∞) "
            "generates a fixed horizon of T tokens with the engine. Measured: the engine's rejections (steps that "
            "ended with a residual token) and target calls. Predicted: along the very same trace, the exact "
            "conditional expectation of the rejections for the engine's rounds (`studies.trace_theory`) — an "
            "unbiased estimate, so measured − predicted should be 0 within its standard error. Thm 1 / Thm 3: the "
            "papers' K = ∞ formula along the trace (for M = 1 it is Σ_t TV(p_t, q_t)); T / N_rej is the paper's "
            "acceleration. Means over prompts ± one standard error."
        ),
        Table(*tables.rejections_table(results)),
    ]
    for temperature in results.settings["temperatures"]:
        rows = [row for row in summary if row["temperature"] == temperature]
        if not rows:
            continue
        path = figure_dir / f"rejections_{_slug(dataset)}_T{temperature:g}.png"
        figures.plot_rejections(
            [row["config"] for row in rows],
            _columns(rows, "measured_rejections"), _columns(rows, "predicted_rejections"),
            _columns(rows, "theorem_rejections"), rows[0]["horizon"], path,
            f"{dataset}, T = {temperature:g}: rejections per sequence",
        )
        blocks.append(Image(f"{path.parent.name}/{path.name}",
                            f"{dataset}, temperature {temperature:g}: measured vs predicted rejections (±2 s.e.)"))
    return blocks


def _columns(rows, key):
    return [row[key][0] for row in rows], [row[key][1] for row in rows]


# -- the bias study -------------------------------------------------------------------------
def _bias_blocks(results: StudyResults, figure_dir: Path) -> list:
    dataset = tables.dataset_label(results)
    summary = bias_summary(results)
    settings = results.settings
    blocks = [
        Heading(2, f"Bias vs rejections: Decoding-OPT and Decoding-UNO ({dataset}; Yin et al. §4)"),
        Paragraph(
            "Yin et al. judged output quality by win rates under reward models and GPT-4, which we do not have. "
            "We report instead the exact per-token bias TV(output law, target law), computed from the (target, "
            "draft) distributions at every position of real generations: it is exactly what the theorems bound, it "
            "needs no judge, and it has no sampling noise at each position — a better-defined measure of quality "
            "loss. Per-token means ± one standard error over prompts. Decoding-OPT sits on the Pareto front "
            "(bias + rejection = TV at every position, Thm 5); Decoding-UNO, with the same acceptance rule, pays "
            "more bias for the same rejection rate. Speed is measured with the engine (chains, "
            f"γ = {settings['gamma']}) against the lossless chain; tokens per target call is machine-independent, "
            "tokens per second is wall-clock on this CPU."
        ),
        Table(*tables.bias_table(results)),
    ]
    for temperature in settings["temperatures"]:
        front = summary["front"].get(temperature)
        if front is None:
            continue
        sweeps, gains = {}, {}
        for method in settings["methods"]:
            points = [summary["points"][(temperature, method, e)] for e in settings["epsilons"]]
            sweeps[SWEEP_LABELS[method]] = ([p["bias"][0] for p in points], [p["rejection"][0] for p in points], settings["epsilons"])
            measured = [summary["measured"].get((temperature, f"{method},ε={e:g}")) for e in settings["epsilons"]]
            if all(m and m["gain_per_call"] for m in measured):
                gains[SWEEP_LABELS[method]] = [m["gain_per_call"] for m in measured]
        path = figure_dir / f"bias_front_{_slug(dataset)}_T{temperature:g}.png"
        figures.plot_bias_front(front[0], sweeps, path, f"{dataset}, T = {temperature:g}: bias vs rejection per token")
        blocks.append(Image(f"{path.parent.name}/{path.name}",
                            f"{dataset}, temperature {temperature:g}: real-data points against the theoretical front"))
        if gains:
            path = figure_dir / f"bias_speed_{_slug(dataset)}_T{temperature:g}.png"
            figures.plot_speed_gain(settings["epsilons"], gains, path,
                                    f"{dataset}, T = {temperature:g}: measured speed gain")
            blocks.append(Image(f"{path.parent.name}/{path.name}",
                                f"{dataset}, temperature {temperature:g}: tokens per target call relative to the "
                                "lossless chain"))
    reference = [run for run in results.runs if run["config"] == REFERENCE]
    if reference:
        blocks.append(Paragraph(f"Reference generations: {len(reference)}, "
                                f"{sum(len(run['tokens']) for run in reference)} tokens in all."))
    return blocks


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def write_report(directory) -> Path:
    """Write ``report.md``, ``report.html`` and the figures into ``<directory>/report/``;
    return the Markdown file's path."""
    root = Path(directory)
    studies = find_results(root)
    output = root / REPORT_FOLDER
    figure_dir = output / "figures"
    figure_dir.mkdir(parents=True, exist_ok=True)
    title = "specbound study report"
    blocks = [
        Heading(1, title),
        Paragraph(f"Generated {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')} from `{root}`. "
                  f"Total run time of the studies: {sum(r.total_seconds for r in studies) / 60:.1f} min."),
    ]
    blocks += _settings_blocks(studies, root)
    acceptance = [results for results in studies if results.settings["study"] == "acceptance"]
    if acceptance:
        blocks += _acceptance_blocks(acceptance, figure_dir)
    for results in studies:
        if results.settings["study"] == "rejections":
            blocks += _rejections_blocks(results, figure_dir)
        elif results.settings["study"] == "bias":
            blocks += _bias_blocks(results, figure_dir)
    markdown_path = output / "report.md"
    markdown_path.write_text(to_markdown(blocks), encoding="utf-8")
    (output / "report.html").write_text(to_html(blocks, title), encoding="utf-8")
    return markdown_path
