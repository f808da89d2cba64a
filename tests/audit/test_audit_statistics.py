"""The auditor's tests on numbers alone (``audit.pit``): exact PIT uniformity, the false-alarm
rate under the tolerant null at most the level (tolerances computed from the path and per
shared context included), the power ``detectable_shift`` claims, and the measured
disagreement between batch shapes."""

import math

import numpy as np
import pytest
import torch
from scipy import stats as scipy_stats

from specbound.audit.pit import (FLOOR, ContextGroup, context_test, detectable_sharpening, detectable_shift,
                                 disagreement, pit_values, pooled_test, sharpness_terms, sharpness_test)

TRIALS = 2000
LEVEL = 0.05


def binomial_ceiling(trials: int, rate: float, significance: float = 1e-4) -> int:
    """The count of ``trials`` events of probability ``rate`` exceeded with probability < significance."""
    return int(scipy_stats.binom.isf(significance, trials, rate))


def test_pit_of_a_token_drawn_from_its_law_is_uniform_by_enumeration():
    """P(u ≤ x) = x exactly: each token's interval, weighted by its probability, tiles [0, 1]
    in the ranking order (ties by id)."""
    probs = torch.tensor([[0.1, 0.4, 0.1, 0.4, 0.0]], dtype=torch.float64)
    for x in np.linspace(0, 1, 21):
        mass = 0.0
        for token in range(5):
            ones = torch.ones(1, dtype=torch.float64)
            low = pit_values(probs, torch.tensor([token]), 0 * ones)[0]
            high = pit_values(probs, torch.tensor([token]), ones)[0]
            if high > low:
                mass += float(probs[0, token]) * min(1.0, max(0.0, (x - low) / (high - low)))
        assert mass == pytest.approx(x, abs=1e-12)


def test_pit_ranks_by_decreasing_probability_ties_by_id():
    probs = torch.tensor([[0.1, 0.4, 0.1, 0.4]])
    starts = pit_values(probs.expand(4, 4), torch.arange(4), torch.zeros(4, dtype=torch.float64))
    assert starts.tolist() == pytest.approx([0.8, 0.0, 0.9, 0.4])


def shifted_values(rng, n: int, edge: float, shift: float) -> np.ndarray:
    """n values whose law puts edge + shift on [0, edge] (uniform on each side)."""
    below = rng.random(n) < edge + shift
    return np.where(below, rng.random(n) * edge, edge + rng.random(n) * (1 - edge))


@pytest.mark.parametrize("edge", [0.1, 0.5])
@pytest.mark.parametrize("tolerance", [0.0, 0.02])
def test_pooled_false_alarm_rate_at_most_the_level_at_the_tolerance(edge, tolerance):
    """Values shifted by exactly the tolerance across an edge (the worst the tolerant null
    allows there) are rejected at most at the level's rate (the bound is conservative)."""
    rng = np.random.default_rng(1)
    rejected = sum(pooled_test(shifted_values(rng, 400, edge, tolerance), tolerance).p_value <= LEVEL
                   for _ in range(TRIALS))
    assert rejected <= binomial_ceiling(TRIALS, LEVEL)


def test_pooled_false_alarm_rate_at_most_the_level_with_a_tolerance_computed_from_the_path():
    """The tolerance a measurement sets depends on the path; an engine at the null's edge that
    shifts the most where the path allows it (0.1 after a value below the edge, none after one
    above) is still rejected at most at the level's rate when the test is given the path's
    mean allowance — the mixture over λ, not a λ chosen after seeing it (``audit.pit``)."""
    rng = np.random.default_rng(11)
    n, edge, allowance = 400, 0.5, 0.1
    rejected = 0
    for _ in range(TRIALS):
        values, allowed, below = np.empty(n), np.empty(n), True
        for t in range(n):
            allowed[t] = allowance if below else 0.0
            below = rng.random() < edge + allowed[t]
            values[t] = rng.random() * edge if below else edge + rng.random() * (1 - edge)
        rejected += pooled_test(values, allowed.mean()).p_value <= LEVEL
    assert rejected <= binomial_ceiling(TRIALS, LEVEL)


@pytest.mark.parametrize("edge", [0.1, 0.5, 0.8])
def test_a_shift_of_detectable_size_is_caught_with_the_stated_power(edge):
    n, tolerance, level = 2000, 0.01, 1e-3
    shift = detectable_shift(n, tolerance, level)
    assert 0.04 < shift < 0.15  # a sanity range for this size
    rng = np.random.default_rng(2)
    trials = 400
    missed = sum(pooled_test(shifted_values(rng, n, edge, -shift if edge == 0.8 else shift), tolerance).p_value > level
                 for _ in range(trials))
    assert missed <= binomial_ceiling(trials, 0.01)


def test_detectable_shift_shrinks_as_one_over_root_n_toward_the_tolerance():
    shifts = [detectable_shift(n, 0.0, 1e-3) for n in (10_000, 40_000)]
    assert shifts[1] == pytest.approx(shifts[0] / 2, rel=0.1)
    assert detectable_shift(10**7, 0.02, 1e-3) == pytest.approx(0.02, abs=0.003)
    assert math.isinf(detectable_shift(20, 0.0, 1e-3))  # too few values to reject anything


def multinomial_groups(rng, laws: np.ndarray, samples: int, drawn_laws: np.ndarray | None = None):
    """One shared first-position context per row of ``laws``, ``samples`` draws each, from
    ``drawn_laws`` (default: the laws themselves)."""
    drawn_laws = laws if drawn_laws is None else drawn_laws
    groups = []
    for prompt, (law, drawn) in enumerate(zip(laws, drawn_laws)):
        order = np.argsort(-law, kind="stable")[:8]
        group = ContextGroup(prompt, 1, order.tolist(), law[order].tolist())
        group.drawn = rng.choice(law.size, size=samples, p=drawn).tolist()
        groups.append(group)
    return groups


def test_context_false_alarm_rate_at_most_the_level():
    rng = np.random.default_rng(3)
    laws = rng.dirichlet(np.ones(12) * 0.5, size=4)
    rejected = sum(context_test(multinomial_groups(rng, laws, 64), 4, 0.0).p_value <= LEVEL for _ in range(TRIALS // 4))
    assert rejected <= binomial_ceiling(TRIALS // 4, LEVEL)


def test_context_test_tolerates_row_tolerance_and_catches_more():
    """Laws moved by TV 0.05 pass at row_tolerance 0.05 at the level's rate, and fail at 0."""
    rng = np.random.default_rng(4)
    laws = rng.dirichlet(np.ones(12), size=4)
    moved = laws.copy()
    moved[:, 0] += 0.05
    moved[:, 1:] *= (1 - moved[:, 0:1]) / moved[:, 1:].sum(axis=1, keepdims=True)
    trials = 200
    tolerated = sum(context_test(multinomial_groups(rng, laws, 2000, moved), 4, 0.05).p_value <= LEVEL
                    for _ in range(trials))
    assert tolerated <= binomial_ceiling(trials, LEVEL)
    assert context_test(multinomial_groups(rng, laws, 2000, moved), 4, 0.0).p_value < 1e-6


def test_context_test_tolerates_each_groups_own_row_tolerance():
    """Groups whose laws are moved by their own tolerance (0.02 to 0.08: a measured row each)
    pass at the level's rate; the same draws fail with no tolerance."""
    rng = np.random.default_rng(5)
    laws = rng.dirichlet(np.ones(12), size=4)
    shifts = np.array([0.02, 0.04, 0.06, 0.08])
    moved = laws.copy()
    moved[:, 0] += shifts
    moved[:, 1:] *= (1 - moved[:, 0:1]) / moved[:, 1:].sum(axis=1, keepdims=True)

    def groups():
        drawn = multinomial_groups(rng, laws, 2000, moved)
        for group, shift in zip(drawn, shifts):
            group.tolerance = float(shift)
        return drawn

    trials = 200
    assert sum(context_test(groups(), 4).p_value <= LEVEL for _ in range(trials)) <= binomial_ceiling(trials, LEVEL)
    assert context_test(groups(), 4, 0.0).p_value < 1e-6


def test_tokens_a_top_k_law_leaves_out_are_one_category_with_the_rest():
    """A row of two tokens (top-k 2) is tested as three categories — the two and the rest —
    so the Bonferroni factor is 2·3, not 2·(K + 1): the zero-mass tokens cost no power."""
    group = ContextGroup(0, 1, list(range(8)), [0.6, 0.4] + [0.0] * 6)
    group.drawn = [0] * 660 + [1] * 340
    upper = scipy_stats.binom.sf(660 - 1, 1000, 0.6)
    assert context_test([group], 1).p_value == pytest.approx(2 * 3 * upper)
    group.drawn[-1] = 5  # a token the law excludes, counted in the rest
    assert context_test([group], 1).p_value < 1e-9


def test_disagreement_is_the_largest_over_the_other_shapes():
    probs = torch.tensor([[0.5, 0.3, 0.2], [0.9, 0.1, 0.0]], dtype=torch.float64)
    others = torch.stack([probs, torch.tensor([[0.4, 0.4, 0.2], [0.9, 0.05, 0.05]], dtype=torch.float64)])
    tv, drift, excess = disagreement(probs, others)
    assert tv == pytest.approx([0.1, 0.05])
    same = disagreement(probs, probs[None])
    assert np.allclose(same[0], 0) and np.allclose(same[1], 0) and np.allclose(same[2], 0)
    scores = probs.clamp(min=FLOOR).log()
    centred = scores - (probs * scores).sum(dim=1, keepdim=True)
    assert drift == pytest.approx((others[1] * centred).sum(dim=1).abs().numpy())
    assert np.all(excess >= 0)


def test_sharpness_score_is_centred_with_the_rows_variance_by_enumeration():
    """A token drawn from the row itself: E[X] = 0 and E[X²] = σ², enumerated over tokens."""
    probs = torch.tensor([[0.6, 0.3, 0.07, 0.02, 0.006, 0.004]], dtype=torch.float64)
    terms = [sharpness_terms(probs, torch.tensor([token])) for token in range(6)]
    weights = probs[0].tolist()
    assert sum(w * total for w, (total, _, _) in zip(weights, terms)) == pytest.approx(0.0, abs=1e-12)
    variance = terms[0][2]
    assert sum(w * total**2 for w, (total, _, _) in zip(weights, terms)) == pytest.approx(variance, rel=1e-12)
    assert terms[0][1] == pytest.approx(math.sqrt(variance))
    assert terms[4][0] == terms[5][0]  # both below the floor: scored alike
    sure = torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64)
    assert sharpness_terms(sure, torch.tensor([0])) == (0.0, 0.0, 0.0)  # a sure row adds nothing


def spreads(rng, positions: int) -> np.ndarray:
    """σ per position as a language model's rows give them: many sure rows, some spread."""
    return np.where(rng.random(positions) < 0.4, 0.0, rng.gamma(2.0, 0.35, positions).clip(max=1.8))


def sharpness_totals(rng, means: np.ndarray, seconds: np.ndarray, trials: int, skew: float) -> np.ndarray:
    """ΣX of ``trials`` audits whose scores have these means and second moments: two-point
    laws, P(low point) = ``skew`` (0.5: symmetric; small: a rare large drop, as at a row sure
    of its top token). # -> [trials]"""
    scale = np.sqrt(np.maximum(seconds - means**2, 0.0))
    low = rng.random((trials, means.size)) < skew
    standard = np.where(low, -math.sqrt((1 - skew) / skew), math.sqrt(skew / (1 - skew)))
    values = means + scale * standard
    assert np.abs(values).max() <= -math.log(FLOOR)  # the bound the test's proof needs
    return values.sum(axis=1)


@pytest.mark.parametrize("side", [-1, 1])
@pytest.mark.parametrize("tolerance, variance_tolerance", [(0.0, 0.0), (0.05, 0.1)])
@pytest.mark.parametrize("skew", [0.5, 0.2])
def test_sharpness_false_alarm_rate_at_most_the_level_at_the_tolerance(side, tolerance, variance_tolerance, skew):
    """Scores drifted by exactly κσ at every row with second moments (1 + ν)σ² — the edge of
    the null, on either side — are rejected at most at the level's rate."""
    rng = np.random.default_rng(7)
    sigma = spreads(rng, 1500)
    totals = sharpness_totals(rng, side * tolerance * sigma, (1 + variance_tolerance) * sigma**2, TRIALS, skew)
    rejected = sum(sharpness_test(total, sigma.sum(), (sigma**2).sum(), tolerance, variance_tolerance).p_value <= LEVEL
                   for total in totals)
    assert rejected <= binomial_ceiling(TRIALS, LEVEL)


@pytest.mark.parametrize("side", [-1, 1])
def test_a_temperature_error_of_detectable_size_is_caught_with_the_stated_power(side):
    """Scores drifted by ±εσ² (a temperature off by the share ε) at the ε
    ``detectable_sharpening`` states are rejected with probability ≥ 0.99."""
    rng = np.random.default_rng(8)
    sigma = spreads(rng, 4000)
    tolerance, variance_tolerance, level = 0.02, 0.1, 1e-3
    error = detectable_sharpening(sigma.sum(), (sigma**2).sum(), tolerance, variance_tolerance, level)
    assert 0.05 < error < 0.5  # a sanity range for 4000 rows
    trials = 400
    totals = sharpness_totals(rng, side * error * sigma**2, sigma**2 + (error * sigma**2) ** 2, trials, 0.5)
    missed = sum(sharpness_test(total, sigma.sum(), (sigma**2).sum(), tolerance, variance_tolerance).p_value > level
                 for total in totals)
    assert missed <= binomial_ceiling(trials, 0.01)


def test_sharpness_power_grows_with_the_rows_spread_not_their_count():
    """Sure rows (σ = 0) dilute the pooled test but not this one: the detectable error
    depends on Σσ and Σσ² alone, and shrinks as 1/√ of them."""
    small = detectable_sharpening(400.0, 400.0, 0.0, 0.0, 1e-3)
    large = detectable_sharpening(1600.0, 1600.0, 0.0, 0.0, 1e-3)
    assert large == pytest.approx(small / 2, rel=0.15)
    assert math.isinf(detectable_sharpening(0.0, 0.0, 0.0, 0.0, 1e-3))
    assert sharpness_test(0.0, 0.0, 0.0, 0.05, 0.1).p_value == 1.0
