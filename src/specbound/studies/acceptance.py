"""Acceptance study [HU] §5: every method's exact per-step acceptance along real generations.

For each prompt and temperature, the target generates up to ``max_new_tokens`` tokens
through the engine (a lossless chain, so the text follows the target's law); one forward of
each model over the generated sequence gives the (target, draft) rows p_t, q_t at every
position t (``traces``), and every method's acceptance is computed **exactly** from the same
rows, batched over positions — never by sampling:

- ``single``: one draft, Σ min(p, q) [LEV];
- ``optimal_<scheme>``: α* of the draft scheme (with_replacement, without_replacement,
  greedy), the best any lossless verifier can do with those drafts (SPEC §4.2,
  ``specbound.bounds.optimal_acceptance``);
- the verifiers ``rrs``, ``kseq`` (i.i.d. drafts), ``rrs_without_replacement``, ``greedy``
  and ``spechub`` (n = 2 always, as the papers report it): ``Verifier.acceptance_rate``.

Tail cut (``tail_budget``, default 1e-6): before the exact computations each row pair
drops its least likely tokens (smallest max(p_t, q_t)), renormalised, as many as keep
B = δp + δq·Σ_{i<n} 1/(1 − S_i) within the budget — δp, δq the dropped masses, S_i the
mass of q's i largest tokens; one cut per number of drafts n. Why B bounds the
move: p ↦ p' is a TV move of δp; draft i falls in the dropped set with probability at
most δq/(1 − S_i) given the earlier draws (without replacement their mass leaves the
denominator), and given it does not, the cut law draws the same — so the n-draft law
moves by at most δq·Σ 1/(1 − S_i), and Σ min(p, q) and every α* by at most B. The tests
check B for every verifier as well. The n largest draft tokens and the largest target
token are never dropped (the greedy scheme's fixed drafts and the support size stay).
On the default pair at T = 0.7, n = 3, this keeps about two thousand of 151,936 tokens
per row (a median) and makes the without-replacement computations ~10× faster. ``tail_budget = 0`` drops
only tokens where p = q = 0: exact. B and the dropped masses are recorded per position.

A position whose draft law has fewer tokens than a distinct-token scheme needs gets as
many drafts as it has tokens, as in the engine (``engine.drafters.draw_drafts``), and a
verifier fixed to two drafts hands such a position to ``single`` (``Method.verifier_at``).

Records: one per (position, n) with every method's acceptance; the run record holds the
generated tokens, the engine's counts, and the methods left out at some n because they
have no exact algorithm at that size (``unavailable``: method -> the reason), which the
tables show as missing rather than as a number. Tables average per token (all positions of all
prompts pooled) with standard errors over prompts (``statistics``).
"""

from __future__ import annotations

import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import torch

from specbound.bounds import optimal_acceptance
from specbound.datasets import Prompt
from specbound.drafts import get_draft_scheme
from specbound.engine import Processing
from specbound.engine.methods import autoregressive, chain
from specbound.probability import support_size
from specbound.studies.pair import ModelPair
from specbound.studies.records import StudyResults
from specbound.studies.runner import Unit, UnitOutput
from specbound.studies.statistics import grouped_per_token_means
from specbound.studies.traces import checked_generation_settings, generate_trace, generation_summary, trace_probs
from specbound.verifiers import get_verifier

OPTIMUM_SCHEMES = ("with_replacement", "without_replacement", "greedy")
METHODS = (
    "single",
    *(f"optimal_{scheme}" for scheme in OPTIMUM_SCHEMES),
    "rrs",
    "kseq",
    "rrs_without_replacement",
    "greedy",
    "spechub",
)
METHOD_LABELS = {
    "single": "single draft Σ min(p, q)",
    "optimal_with_replacement": "α* with replacement",
    "optimal_without_replacement": "α* without replacement",
    "optimal_greedy": "α* greedy",
    "rrs": "RRS (i.i.d.)",
    "kseq": "K-SEQ (i.i.d.)",
    "rrs_without_replacement": "RRS without replacement",
    "greedy": "greedy verifier",
    "spechub": "SpecHub (n = 2)",
}


def bound_of(method: str) -> str | None:
    """The α* a verifier is compared with: its draft scheme's optimum. None for ``single``
    (it is α* with one draft) and ``spechub`` (optimal for its own pairs: α*_greedy(2))."""
    if method.startswith("optimal_") or method in ("single", "spechub"):
        return None
    return f"optimal_{get_verifier(method).scheme}"


DEFAULT_TAIL_BUDGET = 1e-6


def tail_factor(draft: np.ndarray, num_drafts: int) -> float:
    """Σ_{i<n} 1/(1 − S_i), S_i the mass of the draft's i largest tokens; 1 − S_i is summed
    from the other tokens (a peaked row can hold q(top) = 1.0 beside 1e-17 tokens, where
    1.0 − S_1 would be 0). # [vocab] -> float"""
    size = min(num_drafts - 1, draft.size - 1)
    split = np.partition(draft, draft.size - 1 - size) if size > 0 else draft
    top = np.sort(split[draft.size - size :]) if size > 0 else np.zeros(0)  # ascending
    rest = split[: draft.size - size].sum()  # mass outside the top n − 1
    # 1 − S_i = rest + the top tokens from i on: i = n − 1, n − 2, ..., 0
    outside = rest + np.concatenate([[0.0], np.cumsum(top)])
    return float(np.sum(1.0 / np.maximum(outside, 1e-300)))


def cut_tail(target: np.ndarray, draft: np.ndarray, budget: float, num_drafts: int):
    """Drop the least likely tokens while B = δp + δq·tail_factor ≤ ``budget``; renormalise.

    Tokens are dropped by octaves of max(p, q) (all below 2^k for the largest k that fits
    the budget), which costs O(vocab) instead of a sort; the n largest draft tokens and the
    largest target token are never dropped.
    # [vocab], [vocab] -> [k] target, [k] draft, δp, δq, B"""
    likely = np.maximum(target, draft)
    keep = likely > 0
    if budget > 0:
        factor = tail_factor(draft, num_drafts)
        droppable = likely <= budget  # a dropped token alone adds p + factor·q ≥ max(p, q)
        count = min(num_drafts, draft.size)
        droppable[np.argpartition(draft, draft.size - count)[draft.size - count :]] = False
        droppable[np.argmax(target)] = False
        candidates = np.flatnonzero(droppable & keep)
        octave = np.floor(np.log2(likely[candidates])).astype(np.int64)  # token in [2^o, 2^(o+1))
        octave -= octave.min() if octave.size else 0
        move = np.cumsum(np.bincount(octave, weights=target[candidates] + factor * draft[candidates]))
        dropped_octaves = int(np.searchsorted(move, budget, side="right"))  # octaves 0 .. k−1 fit
        keep[candidates[octave < dropped_octaves]] = False
    else:
        factor = 0.0
    kept_target, kept_draft = target[keep], draft[keep]
    dropped_target, dropped_draft = float(target[~keep].sum()), float(draft[~keep].sum())
    bound = dropped_target + factor * dropped_draft
    return kept_target / kept_target.sum(), kept_draft / kept_draft.sum(), dropped_target, dropped_draft, bound


def method_acceptance(method: str, target_rows, draft_rows, num_drafts: int) -> np.ndarray:
    """Exact acceptance of ``method`` with ``num_drafts`` drafts at every row.
    # target_rows, draft_rows [positions, vocab] -> [positions]"""
    if method not in METHODS:
        raise ValueError(f"method: unknown method {method!r}; choose from {', '.join(METHODS)}")
    if method.startswith("optimal_"):
        scheme = method.removeprefix("optimal_")

        def compute(target, draft, count):
            return optimal_acceptance(target, draft, count, scheme).acceptance
    else:
        verifier = get_verifier(method)
        scheme = verifier.scheme
        num_drafts = verifier.fixed_num_drafts or num_drafts

        def compute(target, draft, count):
            # with fewer tokens than its fixed count, a verifier hands over to one draft
            fixed = verifier.fixed_num_drafts not in (None, count)
            return (get_verifier("single") if fixed else verifier).acceptance_rate(target, draft, count)

    counts = np.full(draft_rows.shape[0], num_drafts)
    if get_draft_scheme(scheme).needs_distinct_support:
        counts = np.minimum(counts, support_size(draft_rows))
    if np.all(counts == num_drafts):
        return compute(target_rows, draft_rows, num_drafts)
    acceptance = np.empty(draft_rows.shape[0])
    for count in np.unique(counts):
        rows = counts == count
        acceptance[rows] = compute(target_rows[rows], draft_rows[rows], int(count))
    return acceptance


class AcceptanceStudy:
    """Units: prompts × temperatures; each records all ``num_drafts`` values at once (the
    rows do not depend on n, so the n-ablation costs no extra generation)."""

    name = "acceptance"

    def __init__(
        self,
        temperatures=(0.7,),
        num_drafts=(3,),
        max_new_tokens: int = 128,
        methods=METHODS,
        top_k: int | None = None,
        top_p: float | None = None,
        generation_gamma: int = 0,
        tail_budget: float = DEFAULT_TAIL_BUDGET,
        workers: int = 1,
    ):
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers: expected a positive integer, got {workers!r}")
        self.workers = workers
        self._pool = None
        for method in methods:
            if method not in METHODS:
                raise ValueError(f"methods: unknown method {method!r}; choose from {', '.join(METHODS)}")
        for count in num_drafts:
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ValueError(f"num_drafts: expected positive integers, got {count!r}")
        if isinstance(tail_budget, bool) or not isinstance(tail_budget, (int, float)) or not 0 <= tail_budget <= 1e-3:
            raise ValueError(f"tail_budget: expected a number in [0, 1e-3], got {tail_budget!r}")
        self.tail_budget = float(tail_budget)
        self.temperatures = checked_generation_settings(temperatures, max_new_tokens, top_k, top_p)
        self.num_drafts = list(num_drafts)
        self.max_new_tokens = max_new_tokens
        self.methods = list(methods)
        self.top_k, self.top_p = top_k, top_p
        if isinstance(generation_gamma, bool) or not isinstance(generation_gamma, int) or generation_gamma < 0:
            raise ValueError(f"generation_gamma: expected a non-negative integer, got {generation_gamma!r}")
        self.method = chain(generation_gamma) if generation_gamma > 0 else autoregressive()

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
        return [
            Unit(f"{prompt.id}|T={temperature:g}", prompt, {"temperature": temperature})
            for temperature in self.temperatures
            for prompt in prompts
        ]

    def run_unit(self, pair: ModelPair, unit: Unit, generator: torch.Generator) -> UnitOutput:
        temperature = unit.config["temperature"]
        processing = Processing(temperature, self.top_k, self.top_p, pair.vocab_size)
        trace = generate_trace(
            pair, processing, self.method, pair.encode(unit.prompt.text), self.max_new_tokens, generator
        )
        started = time.perf_counter()
        target_rows, draft_rows = trace_probs(pair, trace, processing)
        scored = time.perf_counter()
        positions, unavailable = [], {}
        for num_drafts in self.num_drafts:
            rows = [cut_tail(target, draft, self.tail_budget, num_drafts)
                    for target, draft in zip(target_rows, draft_rows)]
            acceptance, missing = self._exact(rows, num_drafts)
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
                    "tail_mass": [rows[position][2], rows[position][3]],
                    "tail_bound": rows[position][4],
                })
        run = {
            "prompt_id": unit.prompt.id,
            "temperature": temperature,
            "unavailable": unavailable,
            **generation_summary(pair, trace),
        }
        seconds = {
            "generate": trace.stats.wall_seconds,
            "score": scored - started,
            "acceptance": time.perf_counter() - scored,
        }
        return UnitOutput(positions, run, seconds)

    def _exact(self, rows, num_drafts: int) -> tuple[dict, dict]:
        """Every method at every row: in this process, or split over ``workers`` processes
        (interleaved rows, so each gets a share of the long and the short ones)."""
        pairs = [(target, draft) for target, draft, *_ in rows]
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


def exact_acceptances(methods, pairs, num_drafts: int) -> tuple[dict, dict]:
    """method -> exact acceptance at each (target, draft) row pair, and method -> why it has
    no exact value at this size (``method_acceptance``'s ValueError)."""
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


def gap_summary(results: StudyResults) -> dict[tuple, tuple[float, float, int]]:
    """(temperature, num_drafts, verifier) -> per-token mean of α*_t − α_t (the verifier's
    gap to its scheme's optimum at the same position), its standard error over prompts
    (paired: both from the same rows), and the positions; cells ``acceptance_summary``
    leaves out are left out."""
    available = acceptance_summary(results)
    summary = {}
    for method in results.settings["methods"]:
        bound = bound_of(method)
        if bound not in results.settings["methods"]:
            continue
        means = grouped_per_token_means(
            [record for record in results.positions if {method, bound} <= record["acceptance"].keys()],
            group=lambda record: (record["temperature"], record["num_drafts"]),
            value=lambda record, method=method, bound=bound: record["acceptance"][bound] - record["acceptance"][method],
        )
        for (temperature, num_drafts), value in means.items():
            if {(temperature, num_drafts, method), (temperature, num_drafts, bound)} <= available.keys():
                summary[(temperature, num_drafts, method)] = value
    return summary


def unavailable_methods(results: StudyResults) -> dict[str, str]:
    """"method, n=k" -> why it has no exact value (first reason met), over all runs."""
    reasons = {}
    for run in results.runs:
        for key, reason in run.get("unavailable", {}).items():
            reasons.setdefault(key, reason)
    return reasons
