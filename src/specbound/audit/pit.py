"""The auditor's two tests, on numbers only: sampled tokens against the reference's laws.

**Probability integral transform (PIT).** At a position whose reference law is ``probs``
(a row of the vocabulary) and whose sampled token is x, rank the tokens by decreasing
reference probability (ties: lower id first) and draw V ~ Uniform(0, 1) independent of
everything; the randomised PIT is u = (mass of the tokens ranked before x) + V·probs[x]. If x
was drawn from ``probs``, u ~ Uniform(0, 1) exactly; if x was drawn from a law P, u has the
density P(y)/probs(y) on token y's interval, so TV(law of u, Uniform) = TV(P, probs). In a
sampled sequence the PIT values are independent uniforms whatever the history, for each is
uniform given everything before it; a position after the sequence ended (EOS, or fewer tokens
than asked) gets a fresh uniform, so an audit of ``samples`` sequences of ``max_new_tokens``
holds a fixed N = samples · max_new_tokens values.

**The pooled test (every position).** With B bins, edge e_j = j/B (j = 1..B−1), the count
C_j = #{u ≤ e_j}. The null H0(δ) is that at each position the engine's conditional law is
within TV δ_t of the reference's, the δ_t averaging at most δ (``tolerance``) over the N
positions along every path: δ absorbs rounding differences between batch shapes (llama.cpp's
kernels are not batch-invariant: ``benchmarks/results/llamacpp_invariance.json`` measures a
mean per-row TV of 0.006 and a largest of 0.043 at T = 0.7). Then P(u_t ≤ e_j | past) = p_t
with Σ p_t ≤ N(e_j + δ), and for c = e^λ − 1 > 0 the product Π(1 + c p_t) ≤ (1 + c(e_j + δ))^N
(AM–GM), so E[exp(λ C_j)] ≤ (1 + c(e_j + δ))^N and Chernoff's bound gives
P(C_j ≥ Nx) ≤ exp(−N·KL(x ‖ e_j + δ)) for x > e_j + δ — a binomial tail bound that holds for
adaptive sampling. The lower tail is the same with e_j − δ. Each of the 2(B−1) tails is
bounded so, and the pooled p-value is 2(B−1) times the smallest bound (Bonferroni): under
H0(δ) it rejects with probability ≤ level.

**Its power (``detectable_shift``).** An engine that, at every position, puts at least d more
(or less) mass than the reference on the tokens ranked before one edge — the reference's most
likely tokens holding e_j of its mass, against the rest — has Σ p_t ≥ N(e_j + d); the same
bound on the other side gives P(C_j < Nc) ≤ exp(−N·KL(c ‖ e_j + d)), c the rejection
threshold. ``detectable_shift`` is the least d for which that is ≤ 1 − power (0.99 power) at
every edge and on both sides. Such a shift is a TV of at least d; a bias whose moves cancel
in the ranking (as much mass up as down across every edge) is not caught by this test.

**The shared-context test.** Samples that reached the same context (the same prompt and the
same tokens so far — at the first position, every sample of a prompt) draw their next tokens
independently from one law, whatever the engine. Per such context, the count of each of the
reference's K most likely tokens there, and of the rest, is binomial with a probability within
``row_tolerance`` of the reference's (one row's rounding, not a mean): exact binomial tails on
both sides. Given everything before position t, the contexts at t are fixed and their next
tokens independent, so Bonferroni over the contexts and categories at t bounds the false alarm
at t; positions are weighted in advance (the first 1/2, each later one 1/(2(T − 1))), so the
test's false-alarm rate is at most the level. A bias in any direction at a shared context is
seen here, not only one along the reference's ranking.

**The sharpness test (every position, its noise scaled to each row's uncertainty).** A
verifier that accepts too much or rejects into the wrong law sharpens or flattens the
engine's laws: it emits the reference's likely tokens more (or less) often than the reference
does. Score each sampled token by f(y) = log max(probs[y], φ) (``FLOOR`` φ: tokens below it
score alike, so f is bounded by b = −log φ) and centre it on the reference:
X = f(x) − m, m = Σ probs·f, whose variance under the reference is σ² = Σ probs·(f − m)². A
row the reference is sure of has σ ≈ 0 and adds neither signal nor noise, unlike the pooled
test's values. Rounding moves every logit a little, so it moves the engine's mean of f by at
most about σ·(the logits' error) (Cauchy–Schwarz): the null H0(κ, ν) is that along every path
the engine's conditional means d_t = E'[X_t] satisfy Σ|d_t| ≤ κ·Σσ_t and its second moments
Σ E'[X_t²] ≤ (1 + ν)·Σσ_t² (``sharpness_tolerance`` κ, ``variance_tolerance`` ν). For
Y ≤ b and λ ≥ 0, e^{λY} ≤ 1 + λY + Y²·g(λ), g(λ) = (e^{λb} − 1 − λb)/b² (Bennett: (e^u − 1 −
u)/u² increases), so exp(λΣX_t − λΣd_t − g(λ)ΣE'[X_t²]) is a supermartingale from 1, and under
H0 its value at the end is at least exp(λΣX − λκΣσ − g(λ)(1 + ν)Σσ²); the mean of that over a
fixed grid of λ (``SHARP_GRID``) has expectation ≤ 1, so by Markov 1/mean is a p-value for
sharpening; −X (also ≤ b) gives flattening's, and the test's p-value is twice the smaller.

**Its power (``detectable_sharpening``).** Sampling at temperature T/(1 + ε) instead of T
moves the mean of log probs[x] by about ε·σ² at each row: an engine with ΣE'[X] = ±ε·Σσ² is
caught with probability ≥ 0.99 once Bernstein's bound puts ΣX past the rejection threshold,
P(ΣX ≤ mean − u) ≤ exp(−u²/(2(Σσ² + b·u/3))). ``detectable_sharpening`` is the least such ε
on both sides, at the audit's Σσ and Σσ²: the error in temperature (as a share) it catches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from scipy import stats as scipy_stats

BINS = 10  # B: PIT edges at j/B
CATEGORIES = 8  # K: the reference's most likely tokens of a shared context counted apart, the rest pooled
POWER = 0.99  # the detection probability ``detectable_shift`` and ``detectable_sharpening`` are stated for
FLOOR = 0.01  # φ of the sharpness test: f(y) = log max(probs[y], φ), bounded by b = −log φ
SHARP_GRID = np.geomspace(1e-3, 4.0, 48)  # λ of the sharpness test's mixture (module docstring)


def pit_values(probs: torch.Tensor, tokens: torch.Tensor, uniforms: torch.Tensor) -> np.ndarray:
    """Randomised PIT of ``tokens`` under the rows of ``probs`` (module docstring), tokens
    ranked by decreasing probability, ties by id.  # [n, vocab], [n], [n] -> [n] float64"""
    probs = probs.to(torch.float64)
    taken = probs.gather(1, tokens[:, None].long())  # [n, 1]
    ids = torch.arange(probs.shape[1])[None]
    before = (probs > taken) | ((probs == taken) & (ids < tokens[:, None]))
    mass_before = (probs * before).sum(dim=1)
    values = mass_before + uniforms.to(torch.float64) * taken[:, 0]
    return values.clamp(0.0, 1.0).numpy()


def bernoulli_kl(x, mean):
    """KL(Bernoulli(x) ‖ Bernoulli(mean)), elementwise, +inf where x lies outside mean's support."""
    x, mean = np.asarray(x, dtype=np.float64), np.asarray(mean, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        up = np.where(x > 0, x * np.log(x / mean), 0.0)
        down = np.where(x < 1, (1 - x) * np.log((1 - x) / (1 - mean)), 0.0)
    return np.nan_to_num(up + down, nan=np.inf)


def chernoff_tails(counts, n: int, low_means, high_means) -> tuple[np.ndarray, np.ndarray]:
    """Bounds on P(C ≥ count) under Σp_t ≤ n·high and on P(C ≤ count) under Σp_t ≥ n·low
    (module docstring), elementwise.  # [edges] -> [edges], [edges]"""
    fraction = np.asarray(counts, dtype=np.float64) / n
    high, low = np.clip(high_means, 0.0, 1.0), np.clip(low_means, 0.0, 1.0)
    upper = np.where(fraction > high, np.exp(-n * bernoulli_kl(fraction, high)), 1.0)
    lower = np.where(fraction < low, np.exp(-n * bernoulli_kl(fraction, low)), 1.0)
    return upper, lower


def edges(bins: int = BINS) -> np.ndarray:
    return np.arange(1, bins) / bins


@dataclass(frozen=True)
class PooledTest:
    p_value: float  # Bonferroni over the 2(B−1) tails, ≤ 1
    edge: float  # the edge of the smallest tail
    fraction: float  # C_j / N at that edge
    fractions: np.ndarray  # C_j / N at every edge  # [B−1]
    n: int


def pooled_test(values: np.ndarray, tolerance: float, bins: int = BINS) -> PooledTest:
    """The pooled PIT test of ``values`` (module docstring).  # [N] -> PooledTest"""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    n = values.size
    cuts = edges(bins)
    fractions = (values[None] <= cuts[:, None]).sum(axis=1) / n
    upper, lower = chernoff_tails(fractions * n, n, cuts - tolerance, cuts + tolerance)
    tails = np.minimum(upper, lower)
    worst = int(np.argmin(tails))
    return PooledTest(float(min(1.0, 2 * len(cuts) * tails[worst])), float(cuts[worst]), float(fractions[worst]),
                      fractions, n)


def _kl(x: float, mean: float) -> float:
    """``bernoulli_kl`` of two numbers, for the bisections."""
    up = x * math.log(x / mean) if x > 0 else 0.0
    down = (1 - x) * math.log((1 - x) / (1 - mean)) if x < 1 else 0.0
    return up + down


def _bisect(function, low: float, high: float, steps: int = 60) -> float:
    """The x in [low, high] where the increasing ``function`` crosses 0."""
    for _ in range(steps):
        middle = (low + high) / 2
        low, high = (middle, high) if function(middle) < 0 else (low, middle)
    return high


def detectable_shift(n: int, tolerance: float, level: float, bins: int = BINS, power: float = POWER) -> float:
    """The least per-position shift d across any one edge that the pooled test of ``n``
    values rejects with probability ≥ ``power`` (module docstring); inf where none is."""
    needed = math.log(2 * (bins - 1) / level) / n  # KL the threshold must reach from the null's mean
    missed = math.log(1 / (1 - power)) / n  # KL the alternative's mean must reach from the threshold
    worst = 0.0
    for cut in edges(bins):
        for side in (1, -1):  # the upper tail, then the lower one (mirrored: x -> 1 − x)
            null, base = (cut + tolerance, cut) if side == 1 else (1 - cut + tolerance, 1 - cut)
            if null >= 1 or math.log(1 / null) < needed:  # even a count of n is not rejected
                return math.inf
            threshold = _bisect(lambda x: _kl(x, null) - needed, null, 1.0)
            if threshold >= 1 or math.log(1 / threshold) < missed:
                return math.inf
            mean = _bisect(lambda m: _kl(threshold, m) - missed, threshold, 1.0 - 1e-15)
            worst = max(worst, mean - base)
    return worst


@dataclass
class ContextGroup:
    """The samples that reached one context (prompt and tokens so far) at one position: the
    reference's most likely tokens there and their masses (the categories), and the tokens
    the samples drew next."""

    prompt: int
    position: int  # 1 = the first new token
    top_tokens: list[int]  # [K]
    top_masses: list[float]  # [K]
    drawn: list[int] = field(default_factory=list)


def top_categories(probs: torch.Tensor, categories: int = CATEGORIES) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``categories`` most likely tokens of each row and their masses.
    # [n, vocab] -> [n, K] int64, [n, K] float64"""
    masses, tokens = torch.topk(probs.to(torch.float64), min(categories, probs.shape[1]), dim=1)
    return tokens, masses


@dataclass(frozen=True)
class ContextTest:
    p_value: float  # weighted Bonferroni over positions (module docstring), ≤ 1
    position: int  # the position of the smallest tail (0 where none was tested)
    prompt: int  # its context's prompt (−1 where none)
    token: int  # its category's token (−1: the rest)
    observed: float  # that category's sampled fraction
    expected: float  # its reference probability
    samples: int  # the samples in that context


def context_test(groups: list[ContextGroup], positions: int, row_tolerance: float) -> ContextTest:
    """The shared-context test (module docstring) over ``groups`` with at least two samples,
    ``positions`` the audit's max_new_tokens (the weights are fixed by it, not by the data)."""
    rows = []  # (position, prompt, token, count, size, mass) per category of a shared context
    for group in groups:
        size = len(group.drawn)
        if size >= 2:
            counts = [group.drawn.count(token) for token in group.top_tokens]
            rest = max(0.0, 1.0 - sum(group.top_masses))
            rows += [(group.position, group.prompt, token, count, size, mass) for token, count, mass
                     in zip(group.top_tokens + [-1], counts + [size - sum(counts)], group.top_masses + [rest])]
    if not rows:
        return ContextTest(1.0, 0, -1, -1, math.nan, math.nan, 0)
    position, prompt, token, count, size, mass = (np.array(column) for column in zip(*rows))
    upper = scipy_stats.binom.sf(count - 1, size, np.minimum(1.0, mass + row_tolerance))
    lower = scipy_stats.binom.cdf(count, size, np.maximum(0.0, mass - row_tolerance))
    tails = np.minimum(upper, lower)
    weights = np.where(position == 1, 0.5, 0.5 / max(positions - 1, 1)) if positions > 1 else np.ones(len(rows))
    tested = {value: 2 * int(np.sum(position == value)) for value in np.unique(position)}
    p_values = np.minimum(1.0, np.array([tested[value] for value in position]) * tails / weights)
    worst = int(np.argmin(p_values))
    return ContextTest(float(p_values[worst]), int(position[worst]), int(prompt[worst]), int(token[worst]),
                       float(count[worst] / size[worst]), float(mass[worst]), int(size[worst]))


@dataclass(frozen=True)
class SharpnessTest:
    p_value: float  # twice the smaller side's, ≤ 1
    total: float  # ΣX: positive where the engine emits the reference's likely tokens more often
    spread: float  # Σσ over the scored positions
    variance: float  # Σσ²
    sharpening: float  # ΣX / Σσ²: about the share by which the temperature is too low (negative: too high)


def sharpness_terms(probs: torch.Tensor, tokens: torch.Tensor) -> tuple[float, float, float]:
    """ΣX, Σσ and Σσ² of one sequence's rows (module docstring).  # [n, vocab], [n] -> 3 floats"""
    probs = probs.to(torch.float64)
    scores = probs.clamp(min=FLOOR).log()
    mean = (probs * scores).sum(dim=1)
    variance = (probs * (scores - mean[:, None]) ** 2).sum(dim=1)
    taken = scores.gather(1, tokens[:, None].long())[:, 0]
    return float((taken - mean).sum()), float(variance.clamp(min=0).sqrt().sum()), float(variance.sum())


def _log_mean_exp(exponents: np.ndarray) -> float:
    top = float(np.max(exponents))
    return top + math.log(float(np.mean(np.exp(exponents - top))))


def sharpness_tails(total: float, spread: float, variance: float, tolerance: float,
                    variance_tolerance: float) -> tuple[float, float]:
    """The one-sided p-values of the sharpness test: (sharpening, flattening)."""
    bound = -math.log(FLOOR)
    growth = np.expm1(SHARP_GRID * bound) - SHARP_GRID * bound  # g(λ)·b²
    penalty = SHARP_GRID * tolerance * spread + growth / bound**2 * (1 + variance_tolerance) * variance
    up = _log_mean_exp(SHARP_GRID * total - penalty)
    down = _log_mean_exp(-SHARP_GRID * total - penalty)
    return math.exp(-max(up, 0.0)), math.exp(-max(down, 0.0))


def sharpness_test(total: float, spread: float, variance: float, tolerance: float,
                   variance_tolerance: float) -> SharpnessTest:
    """The sharpness test of ΣX = ``total`` given Σσ = ``spread`` and Σσ² = ``variance``
    (module docstring)."""
    up, down = sharpness_tails(total, spread, variance, tolerance, variance_tolerance)
    return SharpnessTest(min(1.0, 2 * min(up, down)), float(total), float(spread), float(variance),
                         float(total / variance) if variance > 0 else 0.0)


def detectable_sharpening(spread: float, variance: float, tolerance: float, variance_tolerance: float,
                          level: float, power: float = POWER) -> float:
    """The least temperature error ε (a share, either way) the sharpness test at ``level``
    catches with probability ≥ ``power`` at Σσ = ``spread`` and Σσ² = ``variance`` (module
    docstring); inf where none is."""
    if variance <= 0:
        return math.inf
    bound = -math.log(FLOOR)
    missed = math.log(1 / (1 - power))
    margin = bound * missed / 3 + math.sqrt((bound * missed / 3) ** 2 + 2 * variance * missed)  # Bernstein's u
    worst = 0.0
    for side in (0, 1):
        def rejected(total: float) -> float:
            return 0.0 if 2 * sharpness_tails(total if side == 0 else -total, spread, variance, tolerance,
                                              variance_tolerance)[side] <= level else -1.0
        ceiling = 2 * (tolerance * spread + (1 + variance_tolerance) * variance) + 50 * bound
        if rejected(ceiling) < 0:
            return math.inf
        threshold = _bisect(rejected, 0.0, ceiling)
        worst = max(worst, (threshold + margin) / variance)
    return worst
