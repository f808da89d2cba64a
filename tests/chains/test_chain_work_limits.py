"""Chains refuse, before they start, work that would not finish or fit (``checks.
WorkLimitError``), and the checks change no number within the limits: a lookahead beyond the
horizon is the horizon, exactly."""

import math

import numpy as np
import pytest

from specbound.chains.simulation import simulate_decoding
from specbound.chains.theory import (
    ExpectedCost,
    MarkovChainPair,
    batch_expected_rejections,
    lookahead_expected_cost,
    random_chain_pair,
)
from specbound.checks import WorkLimitError
from specbound.tables.chains import ChainSetting, convergence, drafts, improvement


@pytest.fixture
def chain():
    return random_chain_pair(6, 4, np.random.default_rng(0))


def test_a_chain_beyond_the_memory_limit_is_refused_before_it_is_drawn():
    with pytest.raises(WorkLimitError, match=r"horizon × vocab_size² \(T = 50, V = 100,000\)"):
        random_chain_pair(50, 100_000, np.random.default_rng(0))


@pytest.mark.parametrize("lookahead", [6, 7, 10**9, 10**20])
def test_a_lookahead_beyond_the_horizon_costs_what_the_horizon_costs(chain, lookahead):
    """γ = 10⁹ used to allocate [V, γ + 1] offsets; no round drafts past T."""
    capped, infinite = lookahead_expected_cost(chain, 2, lookahead), lookahead_expected_cost(chain, 2, None)
    assert capped == infinite


def test_a_simulation_with_a_lookahead_beyond_the_horizon_draws_what_the_horizon_draws(chain):
    at_horizon = simulate_decoding(chain, 200, np.random.default_rng(1), lookahead=6)
    beyond = simulate_decoding(chain, 200, np.random.default_rng(1), lookahead=10**20)
    np.testing.assert_array_equal(at_horizon.sequences, beyond.sequences)
    np.testing.assert_array_equal(at_horizon.target_calls, beyond.target_calls)


@pytest.mark.parametrize(("runs", "num_drafts"), [(10**12, 1), (1000, 10**9)])
def test_a_simulation_beyond_the_limits_is_refused(chain, runs, num_drafts):
    with pytest.raises(WorkLimitError, match="num_runs × num_drafts"):
        simulate_decoding(chain, runs, np.random.default_rng(0), num_drafts=num_drafts)


def test_the_exact_cost_of_unbounded_drafts_is_refused(chain):
    """M = 10¹² drafts is 10¹² steps of the residual chain; M = ∞ has its closed form."""
    with pytest.raises(WorkLimitError, match="num_drafts × horizon × vocab_size²"):
        batch_expected_rejections(chain, 10**12)
    assert batch_expected_rejections(chain, math.inf).rejections > 0


def test_equal_chains_have_infinite_acceleration_not_a_division_by_zero():
    rows = np.full((3, 2, 2), 0.5)
    cost = batch_expected_rejections(MarkovChainPair(rows, rows, np.array([0.5, 0.5])), 1)
    assert cost.rejections == 0 and cost.acceleration == math.inf
    assert ExpectedCost(3, 1.5, 2.0).acceleration == 2.0


@pytest.mark.parametrize(
    ("experiment", "named"),
    [
        (lambda: drafts(ChainSetting(5, 3), 10**20, [1], 10), "max_drafts"),
        (lambda: drafts(ChainSetting(5, 3), 10, [10**9], 10), "simulated_drafts"),
        (lambda: convergence(ChainSetting(5, 3), 10**10, [2]), "runs"),
        (lambda: improvement(10**5, [(0.9, 0.5)], []), "max_drafts"),
        (lambda: improvement(5, [], [(10**8, 1)]), "uniform V = 100,000,000"),
    ],
)
def test_experiments_add_up_their_parts_and_refuse_before_they_start(experiment, named):
    with pytest.raises(WorkLimitError, match=named):
        experiment()
