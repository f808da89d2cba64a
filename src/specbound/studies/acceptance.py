"""Acceptance study [HU] §5: every method's exact per-step acceptance along real generations.

For each prompt and temperature, the engine generates up to ``max_new_tokens`` tokens from
the target (autoregressive sampling by default; ``generation_gamma > 0``: a lossless
single-draft chain), so the text follows the target's law. The target rows p_t are the laws
the engine sampled each token from (recorded during generation); one forward of the draft
over the generated sequence gives the draft rows q_t (``traces``). Every method's
acceptance is computed **exactly** from the same rows, never by sampling:

- ``optimal_<scheme>``: α* of every registered draft scheme, the best any lossless
  verifier can do with those drafts (SPEC.md §4.2, ``DraftScheme.optimum``);
- every registered lossless verifier whose exact acceptance scales to real vocabularies
  (``Verifier.scalable``): ``Verifier.acceptance_rate``, at the verifier's own count when it
  has one (the single draft at n = 1, SpecHub at n = 2, as the papers report them).
Each verifier is compared with its draft scheme's α* at the same number of drafts.

Tail cut (``tail_budget``, default 1e-6): before the exact computations each row pair
drops its lightest tokens (weight p + F_n·q, F_n the tail factor of n drafts),
renormalised, while a proven bound B on the move of Σ min(p, q) and of every α* stays
within the budget (``specbound.bounds.tail``, where the proof is); one cut per number of
drafts n, all n from one pass over the row. On the default pair at T = 0.7, n = 3, this
keeps 30,000 of 151,936 tokens per row on average (63–137,710) on the llama.cpp backend's
float32 rows (443 positions of four MMLU prompts, ``benchmarks/results/studies/
tail_kept_tokens_amx_xeon.json``). ``tail_budget = 0``
drops only tokens where p = q = 0: exact. B and the dropped masses are recorded per
position.

A position whose draft law has fewer tokens than a distinct-token scheme needs gets as
many drafts as it has tokens, and a verifier fixed to two drafts hands such a position to
``single`` — the rules the engine follows too (``DraftScheme.effective_num_drafts``,
``Verifier.for_num_drafts``).

``--preset hu2025`` (``options.HU2025``) sets Hu et al.'s table: up to 1024 prompts × 128 tokens on
every available task, n = 2, 3, 4, 6, every method.

The tables and the report's section are in ``acceptance_report``; the methods (what a row
of the tables is) in ``acceptance_methods``.

``--drafter suffix`` (``drafter="suffix"``) loads no draft model: at every position the
suffix drafter's root draft set S_t (drafted from the prompt, the text so far and a history of
every earlier unit's output), its exact acceptance p_t(S_t) — for fixed drafts also α* — and the
chain's p_t(top_t), and per unit the tokens per target call of suffix decoding replayed on the
text, tree and chain (``acceptance_suffix``, where the argument for exactness is).

Records: one per (position, n) with every method's acceptance; the run record holds the
generated tokens, the engine's counts, and the methods left out at some n because they
have no exact algorithm at that size (``unavailable``: method -> the reason), which the
tables show as missing rather than as a number. Tables average per token (all positions of all
prompts pooled) with standard errors over prompts (``statistics``).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from specbound.checks import finite_number, positive_int
from specbound.datasets import Prompt
from specbound.engine import Processing
from specbound.engine.methods import autoregressive, chain
from specbound.models.pair import ModelPair
from specbound.studies.acceptance_methods import acceptance_methods, method_acceptance
from specbound.studies.acceptance_report import (ablation_table, acceptance_report, acceptance_summary,
                                                 acceptance_table, gap_summary, gap_table)
from specbound.studies.acceptance_suffix import (SUFFIX_METHODS, SUFFIX_TREE, SuffixHistoryRun, suffix_methods,
                                                 suffix_report, suffix_settings, suffix_tables, suffix_units)
from specbound.studies.base import Study, Unit, UnitOutput, register_study, setting_units
from specbound.studies.exact_part import ExactPool, exact_acceptances, unit_exact_part
from specbound.studies.options import (DEFAULT_TAIL_BUDGET, DRAFTERS, HU2025_DATASETS,  # noqa: F401
                                       LARGEST_TAIL_BUDGET)
from specbound.studies.records import SETTINGS_FILE, StudyResults, read_results
from specbound.studies.traces import TraceRequest, checked_generation_settings, generation_summary, trace_probs

__all__ = ["AcceptanceStudy", "acceptance_methods", "acceptance_summary", "exact_acceptances", "gap_summary",
           "method_acceptance"]

@register_study
class AcceptanceStudy(Study):
    """Units: prompts × temperatures; each records all ``num_drafts`` values at once (the
    rows do not depend on n, so the n-ablation costs no extra generation). With
    ``drafter="suffix"`` the units run prompt by prompt (the history's order), and
    ``suffix_tree`` (options of the ``sparse`` method) shapes the tree; ``num_drafts``,
    ``methods`` and ``tail_budget`` are the draft model's."""

    name = "acceptance"

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
        drafter: str = "model",
        suffix_tree: dict | None = None,
    ):
        if drafter not in DRAFTERS:
            raise ValueError(f"drafter: unknown drafter {drafter!r}; choose from {', '.join(DRAFTERS)}")
        self.drafter = drafter
        self.suffix_tree = dict(SUFFIX_TREE if suffix_tree is None else suffix_tree)
        self._suffix = None  # the run's suffix history (``begin``)
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
        self.tail_budget = finite_number("tail_budget", tail_budget, 0.0, LARGEST_TAIL_BUDGET)
        self.temperatures = checked_generation_settings(temperatures, max_new_tokens, top_k, top_p)
        self.max_new_tokens = max_new_tokens
        self.methods = methods
        self.top_k, self.top_p = top_k, top_p
        generation_gamma = positive_int("generation_gamma", generation_gamma, minimum=0)
        if drafter == "suffix":
            if generation_gamma:
                raise ValueError("generation_gamma: a chain generates the text with the draft model, which "
                                 "drafter='suffix' does not load; leave it 0 (autoregressive sampling)")
            suffix_methods(self.suffix_tree)  # checks the tree's options before anything runs
        self.method = chain(generation_gamma) if generation_gamma > 0 else autoregressive()

    @classmethod
    def from_arguments(cls, args, generation: dict) -> AcceptanceStudy:
        tree = dict(zip(("budget", "depth", "width", "max_children"), args.suffix_tree))
        return cls(num_drafts=args.num_drafts, methods=args.methods, generation_gamma=args.gamma,
                   tail_budget=args.tail_budget, workers=args.workers, drafter=args.drafter,
                   suffix_tree=tree if args.drafter == "suffix" else None, **generation)

    def settings(self) -> dict:
        if self.drafter == "suffix":
            return {
                "temperatures": self.temperatures,
                "num_drafts": [self.suffix_tree["max_children"]],
                "max_new_tokens": self.max_new_tokens,
                "methods": list(SUFFIX_METHODS),
                "top_k": self.top_k,
                "top_p": self.top_p,
                "tail_budget": 0.0,
                "generation": "engine, autoregressive sampling from the target",
                **suffix_settings(self.suffix_tree),
            }
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
        if self.drafter == "suffix":
            return suffix_units(prompts, self.temperatures)
        return setting_units(prompts, self.temperatures)

    def begin(self, pair: ModelPair, units: list[Unit], directory) -> None:
        """With suffix drafts: a new history, holding the outputs of the units written in
        ``directory`` before (``acceptance_suffix``)."""
        if self.drafter != "suffix":
            return
        self._suffix = SuffixHistoryRun(pair.vocab_size, self.suffix_tree, [unit.key for unit in units])
        prompts = {unit.key: unit.prompt for unit in units}
        written = read_results(directory).runs if (Path(directory) / SETTINGS_FILE).is_file() else []
        self._suffix.restore({run["unit"]: (pair.encode(prompts[run["unit"]].text), run["tokens"],
                                            run["suffix"]["joined_history"])
                              for run in written if run["unit"] in prompts})

    def batch_key(self, unit: Unit):
        """With suffix drafts any units may share a batch: its texts decode in groups of equal
        settings (``run_units``) and its records are made in unit order, the history's."""
        return None if self.drafter == "suffix" else super().batch_key(unit)

    def trace_request(self, pair: ModelPair, unit: Unit) -> TraceRequest:
        processing = Processing(unit.config["temperature"], self.top_k, self.top_p, pair.vocab_size)
        return TraceRequest(processing, self.method, self.max_new_tokens)

    def unit_output(self, pair: ModelPair, unit: Unit, request: TraceRequest, trace) -> UnitOutput:
        if self.drafter == "suffix":
            return self.suffix_output(pair, unit, trace)
        temperature, processing = unit.config["temperature"], request.processing
        started = time.perf_counter()
        target_rows, draft_rows = trace_probs(pair, trace, processing)
        scored = time.perf_counter()
        positions, unavailable = [], {}
        for num_drafts, (tails, acceptance, missing) in self.exact(target_rows, draft_rows).items():
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
                    "tail_mass": [float(tails[position, 0]), float(tails[position, 1])],
                    "tail_bound": float(tails[position, 2]),
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

    def suffix_output(self, pair: ModelPair, unit: Unit, trace) -> UnitOutput:
        """The unit's records with suffix drafts (``acceptance_suffix``): no draft forward;
        the target rows are the engine's."""
        if self._suffix is None:
            raise ValueError("drafter: suffix drafts need the run's history: run the study with run_study, "
                             "which begins it (not on Ray)")
        started = time.perf_counter()
        figures, suffix = self._suffix.unit(unit.key, trace.prompt_ids, trace.tokens, trace.target_rows(),
                                            self.max_new_tokens)
        common = {"prompt_id": unit.prompt.id, "temperature": unit.config["temperature"],
                  "num_drafts": self.suffix_tree["max_children"]}
        positions = [{**common, **figure, "tail_mass": [0.0, 0.0], "tail_bound": 0.0} for figure in figures]
        run = {"prompt_id": unit.prompt.id, "temperature": unit.config["temperature"], "unavailable": {},
               **generation_summary(pair, trace), "suffix": suffix}
        return UnitOutput(positions, run, {"generate": trace.seconds, "acceptance": time.perf_counter() - started})

    def exact(self, target_rows, draft_rows) -> dict[int, tuple[np.ndarray, dict, dict]]:
        """The exact part of a unit: n -> (each position's tail cut as [δp, δq, B] [positions, 3],
        method -> acceptance [positions], method -> why it has no exact value at n), for every
        n of the study: in this process, or on ``workers`` processes (``ExactPool``), which
        read the rows from shared memory and do the tail cuts and every n themselves
        (pickling the cut rows for each n cost more than the computations it spread).
        # target_rows, draft_rows [positions, vocab]"""
        if self.workers == 1 or len(target_rows) < 2 * self.workers:
            return unit_exact_part(self.methods, self.num_drafts, self.tail_budget, target_rows, draft_rows)
        if self._pool is None:
            self._pool = ExactPool(self.workers)
        return self._pool.exact(self.methods, self.num_drafts, self.tail_budget, target_rows, draft_rows)

    @staticmethod
    def summary_tables(results) -> list:
        if results.settings.get("drafter") == "suffix":
            return suffix_tables(results)
        named = [("exact acceptance per token (± s.e. over prompts)", acceptance_table([results])),
                 ("gap to the optimum α* − α", gap_table(results))]
        for by, key in (("temperature", "temperatures"), ("num_drafts", "num_drafts")):
            if len(results.settings[key]) > 1:
                named.append((f"acceptance vs {by}", ablation_table(results, by)))
        return named

    @classmethod
    def report_blocks(cls, studies: list[StudyResults], figure_dir: Path) -> list:
        by_drafter = {"model": [], "suffix": []}
        for results in studies:
            by_drafter[results.settings.get("drafter", "model")].append(results)
        model = acceptance_report(by_drafter["model"], figure_dir) if by_drafter["model"] else []
        return model + suffix_report(by_drafter["suffix"])  # one table across datasets each
