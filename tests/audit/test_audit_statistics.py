"""The auditor's tests on numbers alone (``audit.pit``): exact PIT uniformity, the false-alarm
rate under the tolerant null at most the level, and the power ``detectable_shift`` claims."""

import math

import numpy as np
import pytest
import torch
from scipy import stats as scipy_stats

from specbound.audit.pit import ContextGroup, context_test, detectable_shift, pit_values, pooled_test

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
