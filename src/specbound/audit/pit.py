"""The auditor's three tests, on numbers only: sampled tokens against the reference's laws.

**Probability integral transform (PIT).** At a position whose reference law is ``probs``
(a row of the vocabulary) and whose sampled token is x, rank the tokens by decreasing
reference probability (ties: lower id first) and draw V ~ Uniform(0, 1) independent of
everything; the randomised PIT is u = (mass of the tokens ranked before x) + V·probs[x]. If x
was drawn from ``probs``, u ~ Uniform(0, 1) exactly; if x was drawn from a law P, u has the
density P(y)/probs(y) on token y's interval, so TV(law of u, Uniform) = TV(P, probs). The
reference's row at a position is a function of its context (``audit.reference``), so in a
sampled sequence the PIT values are independent uniforms whatever the history, for each is
uniform given everything before it; a position after the sequence ended (EOS, or fewer tokens
than asked) gets a fresh uniform, so an audit of ``samples`` sequences of ``max_new_tokens``
holds a fixed N = samples · max_new_tokens values.

**The pooled test (every position).** With B bins, edge e_j = j/B (j = 1..B−1), the count
C_j = #{u ≤ e_j}. The null H0(δ) is that at each position the engine's conditional law is
within TV δ_t of the reference's, with Σ_t δ_t ≤ N·δ along every path (``tolerance`` δ: the
mean; δ may itself be computed from the path, as the auditor's measured tolerance is,
``audit.tolerances``). Then P(u_t ≤ e_j | past) = p_t ≤ e_j + δ_t, and for λ > 0, c = e^λ − 1,
exp(λC_j)/Π(1 + c p_t) is a martingale from 1 (each factor's conditional mean is 1), while
Π(1 + c p_t) ≤ (1 + c(e_j + δ))^N on every path of the null (AM–GM, then Σ p_t ≤ N(e_j + δ)).
So W_j = mean over a fixed grid of λ (``POOLED_GRID``) of exp(λC_j)/(1 + c(e_j + δ))^N has
E[W_j] ≤ 1 under H0(δ) — adaptive sampling and a path-dependent δ included — and 1/W_j is a
p-value by Markov (the grid's mean, not its best λ: a λ chosen after seeing C_j and δ would
not be valid). The lower tail is the same on the count of u > e_j, with 1 − e_j + δ. Each of
the 2(B−1) tails is bounded so, and the pooled p-value is 2(B−1) times the smallest
(Bonferroni): under H0(δ) it rejects with probability ≤ level.

**Its power (``detectable_shift``).** An engine that, at every position, puts at least d more
(or less) mass than the reference on the tokens ranked before one edge — the reference's most
likely tokens holding e_j of its mass, against the rest — has Σ p_t ≥ N(e_j + d); Chernoff's
bound on that side gives P(C_j < Nc) ≤ exp(−N·KL(c ‖ e_j + d)), c the count (as a share) at
which W_j reaches 2(B−1)/level. ``detectable_shift`` is the least d for which that is
≤ 1 − power (0.99 power) at every edge and on both sides. Such a shift is a TV of at least d; a
bias whose moves cancel in the ranking (as much mass up as down across every edge) is not
caught by this test.

**The shared-context test.** Samples that reached the same context (the same prompt and the
same tokens so far — at the first position, every sample of a prompt) draw their next tokens
independently from one law, whatever the engine. Per such context, the count of each of the
reference's K most likely tokens there (those of positive mass: the rest of a top-k law is
one category), and of the rest, is binomial with a probability within
that context's row tolerance of the reference's (one row's rounding, not a mean: the
group's own, measured at its row, or one ``row_tolerance`` for all): exact binomial tails on
both sides. The reference's row at a context and its tolerance are functions of the context
(``audit.reference``: every row is computed in forwards of fixed shapes). Given everything
before position t, the contexts at t are fixed and their next
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
Σ E'[X_t²] ≤ (1 + ν)·Σσ_t² (``sharpness_tolerance`` κ, ``variance_tolerance`` ν; either may be
computed from the path, as the measured ones are: the bound below holds path by path). For
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
POOLED_GRID = np.geomspace(1e-3, 8.0, 40)  # λ of the pooled test's mixture (module docstring)


def pit_intervals(probs: torch.Tensor, tokens: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Each token's PIT interval under its row of ``probs``: the mass ranked before it and its
    own (module docstring: decreasing probability, ties by id).  # [n, vocab], [n] -> [n], [n] float64"""
    probs = probs.to(torch.float64)
    taken = probs.gather(1, tokens[:, None].long())  # [n, 1]
    ids = torch.arange(probs.shape[1])[None]
    before = (probs > taken) | ((probs == taken) & (ids < tokens[:, None]))
    return (probs * before).sum(dim=1).numpy(), taken[:, 0].numpy()


def pit_values(probs: torch.Tensor, tokens: torch.Tensor, uniforms: torch.Tensor) -> np.ndarray:
    """Randomised PIT of ``tokens`` under the rows of ``probs`` (module docstring).
    # [n, vocab], [n], [n] -> [n] float64"""
    mass_before, taken = pit_intervals(probs, tokens)
    return np.clip(mass_before + np.asarray(uniforms, dtype=np.float64) * taken, 0.0, 1.0)


def mixture_tails(counts, n: int, means) -> np.ndarray:
    """1/W: the p-value of a count C of n indicators whose conditional means sum to at most
    n·``means`` (module docstring), elementwise, W the mean over ``POOLED_GRID`` of
    exp(λC)/(1 + (e^λ − 1)·mean)^n.  # [edges], [edges] -> [edges]"""
    counts = np.asarray(counts, dtype=np.float64)[None]
    means = np.clip(np.asarray(means, dtype=np.float64), 0.0, 1.0)[None]
    grid = POOLED_GRID[:, None]
    exponents = grid * counts - n * np.log1p(np.expm1(grid) * means)  # [grid, edges]
    top = exponents.max(axis=0)
    log_mean = top + np.log(np.exp(exponents - top).mean(axis=0))
    return np.exp(-np.maximum(log_mean, 0.0))


def edges(bins: int = BINS) -> np.ndarray:
    return np.arange(1, bins) / bins


@dataclass(frozen=True)
class PooledTest:
    p_value: float  # Bonferroni over the 2(B−1) tails, ≤ 1
    edge: float  # the edge of the smallest tail
    fraction: float  # C_j / N at that edge
    fractions: np.ndarray  # C_j / N at every edge  # [B−1]
    n: int


_GROWTH = np.expm1(POOLED_GRID)  # e^λ − 1 over the grid


def _log_mixture(count: float, n: int, mean: float) -> float:
    """log W of ``mixture_tails`` for one count, in plain floats (the bisections)."""
    exponents = POOLED_GRID * count - n * np.log1p(_GROWTH * min(max(mean, 0.0), 1.0))
    top = float(exponents.max())
    return top + math.log(float(np.exp(exponents - top).sum()) / POOLED_GRID.size)


def pooled_test(values: np.ndarray, tolerance: float, bins: int = BINS) -> PooledTest:
    """The pooled PIT test of ``values`` (module docstring).  # [N] -> PooledTest"""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    n = values.size
    cuts = edges(bins)
    counts = (values[None] <= cuts[:, None]).sum(axis=1)
    fractions = counts / n
    tails = np.minimum(mixture_tails(counts, n, cuts + tolerance), mixture_tails(n - counts, n, 1 - cuts + tolerance))
    worst = int(np.argmin(tails))
    return PooledTest(float(min(1.0, 2 * len(cuts) * tails[worst])), float(cuts[worst]), float(fractions[worst]),
                      fractions, n)


def _kl(x: float, mean: float) -> float:
    """KL(Bernoulli(x) ‖ Bernoulli(mean)), for the bisections."""
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
    if n < 1:
        return math.inf
    needed = level / (2 * (bins - 1))  # the tail's p-value that rejects
    missed = math.log(1 / (1 - power)) / n  # KL the alternative's mean must reach from the threshold
    worst = 0.0
    for cut in edges(bins):
        for base in (cut, 1 - cut):  # the upper tail at the edge, then the lower one (mirrored: x -> 1 − x)
            null = base + tolerance
            if null >= 1 or _log_mixture(n, n, null) < -math.log(needed):  # even a count of n is not rejected
                return math.inf
            threshold = _bisect(lambda x: _log_mixture(x * n, n, null) + math.log(needed), null, 1.0, steps=40)
            if threshold >= 1 or math.log(1 / threshold) < missed:
                return math.inf
            mean = _bisect(lambda m: _kl(threshold, m) - missed, threshold, 1.0 - 1e-15, steps=40)
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
    tolerance: float = 0.0  # how far the engine's row here may lie from the reference's, in TV


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


def context_test(groups: list[ContextGroup], positions: int, row_tolerance: float | None = None) -> ContextTest:
    """The shared-context test (module docstring) over ``groups`` with at least two samples,
    ``positions`` the audit's max_new_tokens (the weights are fixed by it, not by the data);
    ``row_tolerance`` None: each group's own."""
    rows = []  # (position, prompt, token, count, size, mass, tolerance) per category of a shared context
    for group in groups:
        size = len(group.drawn)
        if size >= 2:
            kept = [(token, mass) for token, mass in zip(group.top_tokens, group.top_masses) if mass > 0]
            counts = [group.drawn.count(token) for token, _ in kept]
            rest = max(0.0, 1.0 - sum(mass for _, mass in kept))
            tolerance = group.tolerance if row_tolerance is None else row_tolerance
            rows += [(group.position, group.prompt, token, count, size, mass, tolerance) for (token, mass), count
                     in zip(kept + [(-1, rest)], counts + [size - sum(counts)])]
    if not rows:
        return ContextTest(1.0, 0, -1, -1, math.nan, math.nan, 0)
    position, prompt, token, count, size, mass, tolerance = (np.array(column) for column in zip(*rows))
    upper = scipy_stats.binom.sf(count - 1, size, np.minimum(1.0, mass + tolerance))
    lower = scipy_stats.binom.cdf(count, size, np.maximum(0.0, mass - tolerance))
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


def disagreement(probs: torch.Tensor, others: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """How far the same rows computed otherwise (``others``: at other batch shapes) lie from
    ``probs``, per row, the largest over ``others``: the TV; |E'[X]|, and E'[X²] − σ² (at least
    0), X the sharpness score centred on the row of ``probs`` (module docstring), E' under the
    other row.  # [n, vocab], [shapes, n, vocab] -> [n], [n], [n] float64"""
    probs, others = probs.to(torch.float64), others.to(torch.float64)
    scores = probs.clamp(min=FLOOR).log()
    centred = scores - (probs * scores).sum(dim=1, keepdim=True)  # [n, vocab]
    variance = (probs * centred**2).sum(dim=1)
    tv = 0.5 * (others - probs[None]).abs().sum(dim=2).amax(dim=0)
    drift = (others * centred[None]).sum(dim=2).abs().amax(dim=0)
    excess = ((others * centred[None] ** 2).sum(dim=2) - variance[None]).amax(dim=0).clamp(min=0.0)
    return tv.numpy(), drift.numpy(), excess.numpy()


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
