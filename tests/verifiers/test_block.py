"""Block verification [BLOCK] (SPEC.md §7.1): lossless by exact enumeration (EOS-like
absorbing tokens, chains cut short), the two-token example, never below token-wise
verification in expectation, its law against its sampling code, and at a real vocabulary."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from specbound.probability import ZeroResidualError
from specbound.verifiers import ScoredTree, get_verifier
from specbound.verifiers.block import block_terms
from specbound.verifiers.enumeration import TreeDrafter
from specbound.verifiers.tree import emit_from, tokenwise_expected_accepted
from support.trees import (
    CHAINS, DERANDOMIZED, TWO_TOKEN, constant_model, lossless_error, probability_rows, random_model,
)

BLOCK = get_verifier("block")
SINGLE = get_verifier("single")


def chain(target_rows, draft_rows, drafts) -> ScoredTree:
    return ScoredTree.chain(0, drafts, np.array(target_rows, dtype=float), np.array(draft_rows, dtype=float))


def test_two_token_example_block_keeps_eleven_ninths():
    assert TWO_TOKEN.expectation(0, BLOCK.expected_accepted) == pytest.approx(11 / 9, abs=1e-12)


@pytest.mark.parametrize("drafter", CHAINS.values(), ids=CHAINS.keys())
def test_block_verification_is_lossless(drafter):
    assert lossless_error(drafter, BLOCK.outcome_law) < 1e-12


def stop_at_eos_or_depth(eos: int, depth: int):
    """Chains that stop after an EOS-like token or at ``depth`` drafts: the drafted block
    ends early, as the engine's max-length cut ends it (a shorter chain)."""
    return lambda prefix: 0 if prefix[-1] == eos or len(prefix) > depth else 1


@pytest.mark.parametrize("seed", range(4))
def test_block_verification_is_lossless_on_chains_cut_at_eos(seed):
    eos = 2
    drafter = TreeDrafter(random_model(seed, 4, eos=eos), random_model(90 + seed, 4), stop_at_eos_or_depth(eos, 3))
    assert {tree.max_depth for _, tree in drafter.enumerate(0)} > {3}  # some blocks end early
    assert lossless_error(drafter, BLOCK.outcome_law) < 1e-12


@pytest.mark.parametrize("drafter", CHAINS.values(), ids=CHAINS.keys())
def test_block_law_is_a_distribution_matching_its_expectation(drafter):
    for _, tree in drafter.enumerate(0):
        law = BLOCK.outcome_law(tree)
        assert law.min() >= 0 and law.sum() == pytest.approx(1.0, abs=1e-12)
        np.testing.assert_allclose(BLOCK.stop_probabilities(tree), law.sum(axis=1), atol=1e-15)
        assert BLOCK.expected_accepted(tree) == pytest.approx(float(tree.depths @ law.sum(axis=1)), abs=1e-12)


@pytest.mark.parametrize("drafter", CHAINS.values(), ids=CHAINS.keys())
def test_block_expectation_is_the_sum_of_prefix_weights(drafter):
    """E[τ] = Σ_i E_Q[w_i]: a prefix's weight is its probability of being kept."""
    weights = drafter.expectation(0, lambda tree: block_terms(tree)[0][1:].sum())
    assert drafter.expectation(0, BLOCK.expected_accepted) == pytest.approx(weights, abs=1e-12)


@pytest.mark.parametrize("drafter", CHAINS.values(), ids=CHAINS.keys())
def test_block_keeps_at_least_as_many_as_tokenwise_in_expectation(drafter):
    """Over the drafts; a single drafted block can keep fewer than token-wise would."""
    block = drafter.expectation(0, BLOCK.expected_accepted)
    tokenwise = drafter.expectation(0, lambda tree: tokenwise_expected_accepted(tree, SINGLE))
    assert block >= tokenwise - 1e-12


def test_a_draft_the_target_excludes_stops_the_block_before_it():
    tree = chain([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5], [0.6, 0.2, 0.2]], [[0.3, 0.3, 0.4], [0.2, 0.2, 0.6]], [2, 0])
    weights, stop, _ = block_terms(tree)
    assert weights[1] == 0.0 and weights[2] == 0.0 and stop[1] == 0.0 and stop[2] == 0.0
    law = BLOCK.outcome_law(tree)
    assert law[1:].sum() == 0.0
    np.testing.assert_allclose(law[0], [0.5, 0.5, 0.0])  # norm((p − q)+) at the root


def test_point_mass_drafts_are_kept_with_the_target_probability():
    tree = chain([[0.6, 0.4], [0.7, 0.3], [0.5, 0.5]], [[1.0, 0.0], [1.0, 0.0]], [0, 0])
    np.testing.assert_allclose(block_terms(tree)[0], [1.0, 0.6, 0.42])
    assert BLOCK.expected_accepted(tree) == pytest.approx(0.6 + 0.42, abs=1e-12)


def test_a_fully_kept_block_draws_the_bonus_token_from_the_last_target_row():
    rows = [[0.2, 0.8], [0.9, 0.1], [0.25, 0.75]]
    tree = chain(rows, rows[:2], [1, 0])  # draft = target: the whole block is kept
    np.testing.assert_allclose(BLOCK.outcome_law(tree), [[0, 0], [0, 0], rows[2]], atol=1e-15)
    assert BLOCK.verify_tree(tree, [0.3, 0.99, 0.99]) == (2, 1)


def test_uniforms_and_trees_are_checked():
    tree = TWO_TOKEN.enumerate(0)[0][1]
    with pytest.raises(ValueError, match="uniforms"):
        BLOCK.verify_tree(tree, [0.5, 0.5])
    with pytest.raises(ValueError, match="uniforms"):
        BLOCK.verify_tree(tree, [0.5, 0.5, 1.0])
    with pytest.raises(ValueError, match="uniforms"):
        BLOCK.verify_tree(tree, [0.5, np.nan, 0.5])
    branching = TreeDrafter(constant_model([0.5, 0.5]), constant_model([0.5, 0.5]), (2,))
    tree = next(t for _, t in branching.enumerate(0) if len(t.children(0)) == 2)
    with pytest.raises(ValueError, match="chain"):
        BLOCK.outcome_law(tree)


def test_a_zero_mass_residual_is_never_sampled():
    tree = chain([[0.5, 0.5], [0.5, 0.5]], [[0.5, 0.5]], [0])
    with pytest.raises(ZeroResidualError):  # residual (p − q)+ = 0 at the root: τ = 0 is impossible
        emit_from(block_terms(tree)[2][0], 0.5)
    assert BLOCK.verify_tree(tree, [0.5, 0.999]).node == 1  # h_1 = w_1 = 1 is always taken


def test_block_verify_agrees_with_its_law_by_monte_carlo():
    """Realised (τ, next token) frequencies under seeded uniforms vs the exact law."""
    drafter = TreeDrafter(random_model(11, 3), random_model(12, 3, point_mass_prob=0.0), (1, 1, 1))
    rng = np.random.default_rng(7)
    tree = drafter.sample(0, rng)
    law = BLOCK.outcome_law(tree)
    draws = 8000
    counts = np.zeros_like(law)
    for uniforms in rng.random((draws, tree.num_nodes)):
        counts[BLOCK.verify_tree(tree, uniforms)] += 1
    assert np.all(np.abs(counts / draws - law) <= 4 * np.sqrt(law * (1 - law) / draws) + 1e-12)


def test_block_runs_at_a_real_vocabulary():
    """γ = 8 at V = 151,936. A decision costs O(γ·V), measured by
    ``benchmarks/verifiers/bench_multistep_verifiers.py``."""
    rng = np.random.default_rng(0)
    gamma, vocab = 8, 151_936
    target = rng.dirichlet(np.full(vocab, 0.05), size=gamma + 1)
    draft = 0.5 * target[:gamma] + 0.5 * rng.dirichlet(np.full(vocab, 0.05), size=gamma)
    drafts = [int(rng.choice(vocab, p=row)) for row in draft]
    tree = ScoredTree.chain(0, drafts, target, draft)
    verdict = BLOCK.verify_tree(tree, rng.random(gamma + 1))
    expected = BLOCK.expected_accepted(tree)
    assert 0 <= verdict.node <= gamma and 0 <= verdict.next_token < vocab and 0 <= expected <= gamma
    assert BLOCK.stop_probabilities(tree).sum() == pytest.approx(1.0, abs=1e-12)


@DERANDOMIZED
@given(st.integers(0, 10_000), st.integers(1, 3), st.integers(2, 4))
def test_deterministic_drafts_make_block_equal_tokenwise(seed, gamma, vocab):
    """q a point mass at every prefix: w_i = Π_{j≤i} p(x_j), E[τ] = Σ_i Π_{j≤i} p(x_j) for both."""
    token = seed % vocab
    drafter = TreeDrafter(random_model(seed, vocab), constant_model(np.eye(vocab)[token]), (1,) * gamma)
    [(_, tree)] = drafter.enumerate(0)
    path_probs = np.cumprod([tree.target_probs[i, token] for i in range(gamma)]).sum()
    assert BLOCK.expected_accepted(tree) == pytest.approx(path_probs, abs=1e-12)
    assert tokenwise_expected_accepted(tree, SINGLE) == pytest.approx(path_probs, abs=1e-12)


@DERANDOMIZED
@given(st.integers(0, 10_000), st.integers(1, 3))
def test_a_draft_equal_to_the_target_is_always_kept(seed, gamma):
    model = random_model(seed, 3)
    for _, tree in TreeDrafter(model, model, (1,) * gamma).enumerate(0):
        assert BLOCK.expected_accepted(tree) == gamma
        assert BLOCK.outcome_law(tree)[gamma].sum() == pytest.approx(1.0, abs=1e-15)


@DERANDOMIZED
@given(probability_rows(3), probability_rows(3), st.integers(1, 3))
def test_context_free_block_keeps_the_running_clipped_ratio(target_row, draft_row, gamma):
    """E[τ] = Σ_i E_Q[w_i], w_i = min(1, w_{i−1}·p(x_i)/q(x_i)), by brute force over drafts."""
    drafter = TreeDrafter(constant_model(target_row), constant_model(draft_row), (1,) * gamma)
    expected = 0.0
    for probability, tree in drafter.enumerate(0):
        weight = 1.0
        for token in tree.tokens[1:]:
            weight = min(1.0, weight * target_row[token] / draft_row[token])
            expected += probability * weight
    assert drafter.expectation(0, BLOCK.expected_accepted) == pytest.approx(expected, abs=1e-12)
