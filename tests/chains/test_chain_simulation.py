"""Monte Carlo decoding on Markov chains: the mean cost matches the exact theory within 4σ
(T = 50) and the emitted sequences follow the target chain (χ² at level 0.001)."""

import itertools

import numpy as np
import pytest
from scipy import stats

from specbound.chains.simulation import simulate_decoding
from specbound.statistics import mean_and_standard_error
from specbound.chains.theory import (
    MarkovChainPair,
    batch_expected_rejections,
    lookahead_expected_cost,
    random_chain_pair,
)

SIGNIFICANCE = 1e-3
SIGMAS = 4.0


def assert_within_sigmas(samples, exact):
    mean, standard_error = mean_and_standard_error(samples)
    assert abs(mean - exact) <= SIGMAS * standard_error, (mean, standard_error, exact)


@pytest.mark.parametrize(("num_drafts", "lookahead"), [(1, None), (3, None), (1, 4), (2, 3)])
def test_simulated_cost_matches_the_exact_cost_within_4_sigma(num_drafts, lookahead):
    chain = random_chain_pair(50, 7, np.random.default_rng(10))
    exact = lookahead_expected_cost(chain, num_drafts, lookahead)
    if lookahead is None:
        exact = batch_expected_rejections(chain, num_drafts)  # Thm 1 / Thm 3
    run = simulate_decoding(chain, 1500, np.random.default_rng(100 + num_drafts), num_drafts, lookahead)
    assert_within_sigmas(run.rejections, exact.rejections)
    assert_within_sigmas(run.target_calls, exact.target_calls)


def sparse_chain(seed, horizon, vocab_size):
    """Dirichlet(0.5) rows with one exact zero per row (tokens a chain never proposes)."""
    rng = np.random.default_rng(seed)
    matrices = []
    for _ in range(2):
        rows = rng.dirichlet(np.full(vocab_size, 0.5), size=(horizon, vocab_size))
        np.put_along_axis(rows, rng.integers(vocab_size, size=(horizon, vocab_size, 1)), 0.0, -1)
        matrices.append(rows / rows.sum(axis=-1, keepdims=True))
    return MarkovChainPair(matrices[0], matrices[1], np.full(vocab_size, 1 / vocab_size))


def target_chain_probabilities(chain):
    """P(x_0..x_T) under the target chain for every sequence, in itertools.product order."""
    sequences = np.array(
        list(itertools.product(range(chain.vocab_size), repeat=chain.horizon + 1))
    )
    probs = chain.prompt_probs[sequences[:, 0]]
    for position in range(1, chain.horizon + 1):
        probs = probs * chain.target_transitions[
            position - 1, sequences[:, position - 1], sequences[:, position]
        ]
    return probs


def chi_square_p_value(counts, probs, min_expected=5.0):
    """Pearson χ² p-value, pooling cells with expected count < ``min_expected`` into one."""
    expected = probs * counts.sum()
    assert np.all(counts[probs == 0] == 0), "a sequence the target chain never emits appeared"
    small = expected < min_expected
    observed = np.r_[counts[~small], counts[small].sum()]
    expected = np.r_[expected[~small], expected[small].sum()]
    keep = expected > 0
    return stats.chisquare(observed[keep], expected[keep]).pvalue


@pytest.mark.parametrize(
    ("num_drafts", "lookahead"), [(1, None), (2, None), (3, None), (1, 1), (2, 2)]
)
@pytest.mark.parametrize("chain_seed", [21, 22])
def test_simulated_sequences_follow_the_target_chain(num_drafts, lookahead, chain_seed):
    chain = sparse_chain(chain_seed, 3, 3)
    run = simulate_decoding(chain, 20_000, np.random.default_rng(chain_seed), num_drafts, lookahead)
    sequences = np.column_stack([run.prompt_tokens, run.sequences])
    cells = np.ravel_multi_index(sequences.T, (chain.vocab_size,) * (chain.horizon + 1))
    counts = np.bincount(cells, minlength=chain.vocab_size ** (chain.horizon + 1))
    assert chi_square_p_value(counts, target_chain_probabilities(chain)) > SIGNIFICANCE


def test_counts_are_consistent_per_run():
    chain = random_chain_pair(20, 5, np.random.default_rng(1))
    for lookahead in (None, 3):
        run = simulate_decoding(chain, 500, np.random.default_rng(2), 2, lookahead)
        assert run.sequences.shape == (500, 20) and run.prompt_tokens.shape == (500,)
        assert np.all(run.rejections <= run.target_calls)
        if lookahead is None:  # K = ∞: only the last round can end without a rejection
            assert np.all(run.target_calls <= run.rejections + 1)


def test_simulation_is_reproducible_with_a_seed():
    chain = random_chain_pair(10, 4, np.random.default_rng(1))
    first = simulate_decoding(chain, 200, np.random.default_rng(7), 2, 3)
    second = simulate_decoding(chain, 200, np.random.default_rng(7), 2, 3)
    np.testing.assert_array_equal(first.sequences, second.sequences)
    np.testing.assert_array_equal(first.rejections, second.rejections)


@pytest.mark.parametrize(
    ("arguments", "name"),
    [
        ({"num_runs": 0}, "num_runs"),
        ({"num_drafts": 0}, "num_drafts"),
        ({"num_drafts": float("inf")}, "num_drafts"),
        ({"lookahead": 0}, "lookahead"),
    ],
)
def test_invalid_simulation_arguments_are_refused(arguments, name):
    chain = random_chain_pair(3, 3, np.random.default_rng(1))
    settings = {"num_runs": 10, "num_drafts": 1, "lookahead": None} | arguments
    with pytest.raises(ValueError, match=name):
        simulate_decoding(chain, rng=np.random.default_rng(0), **settings)
