"""[YIN]'s experiments on Markov-chain pairs and on one token (SPEC.md §1-§3): the numbers of
``specbound theory convergence|drafts|improvement|pareto``, as plain dictionaries (saved as
JSON by the command line, which also draws them with ``specbound.plots.theory``).

Chains are drawn by ``random_chain_pair`` from the seed (rows of P_t, then of Q_t, i.i.d.
Dirichlet(concentration·1); uniform prompt law); the Monte Carlo runs continue the same
generator. N_rej is the paper's count (rounds ending in a rejection); target calls also
count a last round that reached the horizon without one.

Each experiment first adds up the estimated time and memory of its parts (the chain, the
exact costs, the Monte Carlo runs, the curves: ``chains.theory`` and ``chains.simulation``
say what each costs) and refuses with ``checks.WorkLimitError`` — naming the sizes of the
largest part — when the sum is above ``EXPERIMENT_SECONDS_LIMIT`` or a part needs more than
``EXPERIMENT_BYTES_LIMIT``; nothing starts that would not finish.
"""

from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass

import numpy as np
from tqdm import tqdm

from specbound.chains.simulation import simulate_decoding, simulation_bytes, simulation_seconds
from specbound.chains.theory import (
    MarkovChainPair,
    batch_expected_rejections,
    batch_improvement,
    batch_improvement_seconds,
    bernoulli_batch_improvement,
    chain_bytes,
    chain_draw_seconds,
    check_lookahead,
    check_num_drafts,
    exact_cost_seconds,
    lookahead_expected_cost,
    random_chain_pair,
    uniform_batch_improvement,
)
from specbound.checks import WORK_BYTES_VARIABLE, WORK_SECONDS_VARIABLE, positive_int, within_work_limit
from specbound.probability import as_target_and_draft, total_variation
from specbound.statistics import mean_and_standard_error, running_mean_and_standard_error
from specbound.verifiers.biased import epsilon_sweep, loss_star, rejection_probability
from specbound.work_limits import (
    PARETO_SECONDS_PER_POINT_TOKEN,
    PARETO_SECONDS_PER_SWEEP_POINT,
    PARETO_SECONDS_PER_SWEEP_TOKEN,
)

@dataclass(frozen=True)
class Experiment:
    """An experiment's numbers (saved as JSON, printed with --json) and what its figure
    needs beyond them (per-run curves, random points)."""

    numbers: dict
    figure: dict


CHAIN_LAW = "rows of P_t then Q_t i.i.d. Dirichlet(concentration·1), uniform prompt law"
CHECKPOINTS = (10, 30, 100, 300, 1000, 3000, 10000)
EXPERIMENT_SECONDS_LIMIT = 30.0
EXPERIMENT_BYTES_LIMIT = 2 * 2**30
BYTES_PER_IMPROVEMENT_ENTRY = 8 * 8  # target, draft, their checked copies, the residual chain
PARETO_BYTES_PER_POINT_ENTRY = 8 * 6


def check_work(parts: list[tuple[str, float, float]]) -> None:
    """Refuse an experiment whose parts (label, seconds, bytes), run one after another,
    would take longer than ``EXPERIMENT_SECONDS_LIMIT`` in all or need more memory than
    ``EXPERIMENT_BYTES_LIMIT`` in one (limits that ``checks.WORK_SECONDS_VARIABLE`` and
    ``checks.WORK_BYTES_VARIABLE`` raise); the message names the largest part's sizes."""
    slowest = max(parts, key=lambda part: part[1])
    within_work_limit(slowest[0], sum(part[1] for part in parts), EXPERIMENT_SECONDS_LIMIT, WORK_SECONDS_VARIABLE,
                      "s", hint="smaller sizes (the estimate adds up every part of the experiment)")
    largest = max(parts, key=lambda part: part[2])
    within_work_limit(largest[0], largest[2], EXPERIMENT_BYTES_LIMIT, WORK_BYTES_VARIABLE, "bytes",
                      hint="smaller sizes")


def _chain_part(setting: ChainSetting) -> tuple[str, float, float]:
    return (f"horizon × vocab_size² (T = {setting.horizon:,}, V = {setting.vocab_size:,})",
            chain_draw_seconds(setting.horizon, setting.vocab_size), chain_bytes(setting.horizon, setting.vocab_size))


def _simulation_part(label: str, setting: ChainSetting, runs: int, num_drafts=1, lookahead=None):
    sizes = (runs, setting.horizon, setting.vocab_size, num_drafts, lookahead)
    return (f"{label} (runs = {runs:,}, M = {num_drafts:,}, T = {setting.horizon:,}, V = {setting.vocab_size:,})",
            simulation_seconds(*sizes) + exact_cost_seconds(setting.horizon, setting.vocab_size, num_drafts, lookahead),
            simulation_bytes(*sizes))


@dataclass(frozen=True)
class ChainSetting:
    """Which random chain pair an experiment runs on."""

    horizon: int = 50
    vocab_size: int = 7
    seed: int = 10
    concentration: float = 1.0

    def draw(self) -> tuple[MarkovChainPair, np.random.Generator]:
        """The chain drawn from the seed, and the generator the runs continue with."""
        rng = np.random.default_rng(self.seed)
        return random_chain_pair(self.horizon, self.vocab_size, rng, self.concentration), rng

    def describe(self) -> dict:
        return {**asdict(self), "chain_law": CHAIN_LAW}


def convergence(setting: ChainSetting, runs: int, lookaheads, progress: bool = False) -> Experiment:
    """Monte Carlo N_rej of single-draft speculative sampling (K = ∞) converging to Thm 1's
    exact value, with the running mean per number of runs; then finite lookaheads γ with a
    bonus token, exact against Monte Carlo, on the same chain."""
    positive_int("num_runs", runs)
    for lookahead in lookaheads:
        check_lookahead(lookahead)
    check_work([_chain_part(setting), _simulation_part("runs × horizon² × vocab_size", setting, runs)]
               + [_simulation_part(f"lookaheads γ = {lookahead} × runs × horizon × vocab_size", setting, runs,
                                   lookahead=lookahead) for lookahead in lookaheads])
    chain, rng = setting.draw()
    exact = batch_expected_rejections(chain, 1)
    run = simulate_decoding(chain, runs, rng)
    means, errors = running_mean_and_standard_error(run.rejections)
    checkpoints = sorted({n for n in CHECKPOINTS if n < runs} | {runs})
    finite = []
    for lookahead in tqdm(lookaheads, desc="lookahead γ", file=sys.stderr, disable=not progress):
        cost = lookahead_expected_cost(chain, 1, lookahead)
        simulated = simulate_decoding(chain, runs, rng, lookahead=lookahead)
        finite.append({
            "lookahead": lookahead,
            "exact_rejections": cost.rejections,
            "mc_rejections": mean_and_standard_error(simulated.rejections),
            "exact_target_calls": cost.target_calls,
            "mc_target_calls": mean_and_standard_error(simulated.target_calls),
            "tokens_per_call": cost.tokens_per_call,
        })
    return Experiment({
        **setting.describe(), "runs": runs,
        "exact_rejections": exact.rejections, "mc_rejections": mean_and_standard_error(run.rejections),
        "exact_target_calls": exact.target_calls, "mc_target_calls": mean_and_standard_error(run.target_calls),
        "acceleration": exact.acceleration, "tokens_per_call": exact.tokens_per_call,
        "convergence": [{"runs": n, "mean_rejections": float(means[n - 1]),
                         "standard_error": float(errors[n - 1])} for n in checkpoints],
        "finite_lookahead": finite,
    }, {"running_means": means, "running_errors": errors})


def drafts(setting: ChainSetting, max_drafts: int, simulated_drafts, runs: int, progress: bool = False) -> Experiment:
    """E[N_rej] of batch speculative decoding against M (Thm 3) on a log grid up to
    ``max_drafts``, its positive M → ∞ limit, and Monte Carlo at ``simulated_drafts``."""
    positive_int("max_drafts", max_drafts)
    positive_int("num_runs", runs)
    for num_drafts in simulated_drafts:
        check_num_drafts(num_drafts)
    sizes = (setting.horizon, setting.vocab_size)
    curve_label = f"max_drafts × horizon × vocab_size² (M ≤ {max_drafts:,}, T = {setting.horizon:,}, V = {setting.vocab_size:,})"
    check_work([(curve_label, exact_cost_seconds(*sizes, max_drafts), 0.0)])  # its last point alone, first
    curve_drafts = np.unique(np.geomspace(1, max_drafts, 40).round().astype(int)).tolist()
    check_work(
        [_chain_part(setting),
         (curve_label, sum(exact_cost_seconds(*sizes, m) for m in curve_drafts) + exact_cost_seconds(*sizes, math.inf),
          0.0)]
        + [_simulation_part("simulated_drafts × runs × horizon² × vocab_size", setting, runs, num_drafts)
           for num_drafts in simulated_drafts])
    chain, rng = setting.draw()
    curve = [batch_expected_rejections(chain, m) for m in curve_drafts]
    limit = batch_expected_rejections(chain, math.inf)
    simulated = []
    for num_drafts in tqdm(simulated_drafts, desc="Monte Carlo M", file=sys.stderr, disable=not progress):
        run = simulate_decoding(chain, runs, rng, num_drafts=num_drafts)
        exact = batch_expected_rejections(chain, num_drafts)
        simulated.append({"num_drafts": num_drafts, "exact_rejections": exact.rejections,
                          "acceleration": exact.acceleration,
                          "mc_rejections": mean_and_standard_error(run.rejections)})
    return Experiment({
        **setting.describe(), "runs": runs,
        "curve": [{"num_drafts": m, "exact_rejections": cost.rejections, "exact_target_calls": cost.target_calls}
                  for m, cost in zip(curve_drafts, curve)],
        "limit": {"exact_rejections": limit.rejections, "exact_target_calls": limit.target_calls,
                  "acceleration": limit.acceleration},
        "monte_carlo": simulated,
    }, {})


def _improvement_curve(target, draft, closed_form, drafts) -> tuple[list, list, float]:
    """(closed form per M, general formula TV − Π r_m per M, general formula at M = ∞)."""
    general = [float(batch_improvement(target, draft, m)[0]) for m in drafts]
    limit = float(batch_improvement(target, draft, math.inf)[0])
    return [closed_form(m) for m in drafts], general, limit


def improvement(max_drafts: int, bernoulli, uniform) -> Experiment:
    """Single-token batch improvement BI(M) = TV − Π_m TV(p^m, q) for M = 1..max_drafts:
    the Bernoulli (draft mean u : target mean v) and uniform (V : V′) closed forms of
    [YIN] §3.2 against the general formula."""
    positive_int("max_drafts", max_drafts)
    for vocab_size, support in uniform:
        if not 1 <= support <= vocab_size:
            raise ValueError(f"--uniform: need 1 ≤ V′ ≤ V, got V = {vocab_size}, V′ = {support}")
    curves = [("bernoulli", 2)] * len(bernoulli) + [(f"uniform V = {vocab_size:,}", vocab_size) for vocab_size, _ in uniform]
    # Σ_{m ≤ M} of one row's cost at m drafts, in closed form: M·(fixed) + M(M+1)/2·(per step)
    check_work([(f"max_drafts² × V ({label}, M = {max_drafts:,})",
                 max_drafts * batch_improvement_seconds(vocab_size, 0)
                 + max_drafts * (max_drafts + 1) / 2 * (batch_improvement_seconds(vocab_size, 1)
                                                        - batch_improvement_seconds(vocab_size, 0))
                 + batch_improvement_seconds(vocab_size, math.inf),
                 BYTES_PER_IMPROVEMENT_ENTRY * vocab_size) for label, vocab_size in curves])
    drafts = list(range(1, max_drafts + 1))
    bernoulli_curves, uniform_curves = {}, {}
    for draft_mean, target_mean in bernoulli:
        bernoulli_curves[f"u = {draft_mean:g}, v = {target_mean:g}"] = _improvement_curve(
            [1 - target_mean, target_mean], [1 - draft_mean, draft_mean],
            lambda m: bernoulli_batch_improvement(draft_mean, target_mean, m), drafts,
        )
    for vocab_size, support in uniform:
        uniform_curves[f"V = {vocab_size}, V′ = {support} (r = {vocab_size / support:.3g})"] = _improvement_curve(
            np.r_[np.full(support, 1 / support), np.zeros(vocab_size - support)],
            np.full(vocab_size, 1 / vocab_size),
            lambda m: uniform_batch_improvement(vocab_size, support, m), drafts,
        )
    return Experiment({"num_drafts": drafts, "bernoulli": bernoulli_curves, "uniform": uniform_curves,
                       "curve_format": "label -> [closed form per M, general formula per M, M = ∞]"}, {})


def pareto(target_probs, draft_probs, epsilons, methods, random_points: int, seed: int) -> Experiment:
    """The bias/rejection plane of one token: TV(p, q) (the front), ``random_points``
    random acceptance vectors b ~ U[0,1]^V with their least bias Loss*(b), and an ε sweep
    per method (``verifiers.biased.SWEEP_METHODS``); ε defaults to 21 values from 0 to
    max(q − p)."""
    target, draft = as_target_and_draft(target_probs, draft_probs)
    positive_int("random_points", random_points)
    vocab_size = target.shape[1]
    sweep_points = (len(epsilons) if epsilons else 21) * len(methods)
    check_work([
        (f"random_points × vocabulary ({random_points:,} × {vocab_size:,})",
         PARETO_SECONDS_PER_POINT_TOKEN * random_points * vocab_size, PARETO_BYTES_PER_POINT_ENTRY * random_points * vocab_size),
        (f"epsilons × methods × vocabulary ({sweep_points:,} sweep points × {vocab_size:,})",
         sweep_points * (PARETO_SECONDS_PER_SWEEP_POINT + PARETO_SECONDS_PER_SWEEP_TOKEN * vocab_size), PARETO_BYTES_PER_POINT_ENTRY * vocab_size),
    ])
    tv = float(total_variation(target, draft)[0])
    epsilons = epsilons or np.linspace(0, max(float(np.max(draft - target)), 1e-3), 21).tolist()
    acceptances = np.random.default_rng(seed).random((random_points, target.shape[1]))
    points = np.column_stack([loss_star(target, draft, acceptances), rejection_probability(target, draft, acceptances)])
    sweeps = [vars(point) for method in methods for point in epsilon_sweep(target, draft, epsilons, method)]
    return Experiment({"target": target[0].tolist(), "draft": draft[0].tolist(), "total_variation": tv,
                       "sweeps": sweeps}, {"epsilons": epsilons, "random_points": points})
