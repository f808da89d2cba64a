"""The along-the-trace cost equals Yin's chain theory in expectation, exactly.

For a small non-stationary Markov chain pair every trace (prompt token and T tokens) is
enumerated; the trace estimates weighted by the traces' target probabilities must equal
``chain_theory``'s exact values (Thm 1, Thm 3, finite lookahead) to rounding.
"""

import itertools
import math

import numpy as np
import pytest

from specbound.chains.theory import (
    batch_expected_rejections,
    expected_rejections,
    lookahead_expected_cost,
    random_chain_pair,
)
from specbound.studies.trace_theory import trace_expected_cost

HORIZON, VOCAB = 4, 3


def enumerated_expectation(chain, num_drafts, lookahead, last_token_bonus=False):
    """Σ over all traces of target probability × trace estimate (rejections, calls)."""
    rejections = calls = 0.0
    for sequence in itertools.product(range(VOCAB), repeat=HORIZON + 1):
        previous, tokens = sequence[:-1], np.array(sequence[1:])
        target_rows = chain.target_transitions[np.arange(HORIZON), previous]
        draft_rows = chain.draft_transitions[np.arange(HORIZON), previous]
        weight = chain.prompt_probs[sequence[0]] * np.prod(target_rows[np.arange(HORIZON), tokens])
        cost = trace_expected_cost(target_rows, draft_rows, tokens, num_drafts, lookahead, last_token_bonus)
        rejections += weight * cost.rejections
        calls += weight * cost.target_calls
    return rejections, calls


@pytest.fixture(scope="module")
def chain():
    return random_chain_pair(HORIZON, VOCAB, np.random.default_rng(5), concentration=0.8)


def test_trace_estimate_of_single_draft_rejections_averages_to_thm1(chain):
    rejections, calls = enumerated_expectation(chain, 1, None)
    exact = expected_rejections(chain)
    assert rejections == pytest.approx(exact.rejections, abs=1e-12)
    assert calls == pytest.approx(exact.target_calls, abs=1e-12)


@pytest.mark.parametrize("num_drafts", [2, 3, math.inf])
def test_trace_estimate_of_batch_rejections_averages_to_thm3(chain, num_drafts):
    rejections, calls = enumerated_expectation(chain, num_drafts, None)
    exact = batch_expected_rejections(chain, num_drafts)
    assert rejections == pytest.approx(exact.rejections, abs=1e-12)
    assert calls == pytest.approx(exact.target_calls, abs=1e-12)


@pytest.mark.parametrize("num_drafts, lookahead", [(1, 1), (1, 2), (2, 2), (3, 3)])
def test_trace_estimate_with_finite_lookahead_averages_to_chain_theory(chain, num_drafts, lookahead):
    rejections, calls = enumerated_expectation(chain, num_drafts, lookahead)
    exact = lookahead_expected_cost(chain, num_drafts, lookahead)
    assert rejections == pytest.approx(exact.rejections, abs=1e-12)
    assert calls == pytest.approx(exact.target_calls, abs=1e-12)


def test_single_draft_without_lookahead_is_the_sum_of_total_variations(rng):
    target = rng.dirichlet(np.ones(5), size=6)
    draft = rng.dirichlet(np.ones(5), size=6)
    tokens = rng.integers(0, 5, size=6)
    cost = trace_expected_cost(target, draft, tokens, last_token_bonus=False)
    assert cost.rejections == pytest.approx(0.5 * np.abs(target - draft).sum())


def test_the_engine_round_makes_the_last_token_a_bonus(rng):
    """With the engine's depth cut the horizon's last position is never verified when the
    round reaching it started earlier; a one-token horizon is a lone bonus."""
    target = rng.dirichlet(np.ones(4), size=1)
    draft = rng.dirichlet(np.ones(4), size=1)
    cost = trace_expected_cost(target, draft, [0])
    assert cost.rejections == 0.0 and cost.target_calls == 1.0


def test_bad_tokens_are_rejected(rng):
    target = rng.dirichlet(np.ones(4), size=3)
    with pytest.raises(ValueError, match="tokens"):
        trace_expected_cost(target, target, [0, 1])
    with pytest.raises(ValueError, match="tokens"):
        trace_expected_cost(target, target, [0, 1, 7])
