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
float32 rows (443 positions of four MMLU prompts, ``benchmarks/results/study_hu2025/
tail_kept_tokens_amx_xeon.json``). ``tail_budget = 0``
drops only tokens where p = q = 0: exact. B and the dropped masses are recorded per
position.

A position whose draft law has fewer tokens than a distinct-token scheme needs gets as
many drafts as it has tokens, and a verifier fixed to two drafts hands such a position to
``single`` — the rules the engine follows too (``DraftScheme.effective_num_drafts``,
``Verifier.for_num_drafts``).

``--preset hu2025`` (``HU2025``) sets Hu et al.'s table: up to 1024 prompts × 128 tokens on
every available task, n = 2, 3, 4, 6, every method.

The tables and the report's section are in ``acceptance_report``; the methods (what a row
of the tables is) in ``acceptance_methods``.

Records: one per (position, n) with every method's acceptance; the run record holds the
generated tokens, the engine's counts, and the methods left out at some n because they
have no exact algorithm at that size (``unavailable``: method -> the reason), which the
tables show as missing rather than as a number. Tables average per token (all positions of all
prompts pooled) with standard errors over prompts (``statistics``).
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing
import os
import threading
import time
import weakref
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np

from specbound import arguments
from specbound.bounds.rows import RowPairs
from specbound.bounds.tail import cut_tails, scan_guesses
from specbound.checks import finite_number, positive_int
from specbound.datasets import Prompt
from specbound.engine import Processing
from specbound.engine.methods import autoregressive, chain
from specbound.models.pair import ModelPair
from specbound.studies.acceptance_methods import (acceptance_methods, attained_optimum, method_acceptance,
                                                   method_acceptance_of, method_refusal_of,
                                                   method_refuses_by_estimate)
from specbound.studies.acceptance_report import (ablation_table, acceptance_report, acceptance_summary,
                                                 acceptance_table, gap_summary, gap_table)
from specbound.studies.base import Study, StudyPreset, Unit, UnitOutput, register_study, setting_units
from specbound.studies.fields import INTEGER, MAPPING, NUMBER, TEXT, RecordFields, list_of, mapping_of
from specbound.studies.records import StudyResults
from specbound.studies.traces import (GENERATION_FIELDS, GENERATION_SETTINGS, TraceRequest,
                                      checked_generation_settings, generation_summary, trace_probs)

__all__ = ["AcceptanceStudy", "acceptance_methods", "acceptance_summary", "exact_acceptances", "gap_summary",
           "method_acceptance"]

DEFAULT_TAIL_BUDGET = 1e-6
POSITIONS_PER_TASK = 1  # a task of the exact part's workers (``ExactPool``)
# Hu et al.'s tasks (Alpaca, CNN/DailyMail, WMT'14 De-En, MT-Bench) as far as prompt sets exist here:
# the authored stand-ins for the first three, the real MT-Bench and MMLU sets, and the edit set
HU2025_DATASETS = ("instructions", "summarize", "translate_de_en", "mt_bench", "mmlu", "edit")
HU2025 = StudyPreset(
    help=f"Hu et al. (ICLR 2025)'s acceptance table: up to 1024 prompts per task (--limit 1024) x 128 tokens "
    f"(--max-new-tokens 128) on every available task of {','.join(HU2025_DATASETS)} (--dataset; sets whose package "
    "is not installed are left out, with the command that installs them), --num-drafts 2,3,4,6, every method, "
    "--temperature 0.7",
    settings={"dataset": list(HU2025_DATASETS), "limit": 1024, "max_new_tokens": 128, "temperature": [0.7],
              "num_drafts": [2, 3, 4, 6], "methods": list(acceptance_methods())},
)


@register_study
class AcceptanceStudy(Study):
    """Units: prompts × temperatures; each records all ``num_drafts`` values at once (the
    rows do not depend on n, so the n-ablation costs no extra generation)."""

    name = "acceptance"
    help = "exact per-position acceptance of every method and α* [HU]"
    order = 0
    presets = {"hu2025": HU2025}
    record_fields = RecordFields(
        position={"prompt_id": TEXT, "temperature": NUMBER, "num_drafts": INTEGER, "position": INTEGER,
                  "token": INTEGER, "acceptance": mapping_of(NUMBER), "tail_mass": list_of(NUMBER),
                  "tail_bound": NUMBER},
        run={"prompt_id": TEXT, "temperature": NUMBER, "unavailable": MAPPING, **GENERATION_FIELDS},
        key=("num_drafts", "position"),
        settings={**GENERATION_SETTINGS, "num_drafts": list_of(INTEGER), "methods": list_of(TEXT),
                  "tail_budget": NUMBER},
    )

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
        named = [("exact acceptance per token (± s.e. over prompts)", acceptance_table([results])),
                 ("gap to the optimum α* − α", gap_table(results))]
        for by, key in (("temperature", "temperatures"), ("num_drafts", "num_drafts")):
            if len(results.settings[key]) > 1:
                named.append((f"acceptance vs {by}", ablation_table(results, by)))
        return named

    @classmethod
    def report_blocks(cls, studies: list[StudyResults], figure_dir: Path) -> list:
        return acceptance_report(studies, figure_dir)  # one table across datasets


def unit_exact_part(methods, counts, tail_budget, target_rows, draft_rows, defer=False,
                    only=None) -> dict[int, tuple[np.ndarray, dict, dict]]:
    """``AcceptanceStudy.exact`` for rows in one process: each row's tail cut for every n
    of ``counts``, then every method at each n. The tokens any of a row's cuts keeps are
    sorted by p/q once, each cut's scan order read from that sort (``bounds.tail.scan_guesses``).
    ``defer`` and ``only``: the two rounds of ``ExactPool`` (``exact_acceptances``' ``defer``;
    ``only``, a set of (method, n): those alone are computed, the others left out).
    # [positions, vocab] x2"""
    cuts = [cut_tails(target, draft, tail_budget, counts) for target, draft in zip(target_rows, draft_rows)]
    guesses = [scan_guesses(row_cuts, target, draft)
               for row_cuts, target, draft in zip(cuts, target_rows, draft_rows)]
    exact = {}
    for num_drafts in counts:
        rows = [row_cuts[num_drafts] for row_cuts in cuts]
        tails = np.array([[cut.dropped_target, cut.dropped_draft, cut.bound] for cut in rows]).reshape(len(rows), 3)
        computed = methods if only is None else [method for method in methods if (method, num_drafts) in only]
        exact[num_drafts] = (tails, *exact_acceptances(computed, [(cut.target, cut.draft) for cut in rows], num_drafts,
                                                       [row_guesses[num_drafts] for row_guesses in guesses], defer))
    return exact


_BLAS_LIMITS = []  # a worker's threadpool limits, kept for its life
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
KEPT_FREED_BYTES = 64 << 20  # blocks below this come from the heap; freed memory up to 4x it stays
PARENT_CHECK_SECONDS = 0.25  # how often a worker looks whether its parent still runs


def _exit_with_parent(parent: int) -> None:
    """End this worker once ``parent`` has ended, however it ended (a SIGKILL runs none of
    its cleanup): the parent id of an orphan changes. Linux's PR_SET_PDEATHSIG would not do:
    it fires when the *thread* that spawned the worker ends, not its process."""
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_SECONDS)
    os._exit(1)


def _worker_setup(parent: int) -> None:
    """A worker's BLAS on one thread: the workers already fill the cores, and a threaded BLAS
    under each has them compete for the same cores (two workers gain less over one with it
    than without). And glibc's malloc keeps the memory the worker frees: the exact part
    allocates and frees arrays of a cut row's size (megabytes) at every step, and under
    glibc's adaptive mmap threshold many come as fresh mappings, each paying its page faults
    again (round 6 of ``benchmarks/results/study_exact_unit.md``).
    Elsewhere than glibc the allocator is left as it is. A thread ends the worker with its
    ``parent`` (``_exit_with_parent``); the resource tracker then ends too, its pipe closed
    by every process that held it."""
    from threadpoolctl import threadpool_limits

    threading.Thread(target=_exit_with_parent, args=(parent,), name="exit-with-parent", daemon=True).start()
    _BLAS_LIMITS.append(threadpool_limits(limits=1, user_api="blas"))
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    libc.mallopt(M_MMAP_THRESHOLD, KEPT_FREED_BYTES)
    libc.mallopt(M_TRIM_THRESHOLD, 4 * KEPT_FREED_BYTES)


class ExactPool:
    """``unit_exact_part`` on worker processes, spawned (not forked: the parent holds torch's
    thread pools) and kept from unit to unit with the shared-memory block they read a unit's
    rows from. The parent writes the rows into the block (one copy; a block kept across units
    costs no page faults) and hands out tasks of ``POSITIONS_PER_TASK`` consecutive
    positions, each to whichever worker is free: a position's cost varies several-fold with
    how many tokens its tail cut keeps, and fixed shares left one worker idle while the other
    finished. When the pool is collected, or at the latest when the interpreter exits, the
    workers are stopped and joined and the block released (``_shut_down``)."""

    def __init__(self, workers: int):
        self.executor = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                            initializer=_worker_setup, initargs=(os.getpid(),))
        self.blocks: list[shared_memory.SharedMemory] = []  # the block in use (none before the first unit)
        weakref.finalize(self, _shut_down, self.executor, self.blocks)

    def exact(self, methods, counts, tail_budget, target_rows, draft_rows) -> dict[int, tuple[np.ndarray, dict, dict]]:
        """``unit_exact_part`` of the rows, computed by the workers, in two rounds: the first
        computes every method but those a row can refuse by estimate, which it only
        estimates (``exact_acceptances``' ``defer``: a task holds some of the rows, and a
        value is thrown away once any row of the unit is refused); the second computes those
        that no row refuses, from the same cuts (rare on real rows, most of which estimate
        RRS without replacement at n ≥ 4 far past its limit: ~2e5 s a row at n = 4 in the
        MMLU report).  # [positions, vocab] x2"""
        shape = (2, *np.shape(target_rows))
        rows = self._rows(shape)
        rows[0], rows[1] = target_rows, draft_rows
        del rows  # the block must export no buffer when it is replaced or released
        parts = self._map(shape, methods, counts, tail_budget, True, None)
        exact = {num_drafts: _joined(parts, num_drafts, methods) for num_drafts in counts}
        pending = {(method, num_drafts) for num_drafts, (_, _, missing) in exact.items()
                   for method, reason in missing.items() if reason is None}
        if pending:
            later = self._map(shape, methods, counts, tail_budget, False, pending)
            for num_drafts, (tails, acceptance, missing) in exact.items():
                _, computed, computed_missing = _joined(later, num_drafts, [m for m, n in pending if n == num_drafts])
                acceptance.update(computed)
                missing.update(computed_missing)
                for method in computed:
                    del missing[method]
                exact[num_drafts] = (tails, {method: acceptance[method] for method in methods if method in acceptance},
                                     missing)
        return exact

    def _map(self, shape, methods, counts, tail_budget, defer, only) -> list:
        """``_shared_exact_part`` of every task of ``POSITIONS_PER_TASK`` positions, in order."""
        tasks = [slice(start, start + POSITIONS_PER_TASK) for start in range(0, shape[1], POSITIONS_PER_TASK)]
        count = len(tasks)
        return list(self.executor.map(_shared_exact_part, [self.blocks[0].name] * count, [shape] * count, tasks,
                                      [methods] * count, [counts] * count, [tail_budget] * count, [defer] * count,
                                      [only] * count))

    def _rows(self, shape) -> np.ndarray:
        """A float64 view of ``shape`` at the start of the block, which is replaced by a larger
        one when it is too small.  # -> [2, positions, vocab]"""
        size = int(np.prod(shape)) * np.dtype(np.float64).itemsize
        if not self.blocks or self.blocks[0].size < size:
            _release(self.blocks)
            self.blocks.append(shared_memory.SharedMemory(create=True, size=size))
        return np.ndarray(shape, np.float64, buffer=self.blocks[0].buf)


def _shut_down(executor: ProcessPoolExecutor, blocks: list) -> None:
    """Stop and join the workers, then release the block. Joined here, not left to the
    executor's own exit hook: an executor collected as the interpreter exits races that
    hook, which can then write to a closed pipe (seen with CPython 3.11)."""
    executor.shutdown()
    _release(blocks)


def _release(blocks: list) -> None:
    for block in blocks:
        block.close()
        block.unlink()
    blocks.clear()


def _joined(parts, num_drafts: int, methods) -> tuple[np.ndarray, dict, dict]:
    """The tasks' results at n joined in position order: the tails, each method's values
    where no task lacks them, and why the first position that lacks a value lacks it (as
    one process reports it), None where the tasks only deferred it (``exact_acceptances``)."""
    missing = {}
    for part in parts:
        for method, reason in part[num_drafts][2].items():
            if missing.get(method) is None:
                missing[method] = reason
    tails = np.concatenate([part[num_drafts][0] for part in parts])
    acceptance = {method: np.concatenate([part[num_drafts][1][method] for part in parts])
                  for method in methods if method not in missing}
    return tails, acceptance, missing


def _shared_exact_part(name, shape, positions, methods, counts, tail_budget, defer=False, only=None):
    """``unit_exact_part`` on the positions ``positions`` (a slice) of the [2, positions,
    vocab] rows in the shared-memory block ``name`` (one task of ``ExactPool``)."""
    shared = shared_memory.SharedMemory(name=name)
    try:
        rows = np.ndarray(shape, np.float64, buffer=shared.buf)[:, positions].copy()
    finally:
        shared.close()
    return unit_exact_part(methods, counts, tail_budget, rows[0], rows[1], defer, only)


def exact_acceptances(methods, pairs, num_drafts: int, scan_guesses=None, defer=False) -> tuple[dict, dict]:
    """method -> exact acceptance at each (target, draft) row pair, and method -> why it has
    no exact value at this size (``method_acceptance``'s ValueError). Each row is checked
    once for the computations and every method reads the same checked form, so its sorts
    and searches are done once for all methods (``bounds.rows.RowPairs``; ``scan_guesses``:
    per row, a guess of its scan order or None, checked before it is used). One call per
    row: batching rows of different lengths by padding costs more than the calls it
    saves. A verifier that attains its scheme's α* by
    construction takes the optimum's values when those are computed before it.

    A method that can refuse a row by estimating its work (``AcceptanceMethod.refusal_of``:
    RRS without replacement at n ≥ 4, past its 20-s limit) is estimated at every row first
    and computed at none when one is refused, with the first refused row's reason: a value
    computed before a later row's refusal would be thrown away (on MMLU prompt 2's rows the
    pool spent about a third of its time so). ``defer`` (``ExactPool``'s first round, whose
    tasks hold a few of a unit's rows): such a method that none of these rows refuses is not
    computed either, its reason None, for the pool to compute once every row is known; the
    rows are then checked once for the estimates and the computations alike (without
    ``defer``, once for each, so that a unit's rows are not all held checked at once)."""
    reused = {}
    for index, method in enumerate(methods):
        if attained_optimum(method, num_drafts) in methods[:index]:
            reused[method] = attained_optimum(method, num_drafts)
    guesses = [None] * len(pairs) if scan_guesses is None else scan_guesses
    computing = [method for method in methods if method not in reused]
    estimated = [method for method in computing if method_refuses_by_estimate(method, num_drafts)]
    kept = list(_checked_rows(pairs, guesses)) if estimated and defer else None
    refused = _first_refusals(estimated, kept or _checked_rows(pairs, guesses), num_drafts) if estimated else {}
    deferred = {method: None for method in estimated if method not in refused} if defer else {}
    computing = [method for method in computing if method not in refused and method not in deferred]
    acceptance, missing = _row_by_row(computing, kept or _checked_rows(pairs, guesses), num_drafts)
    missing = {**refused, **deferred, **missing}
    fallback = [method for method, optimum in reused.items() if optimum in missing]
    computed, computed_missing = _row_by_row(fallback, _checked_rows(pairs, guesses), num_drafts)
    acceptance.update(computed)
    missing.update(computed_missing)
    acceptance.update({method: list(acceptance[optimum]) for method, optimum in reused.items() if optimum in acceptance})
    return {method: acceptance[method] for method in methods if method in acceptance}, missing


def _checked_rows(pairs, guesses):
    """Each (target, draft) pair as checked rows (``RowPairs.checked``), in order, up to
    and with the first that fails its check (its ValueError in its place); one at a time,
    so a row's sorts are let go before the next is checked.  # yields RowPairs [1, vocab]"""
    for (target, draft), guess in zip(pairs, guesses):
        try:
            yield RowPairs.checked(target[None], draft[None], guess)
        except ValueError as error:
            yield error
            return


def _first_refusals(methods, checked, num_drafts: int) -> dict:
    """method -> why the first row of ``checked`` it refuses by estimate is refused
    (``method_refusal_of``), for the methods that refuse one; rows after one that failed
    its check are not asked (``_row_by_row`` reports that one)."""
    refused = {}
    for rows in checked:
        if isinstance(rows, ValueError):
            break
        for method in methods:
            if method not in refused:
                reason = method_refusal_of(method, rows, num_drafts)
                if reason is not None:
                    refused[method] = reason
        if len(refused) == len(methods):
            break
    return refused


def _row_by_row(methods, checked, num_drafts: int) -> tuple[dict, dict]:
    """``exact_acceptances`` without the reuse and the estimates: every method at every
    checked row (``_checked_rows``), rows outer; none are checked without a method."""
    if not methods:
        return {}, {}
    acceptance, missing = {method: [] for method in methods}, {}
    for rows in checked:
        if isinstance(rows, ValueError):
            missing.update({method: str(rows) for method in methods})
            break
        for method in methods:
            if method not in missing:
                try:
                    acceptance[method].append(method_acceptance_of(method, rows, num_drafts)[0])
                except ValueError as error:
                    missing[method] = str(error)
    return {method: values for method, values in acceptance.items() if method not in missing}, missing
