"""[YIN]'s experiments on Markov-chain pairs and on one token (SPEC.md §1-§3): the numbers of
``specbound theory convergence|drafts|improvement|pareto``, as plain dictionaries (saved as
JSON by the command line, which also draws them with ``specbound.plots.theory``).

Chains are drawn by ``random_chain_pair`` from the seed (rows of P_t, then of Q_t, i.i.d.
Dirichlet(concentration·1); uniform prompt law); the Monte Carlo runs continue the same
generator. N_rej is the paper's count (rounds ending in a rejection); target calls also
count a last round that reached the horizon without one.
"""

from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass

import numpy as np
from tqdm import tqdm

from specbound.chains.simulation import simulate_decoding
from specbound.chains.theory import (
    MarkovChainPair,
    batch_expected_rejections,
    batch_improvement,
    bernoulli_batch_improvement,
    lookahead_expected_cost,
    random_chain_pair,
    uniform_batch_improvement,
)
from specbound.probability import as_target_and_draft, total_variation
from specbound.statistics import mean_and_standard_error, running_mean_and_standard_error
from specbound.verifiers.biased import epsilon_sweep, loss_star, rejection_probability

@dataclass(frozen=True)
class Experiment:
    """An experiment's numbers (saved as JSON, printed with --json) and what its figure
    needs beyond them (per-run curves, random points)."""

    numbers: dict
    figure: dict


CHAIN_LAW = "rows of P_t then Q_t i.i.d. Dirichlet(concentration·1), uniform prompt law"
CHECKPOINTS = (10, 30, 100, 300, 1000, 3000, 10000)


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
    chain, rng = setting.draw()
    curve_drafts = np.unique(np.geomspace(1, max_drafts, 40).round().astype(int)).tolist()
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
    drafts = list(range(1, max_drafts + 1))
    bernoulli_curves, uniform_curves = {}, {}
    for draft_mean, target_mean in bernoulli:
        bernoulli_curves[f"u = {draft_mean:g}, v = {target_mean:g}"] = _improvement_curve(
            [1 - target_mean, target_mean], [1 - draft_mean, draft_mean],
            lambda m: bernoulli_batch_improvement(draft_mean, target_mean, m), drafts,
        )
    for vocab_size, support in uniform:
        if not 1 <= support <= vocab_size:
            raise ValueError(f"--uniform: need 1 ≤ V′ ≤ V, got V = {vocab_size}, V′ = {support}")
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
    tv = float(total_variation(target, draft)[0])
    epsilons = epsilons or np.linspace(0, max(float(np.max(draft - target)), 1e-3), 21).tolist()
    acceptances = np.random.default_rng(seed).random((random_points, target.shape[1]))
    points = np.column_stack([loss_star(target, draft, acceptances), rejection_probability(target, draft, acceptances)])
    sweeps = [vars(point) for method in methods for point in epsilon_sweep(target, draft, epsilons, method)]
    return Experiment({"target": target[0].tolist(), "draft": draft[0].tolist(), "total_variation": tv,
                       "sweeps": sweeps}, {"epsilons": epsilons, "random_points": points})
