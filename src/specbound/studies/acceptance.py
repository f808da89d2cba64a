"""Acceptance study [HU] §5: every method's exact per-step acceptance along real generations.

For each prompt and temperature, the target generates up to ``max_new_tokens`` tokens
through the engine (a lossless chain, so the text follows the target's law); one forward of
each model over the generated sequence gives the (target, draft) rows p_t, q_t at every
position t (``traces``), and every method's acceptance is computed **exactly** from the same
rows, batched over positions — never by sampling:

- ``optimal_<scheme>``: α* of every registered draft scheme, the best any lossless
  verifier can do with those drafts (SPEC.md §4.2, ``DraftScheme.optimum``);
- every registered lossless verifier whose exact acceptance scales to real vocabularies
  (``Verifier.scalable``): ``Verifier.acceptance_rate``, at the verifier's own count when it
  has one (the single draft at n = 1, SpecHub at n = 2, as the papers report them).
Each verifier is compared with its draft scheme's α* at the same number of drafts.

Tail cut (``tail_budget``, default 1e-6): before the exact computations each row pair
drops its least likely tokens, renormalised, while a proven bound B on the move of
Σ min(p, q) and of every α* stays within the budget (``specbound.bounds.tail``, where the
proof is); one cut per number of drafts n, all n from one pass over the row. On the
default pair at T = 0.7, n = 3, this keeps about two thousand of 151,936 tokens per row (a
median). ``tail_budget = 0`` drops only tokens where p = q = 0: exact. B and the dropped
masses are recorded per position.

A position whose draft law has fewer tokens than a distinct-token scheme needs gets as
many drafts as it has tokens, and a verifier fixed to two drafts hands such a position to
``single`` — the rules the engine follows too (``DraftScheme.effective_num_drafts``,
``Verifier.for_num_drafts``).

Records: one per (position, n) with every method's acceptance; the run record holds the
generated tokens, the engine's counts, and the methods left out at some n because they
have no exact algorithm at that size (``unavailable``: method -> the reason), which the
tables show as missing rather than as a number. Tables average per token (all positions of all
prompts pooled) with standard errors over prompts (``statistics``).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specbound import arguments
from specbound.bounds.tail import TailCut, cut_tails
from specbound.checks import finite_number, positive_int
from specbound.datasets import Prompt
from specbound.drafts import DRAFT_SCHEMES, DraftScheme
from specbound.engine import Processing
from specbound.engine.methods import autoregressive, chain
from specbound.models.pair import ModelPair
from specbound.plots.studies import plot_acceptance_curves
from specbound.probability import support_size
from specbound.statistics import grouped_per_token_means
from specbound.studies.base import Study, Unit, UnitOutput, register_study, setting_units
from specbound.studies.document import Bullets, Heading, Image, Paragraph, Table, estimate, slug
from specbound.studies.records import StudyResults
from specbound.studies.traces import TraceRequest, checked_generation_settings, generation_summary, trace_probs
from specbound.verifiers import VERIFIERS, Verifier

DEFAULT_TEMPERATURE = 0.7  # [HU]'s defaults, the headline of the tables
DEFAULT_NUM_DRAFTS = 3


@dataclass(frozen=True)
class AcceptanceMethod:
    """One row of the acceptance tables: the optimum α* of a draft scheme, or a verifier.

    ``count(n)`` is the number of drafts it is evaluated at when the study asks for n;
    ``bound`` names the optimum it is compared with (its draft scheme's α*), None for an
    optimum itself."""

    name: str
    label: str
    scheme: DraftScheme
    fixed_num_drafts: int | None
    verifier: Verifier | None = None

    @property
    def bound(self) -> str | None:
        return None if self.verifier is None else optimum_name(self.scheme)

    def count(self, num_drafts: int) -> int:
        return self.fixed_num_drafts or num_drafts

    def acceptance(self, target_rows, draft_rows, num_drafts: int) -> np.ndarray:
        """Exact acceptance with ``num_drafts`` drafts at every row, each row getting as
        many as its draft law allows (the engine's rule).
        # target_rows, draft_rows [positions, vocab] -> [positions]"""
        counts = self.scheme.effective_num_drafts(num_drafts, support_size(draft_rows))
        acceptance = np.empty(draft_rows.shape[0])
        for count in np.unique(counts):
            rows = counts == count
            acceptance[rows] = self._at(target_rows[rows], draft_rows[rows], int(count))
        return acceptance

    def _at(self, target, draft, count):
        if self.verifier is None:
            return self.scheme.for_num_drafts(count).optimum(target, draft, count).acceptance
        return self.verifier.for_num_drafts(count).acceptance_rate(target, draft, count)


def optimum_name(scheme: DraftScheme) -> str:
    return f"optimal_{scheme.name}"


def acceptance_methods() -> dict[str, AcceptanceMethod]:
    """The study's methods, from the registries: α* of every draft scheme, then every
    lossless per-node verifier whose exact acceptance scales to real vocabularies."""
    methods = {
        optimum_name(scheme): AcceptanceMethod(optimum_name(scheme), f"α* {scheme.label}", scheme,
                                               scheme.fixed_num_drafts)
        for scheme in DRAFT_SCHEMES.values()
    }
    for verifier_class in VERIFIERS.values():
        if verifier_class.lossless and verifier_class.scalable and verifier_class.per_node:
            verifier = verifier_class()
            methods[verifier.name] = AcceptanceMethod(verifier.name, verifier.label, verifier.draft_scheme,
                                                      verifier.fixed_num_drafts, verifier)
    return methods


def method_label(name: str) -> str:
    """A method's table label (its name when it is no longer registered)."""
    method = acceptance_methods().get(name)
    return method.label if method else name


def method_acceptance(method: str, target_rows, draft_rows, num_drafts: int) -> np.ndarray:
    """Exact acceptance of ``method`` (a key of ``acceptance_methods``) asked for with
    ``num_drafts`` drafts, at every row.  # [positions, vocab] x2 -> [positions]"""
    methods = acceptance_methods()
    if method not in methods:
        raise ValueError(f"method: unknown method {method!r}; choose from {', '.join(methods)}")
    entry = methods[method]
    return entry.acceptance(target_rows, draft_rows, entry.count(num_drafts))


DEFAULT_TAIL_BUDGET = 1e-6


@register_study
class AcceptanceStudy(Study):
    """Units: prompts × temperatures; each records all ``num_drafts`` values at once (the
    rows do not depend on n, so the n-ablation costs no extra generation)."""

    name = "acceptance"
    help = "exact per-position acceptance of every method and α* [HU]"
    order = 0

    def __init__(
        self,
        temperatures=(0.7,),
        num_drafts=(3,),
        max_new_tokens: int = 128,
        methods=None,
        top_k: int | None = None,
        top_p: float | None = None,
        generation_gamma: int = 0,
        tail_budget: float = DEFAULT_TAIL_BUDGET,
        workers: int = 1,
    ):
        self.workers = positive_int("workers", workers)
        self._pool = None
        known = acceptance_methods()
        methods = list(known) if methods is None else list(methods)
        for method in methods:
            if method not in known:
                raise ValueError(f"methods: unknown method {method!r}; choose from {', '.join(known)}")
        self.num_drafts = [positive_int("num_drafts", count) for count in num_drafts]
        if not self.num_drafts:
            raise ValueError("num_drafts: expected at least one number of drafts")
        self.tail_budget = finite_number("tail_budget", tail_budget, 0.0, 1e-3)
        self.temperatures = checked_generation_settings(temperatures, max_new_tokens, top_k, top_p)
        self.max_new_tokens = max_new_tokens
        self.methods = methods
        self.top_k, self.top_p = top_k, top_p
        generation_gamma = positive_int("generation_gamma", generation_gamma, minimum=0)
        self.method = chain(generation_gamma) if generation_gamma > 0 else autoregressive()

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        methods = list(acceptance_methods())
        parser.add_argument("--num-drafts", type=arguments.comma_list(int), default=[3],
                            help="numbers of drafts n, comma-separated (default 3; ablation: 2,3,4,6)")
        parser.add_argument("--methods", type=arguments.names(methods), default=methods,
                            help=f"methods, comma-separated (default all: {', '.join(methods)})")
        parser.add_argument("--gamma", type=int, default=0,
                            help="lookahead of the lossless chain that generates the text; 0 = autoregressive "
                            "(default 0)")
        parser.add_argument("--workers", type=arguments.integer(1, os.cpu_count() or 1),
                            default=min(2, os.cpu_count() or 1),
                            help="processes for the exact computations (default: 2, or 1 on one core)")
        parser.add_argument("--tail-budget", type=float, default=DEFAULT_TAIL_BUDGET,
                            help="drop each row's least likely tokens before the exact computations while the "
                            "bound on the move of the acceptances (proven for α*, tested for the verifiers) stays "
                            f"below this (default {DEFAULT_TAIL_BUDGET:g}, recorded per position; 0 = exact)")

    @classmethod
    def from_arguments(cls, args, generation: dict) -> AcceptanceStudy:
        return cls(num_drafts=args.num_drafts, methods=args.methods, generation_gamma=args.gamma,
                   tail_budget=args.tail_budget, workers=args.workers, **generation)

    def settings(self) -> dict:
        return {
            "temperatures": self.temperatures,
            "num_drafts": self.num_drafts,
            "max_new_tokens": self.max_new_tokens,
            "methods": self.methods,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "tail_budget": self.tail_budget,
            "generation": (
                f"engine chain, γ = {self.method.depth}, single-draft speculative sampling (lossless)"
                if self.method.depth else "engine, autoregressive sampling from the target"
            ),
        }

    def units(self, prompts: list[Prompt]) -> list[Unit]:
        return setting_units(prompts, self.temperatures)

    def trace_request(self, pair: ModelPair, unit: Unit) -> TraceRequest:
        processing = Processing(unit.config["temperature"], self.top_k, self.top_p, pair.vocab_size)
        return TraceRequest(processing, self.method, self.max_new_tokens)

    def unit_output(self, pair: ModelPair, unit: Unit, request: TraceRequest, trace) -> UnitOutput:
        temperature, processing = unit.config["temperature"], request.processing
        started = time.perf_counter()
        target_rows, draft_rows = trace_probs(pair, trace, processing)
        scored = time.perf_counter()
        positions, unavailable = [], {}
        for num_drafts, (rows, acceptance, missing) in self.exact(target_rows, draft_rows).items():
            for method, reason in missing.items():  # no exact algorithm at this size (e.g. RRS w/o, n ≥ 4)
                unavailable[f"{method}, n={num_drafts}"] = reason
            for position, token in enumerate(trace.tokens):
                positions.append({
                    "prompt_id": unit.prompt.id,
                    "temperature": temperature,
                    "num_drafts": num_drafts,
                    "position": position,
                    "token": token,
                    "acceptance": {method: float(values[position]) for method, values in acceptance.items()},
                    "tail_mass": [rows[position].dropped_target, rows[position].dropped_draft],
                    "tail_bound": rows[position].bound,
                })
        run = {
            "prompt_id": unit.prompt.id,
            "temperature": temperature,
            "unavailable": unavailable,
            **generation_summary(pair, trace),
        }
        seconds = {
            "generate": trace.seconds,
            "score": scored - started,
            "acceptance": time.perf_counter() - scored,
        }
        return UnitOutput(positions, run, seconds)

    def exact(self, target_rows, draft_rows) -> dict[int, tuple[list[TailCut], dict, dict]]:
        """The exact part of a unit: n -> (each position's tail cut, method -> acceptance
        [positions], method -> why it has no exact value at n), for every n of the study.
        # target_rows, draft_rows [positions, vocab]"""
        cuts = [cut_tails(target, draft, self.tail_budget, self.num_drafts)
                for target, draft in zip(target_rows, draft_rows)]
        exact = {}
        for num_drafts in self.num_drafts:
            rows = [row_cuts[num_drafts] for row_cuts in cuts]
            exact[num_drafts] = (rows, *self._exact(rows, num_drafts))
        return exact

    def _exact(self, rows, num_drafts: int) -> tuple[dict, dict]:
        """Every method at every row: in this process, or split over ``workers`` processes
        (interleaved rows, so each gets a share of the long and the short ones)."""
        pairs = [(cut.target, cut.draft) for cut in rows]
        if self.workers == 1 or len(pairs) < 2 * self.workers:
            return exact_acceptances(self.methods, pairs, num_drafts)
        if self._pool is None:  # spawned, not forked: the parent holds torch's thread pools
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))
        parts = list(self._pool.map(
            exact_acceptances, [self.methods] * self.workers,
            [pairs[start :: self.workers] for start in range(self.workers)], [num_drafts] * self.workers,
        ))
        missing = {method: reason for _, part_missing in parts for method, reason in part_missing.items()}
        acceptance = {}
        for method in self.methods:
            if method not in missing:
                values = np.empty(len(pairs))
                for start, (part, _) in enumerate(parts):
                    values[start :: self.workers] = part[method]
                acceptance[method] = values
        return acceptance, missing

    @staticmethod
    def summary_tables(results) -> list:
        named = [("exact acceptance per token (± s.e. over prompts)", acceptance_table([results])),
                 ("gap to the optimum α* − α", gap_table(results))]
        for by, key in (("temperature", "temperatures"), ("num_drafts", "num_drafts")):
            if len(results.settings[key]) > 1:
                named.append((f"acceptance vs {by}", ablation_table(results, by)))
        return named

    @classmethod
    def report_blocks(cls, studies: list[StudyResults], figure_dir: Path) -> list:
        return acceptance_report(studies, figure_dir)  # one table across datasets


def exact_acceptances(methods, pairs, num_drafts: int) -> tuple[dict, dict]:
    """method -> exact acceptance at each (target, draft) row pair, and method -> why it has
    no exact value at this size (``method_acceptance``'s ValueError). One call per row:
    batching rows of different lengths by padding was measured slower (the padding costs
    more than the calls it saves)."""
    acceptance, missing = {}, {}
    for method in methods:
        try:
            acceptance[method] = [method_acceptance(method, target[None], draft[None], num_drafts)[0]
                                  for target, draft in pairs]
        except ValueError as error:
            missing[method] = str(error)
    return acceptance, missing


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


def bound_of(method: str, num_drafts: int) -> str | None:
    """The optimum a method is compared with at n = ``num_drafts``: its draft scheme's α*,
    when both are evaluated at the same number of drafts (the single draft's α* is the
    one-draft optimum, not the study's n). None for an optimum or an unknown method."""
    methods = acceptance_methods()
    entry = methods.get(method)
    if entry is None or entry.bound is None or entry.bound not in methods:
        return None
    return entry.bound if methods[entry.bound].count(num_drafts) == entry.count(num_drafts) else None


def gap_summary(results: StudyResults) -> dict[tuple, tuple[float, float, int]]:
    """(temperature, num_drafts, verifier) -> per-token mean of α*_t − α_t (the verifier's
    gap to its scheme's optimum at the same position), its standard error over prompts
    (paired: both from the same rows), and the positions; cells ``acceptance_summary``
    leaves out are left out."""
    available = acceptance_summary(results)
    summary = {}
    for method in results.settings["methods"]:
        for num_drafts in results.settings["num_drafts"]:
            bound = bound_of(method, num_drafts)
            if bound not in results.settings["methods"]:
                continue
            means = grouped_per_token_means(
                [record for record in results.positions
                 if record["num_drafts"] == num_drafts and {method, bound} <= record["acceptance"].keys()],
                group=lambda record: (record["temperature"], record["num_drafts"]),
                value=lambda record, method=method, bound=bound: record["acceptance"][bound] - record["acceptance"][method],
            )
            for (temperature, count), value in means.items():
                if {(temperature, count, method), (temperature, count, bound)} <= available.keys():
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
        Heading(3, "Acceptance per token, method × dataset"),
        Table(*acceptance_table(studies)),
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
        "Before the exact computations each row pair drops its least likely tokens (smallest max(p, q)), "
        "renormalised, while B = δp + δq·Σ_{i<n} 1/(1 − S_i) stays within a budget (δ: dropped masses, S_i: mass "
        "of the draft’s i largest tokens, one cut per number of drafts n). Σ min(p, q) and every α* move by at "
        "most B (proof in `specbound.bounds.tail`); the tests check B for the verifiers too. It keeps "
        "about two thousand tokens of the vocabulary at n = 3 (median) and makes the exact computations ~10× "
        "faster. Per position:"
    ), Bullets(lines)]


def _findings(results: StudyResults, summary: dict) -> list:
    """The papers' qualitative findings (``PAPER_COMPARISONS``) and every gap to α*,
    checked on these numbers; no verdict from a missing value, a NaN or a tie."""
    lines = []
    settings = results.settings
    gaps_to_optimum = gap_summary(results)
    for temperature in settings["temperatures"]:
        for count in settings["num_drafts"]:
            def value(method):
                entry = summary.get((temperature, count, method))
                return None if entry is None or math.isnan(entry[0]) else entry[0]

            facts = []
            for what, first, second in PAPER_COMPARISONS:
                a, b = value(first), value(second)
                if a is not None and b is not None:
                    verdict = f"{method_label(first)} wins" if a > b else f"{method_label(second)} wins" if b > a else "tie"
                    facts.append(f"{what}: {a:.4f} vs {b:.4f} ({verdict})")
            gaps = [f"{m} {estimate(gaps_to_optimum[(temperature, count, m)])}" for m in settings["methods"]
                    if (temperature, count, m) in gaps_to_optimum]
            if gaps:
                facts.append("gaps to α*: " + ", ".join(gaps))
            if facts:
                lines.append(f"T = {temperature:g}, n = {count}: " + "; ".join(facts) + ".")
    if not lines:
        return []
    return [Paragraph("Findings of the papers, checked here (per-token means):"), Bullets(lines)]
