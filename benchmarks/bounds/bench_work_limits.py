"""The work-limit estimates against this machine's clock: each estimate of ``specbound.work_limits``'
users timed on shapes it decides about.

``accept``, ``bounds``, ``theory``, the coupling LP and RRS without replacement refuse work
whose estimate is above their limit; the estimates multiply sizes by the per-operation
costs in ``specbound.work_limits``, upper ends on this project's 2-core CPU. For each
estimate this times the work it stands for (the run of least wall clock of ``--repeats``,
and its process CPU time, which a machine busy with other work inflates less) and prints
measured / estimated: at or below 1 the estimate is an upper end on this machine, above 1 a
refusal lets through more work than its limit says. Writes every case and the settings to
``--output`` (a ``benchmarks.record`` envelope). Run it on a quiet machine.

    python -m benchmarks.bounds.bench_work_limits --output benchmarks/results/bounds/work_limits.json   # minutes
    python -m benchmarks.bounds.bench_work_limits --quick                                               # seconds
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

from benchmarks import record

from specbound.bounds.coupling import lp_seconds, optimal_coupling
from specbound.chains.simulation import simulate_decoding, simulation_seconds
from specbound.chains.theory import (
    batch_expected_rejections,
    batch_improvement,
    batch_improvement_seconds,
    chain_draw_seconds,
    exact_cost_seconds,
    lookahead_expected_cost,
    random_chain_pair,
)
from specbound.drafts import DRAFT_SCHEMES
from specbound.tables.bounds import acceptance_table, lossless_verifiers, work_seconds
from specbound.tables.chains import pareto
from specbound.verifiers.biased import SWEEP_METHODS
from specbound.verifiers.rrs_exact import (
    BracketWarning,
    recursion_seconds,
    rrs_without_replacement_acceptance,
    three_draft_seconds,
)
from specbound.work_limits import (
    PARETO_SECONDS_PER_POINT_TOKEN,
    PARETO_SECONDS_PER_SWEEP_POINT,
    PARETO_SECONDS_PER_SWEEP_TOKEN,
)

# (full, quick) shapes of each case
LP_SHAPES = ([(8, 3), (10, 3), (12, 3)], [(6, 3)])  # (V, n): K = V^n tuples with replacement
TABLE_SHAPES = ([(151_936, 2), (151_936, 4), (32_000, 8)], [(8_000, 2)])  # (V, n)
THREE_DRAFT_VOCABS = ([151_936, 32_000], [8_000])
RECURSION_VOCABS = ([200, 120], [40])  # n = 4
CHAIN_SHAPES = ([(64, 200, 4), (32, 400, 2)], [(16, 50, 2)])  # (T, V, M)
SIMULATION_SHAPES = ([(2_000, 32, 50, 2, None), (2_000, 32, 50, 4, 4)], [(200, 16, 20, 2, None)])  # runs, T, V, M, γ
IMPROVEMENT_SHAPES = ([(151_936, 8), (151_936, 64)], [(8_000, 8)])  # (V, M)
PARETO_SHAPES = ([(2_000, 1_000), (200, 20_000)], [(200, 500)])  # (random points, V)


def peaked_rows(vocab: int, rng: np.random.Generator, rows: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Target and draft rows from correlated logits (ρ = 0.9), 20-60 % of the mass on the top token."""
    first, second = rng.standard_normal((2, rows, vocab))
    scale = rng.uniform(3.4, 4.6, size=(rows, 1))

    def softmax(logits):
        weights = np.exp(logits - logits.max(axis=1, keepdims=True))
        return weights / weights.sum(axis=1, keepdims=True)

    return softmax(scale * first), softmax(scale * (0.9 * first + np.sqrt(1 - 0.81) * second))


def lp_cases(shapes, rng):
    scheme = DRAFT_SCHEMES["with_replacement"]
    for vocab, num_drafts in shapes:
        target, draft = peaked_rows(vocab, rng)
        tuples, probs = scheme.joint_law(draft, num_drafts, lp_vocab_size=vocab)
        yield (f"coupling LP, V = {vocab}, n = {num_drafts}, K = {len(probs)}", lp_seconds(len(probs), vocab),
               lambda: optimal_coupling(target[0], tuples, probs))


def table_cases(shapes, rng):
    for vocab, num_drafts in shapes:
        target, draft = peaked_rows(vocab, rng)
        counts = sorted({num_drafts} | {verifier.default_num_drafts(num_drafts) for verifier in lossless_verifiers()})
        yield (f"accept table, V = {vocab:,}, n = {num_drafts}", work_seconds(target, draft, counts),
               lambda: acceptance_table(target, draft, num_drafts))


def three_draft_cases(vocabs, rng):
    for vocab in vocabs:
        target, draft = peaked_rows(vocab, rng)
        yield (f"RRS without replacement n = 3, V = {vocab:,}", three_draft_seconds(target[0], draft[0]),
               lambda: rrs_without_replacement_acceptance(target[0], draft[0], 3))


def recursion_cases(vocabs, rng):
    for vocab in vocabs:
        target, draft = rng.dirichlet(np.ones(vocab), size=2)
        rejectable = int(np.count_nonzero(draft > target))
        yield (f"RRS without replacement n = 4, V = {vocab}, {rejectable} rejectable",
               recursion_seconds(rejectable, vocab, 4), lambda: rrs_without_replacement_acceptance(target, draft, 4))


def chain_cases(shapes, rng):
    for horizon, vocab, num_drafts in shapes:
        chain = random_chain_pair(horizon, vocab, rng)
        yield (f"random chain pair, T = {horizon}, V = {vocab}", chain_draw_seconds(horizon, vocab),
               lambda: random_chain_pair(horizon, vocab, np.random.default_rng(0)))
        yield (f"batch expected rejections, T = {horizon}, V = {vocab}, M = {num_drafts}",
               exact_cost_seconds(horizon, vocab, num_drafts), lambda: batch_expected_rejections(chain, num_drafts))
        yield (f"lookahead expected cost, T = {horizon}, V = {vocab}, M = {num_drafts}, γ = 4",
               exact_cost_seconds(horizon, vocab, num_drafts, 4), lambda: lookahead_expected_cost(chain, num_drafts, 4))


def simulation_cases(shapes, rng):
    for runs, horizon, vocab, num_drafts, lookahead in shapes:
        chain = random_chain_pair(horizon, vocab, rng)
        yield (f"simulation, {runs} runs, T = {horizon}, V = {vocab}, M = {num_drafts}, γ = {lookahead}",
               simulation_seconds(runs, horizon, vocab, num_drafts, lookahead),
               lambda: simulate_decoding(chain, runs, np.random.default_rng(0), num_drafts, lookahead))


def improvement_cases(shapes, rng):
    for vocab, num_drafts in shapes:
        target, draft = peaked_rows(vocab, rng)
        yield (f"batch improvement, V = {vocab:,}, M = {num_drafts}", batch_improvement_seconds(vocab, num_drafts),
               lambda: batch_improvement(target, draft, num_drafts))


def pareto_cases(shapes, rng):
    methods = list(SWEEP_METHODS)
    sweep_points = 21 * len(methods)  # pareto's default ε grid
    for points, vocab in shapes:
        target, draft = peaked_rows(vocab, rng)
        estimate = (PARETO_SECONDS_PER_POINT_TOKEN * points * vocab
                    + sweep_points * (PARETO_SECONDS_PER_SWEEP_POINT + PARETO_SECONDS_PER_SWEEP_TOKEN * vocab))
        yield (f"pareto, {points} random points, V = {vocab:,}", estimate,
               lambda: pareto(target, draft, None, methods, points, 0))


CASES = (lp_cases, table_cases, three_draft_cases, recursion_cases, chain_cases, simulation_cases,
         improvement_cases, pareto_cases)
SHAPES = (LP_SHAPES, TABLE_SHAPES, THREE_DRAFT_VOCABS, RECURSION_VOCABS, CHAIN_SHAPES, SIMULATION_SHAPES,
          IMPROVEMENT_SHAPES, PARETO_SHAPES)


def least_seconds(work, repeats: int) -> tuple[float, float]:
    """(wall, CPU) seconds of the run of least wall clock."""
    best = (float("inf"), float("inf"))
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        work()
        best = min(best, (time.perf_counter() - wall, time.process_time() - cpu))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one small shape per case (seconds)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per case; the least time is kept (3)")
    parser.add_argument("--seed", type=int, default=0)
    record.add_output(parser, None)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    rows = []
    print(f"{'case':<72} {'estimate':>10} {'wall':>10} {'ratio':>6} {'CPU':>10} {'ratio':>6}")
    for cases, shapes in zip(CASES, SHAPES):
        for label, estimate, work in cases(shapes[1] if args.quick else shapes[0], rng):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", BracketWarning)  # a bracket closing short is still the work estimated
                wall, cpu = least_seconds(work, args.repeats)
            rows.append({"case": label, "estimated_seconds": estimate, "wall_seconds": wall, "cpu_seconds": cpu,
                         "ratio": wall / estimate, "cpu_ratio": cpu / estimate})
            print(f"{label:<72} {estimate:>9.3g}s {wall:>9.3g}s {wall / estimate:>6.2f} {cpu:>9.3g}s "
                  f"{cpu / estimate:>6.2f}", flush=True)
    print(f"largest measured / estimated: {max(row['ratio'] for row in rows):.2f} (wall), "
          f"{max(row['cpu_ratio'] for row in rows):.2f} (CPU)")
    if args.output:
        record.write(args.output, {"rows": rows, "settings": vars(args)})


if __name__ == "__main__":
    main()
