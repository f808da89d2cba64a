"""Traversal verification [TRAVERSAL] (SPEC.md §7.2): lossless by exact enumeration on trees
and chains (both sequential draft schemes, ragged shapes, EOS-like tokens), block
verification on a chain in law and draw for draw, its law against its sampling code, and at
a real vocabulary."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from specbound.verifiers import ScoredTree, get_verifier
from specbound.verifiers.enumeration import TreeDrafter
from specbound.verifiers.tree import tokenwise_expected_accepted
from support.trees import (
    CHAINS, DERANDOMIZED, TOKENWISE, TREES, constant_model, lossless_error, random_model,
)

TRAVERSAL = get_verifier("traversal")
BLOCK = get_verifier("block")
ALL = {**TREES, **CHAINS}


@pytest.mark.parametrize("drafter", ALL.values(), ids=ALL.keys())
def test_traversal_verification_is_lossless(drafter):
    assert lossless_error(drafter, TRAVERSAL.outcome_law) < 1e-12


@pytest.mark.parametrize("drafter", CHAINS.values(), ids=CHAINS.keys())
def test_traversal_on_a_chain_is_block_verification(drafter):
    rng = np.random.default_rng(99)
    for _, tree in drafter.enumerate(0):
        np.testing.assert_allclose(TRAVERSAL.outcome_law(tree), BLOCK.outcome_law(tree), atol=1e-12, rtol=0)
        assert TRAVERSAL.expected_accepted(tree) == pytest.approx(BLOCK.expected_accepted(tree), abs=1e-12)
        for uniforms in rng.random((10, tree.num_nodes)):
            assert TRAVERSAL.verify_tree(tree, uniforms) == BLOCK.verify_tree(tree, uniforms)


@pytest.mark.parametrize("drafter", TREES.values(), ids=TREES.keys())
def test_traversal_law_is_a_distribution_matching_its_expectation(drafter):
    for _, tree in drafter.enumerate(0):
        law = TRAVERSAL.outcome_law(tree)
        assert law.min() >= 0 and law.sum() == pytest.approx(1.0, abs=1e-12)
        np.testing.assert_allclose(TRAVERSAL.stop_probabilities(tree), law.sum(axis=1), atol=1e-15)
        assert TRAVERSAL.expected_accepted(tree) == pytest.approx(float(tree.depths @ law.sum(axis=1)), abs=1e-12)


@pytest.mark.parametrize("drafter", TREES.values(), ids=TREES.keys())
def test_traversal_keeps_at_least_as_many_as_tokenwise_rrs_on_these_trees(drafter):
    """Seen on every enumerated tree here, in expectation over the drafts; for chains it is
    [BLOCK]'s theorem, for trees we have no proof."""
    tokenwise = drafter.expectation(0, lambda tree: tokenwise_expected_accepted(tree, TOKENWISE[drafter.draft_scheme]))
    assert drafter.expectation(0, TRAVERSAL.expected_accepted) >= tokenwise - 1e-12


@pytest.mark.parametrize("scheme", ["with_replacement", "without_replacement"])
def test_traversal_verify_agrees_with_its_law_by_monte_carlo(scheme):
    drafter = TreeDrafter(random_model(31, 3), random_model(32, 3, point_mass_prob=0.0), (2, 2), scheme)
    rng = np.random.default_rng(5)
    tree = max((drafter.sample(0, rng) for _ in range(20)), key=lambda t: t.num_nodes)
    law = TRAVERSAL.outcome_law(tree)
    draws = 8000
    counts = np.zeros_like(law)
    for uniforms in rng.random((draws, tree.num_nodes)):
        counts[TRAVERSAL.verify_tree(tree, uniforms)] += 1
    assert np.all(np.abs(counts / draws - law) <= 4 * np.sqrt(law * (1 - law) / draws) + 1e-12)


def test_uniforms_and_draft_schemes_are_checked():
    tree = TREES["tree-s1-V3-2x2-with_re"].sample(0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="uniforms"):
        TRAVERSAL.verify_tree(tree, np.full(tree.num_nodes + 1, 0.5))
    greedy = TreeDrafter(random_model(1, 4), random_model(2, 4, point_mass_prob=0.0), (2,), "greedy")
    with pytest.raises(ValueError, match="sequential draws"):
        TRAVERSAL.outcome_law(greedy.enumerate(0)[0][1])


def test_traversal_runs_at_a_real_vocabulary():
    """A 3×3 tree without replacement (13 nodes, 12 draws) at V = 151,936, built from the
    engine's trusted rows and verified. Its cost, O(draws·V), is measured by
    ``benchmarks/verifiers/bench_multistep_verifiers.py``."""
    rng = np.random.default_rng(1)
    vocab = 151_936
    draft_tokens = {v: tuple(rng.choice(vocab, size=3, replace=False).tolist()) for v in range(4)}
    parents = [-1, 0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    tokens = [0, *(token for v in range(4) for token in draft_tokens[v])]
    target = rng.dirichlet(np.full(vocab, 0.05), size=13)
    draft = np.full((13, vocab), 1.0 / vocab)  # uniform drafts: every draw has q > 0
    tree = ScoredTree(parents, tokens, draft_tokens, "without_replacement", draft, target, check_rows=False)
    verdict = TRAVERSAL.verify_tree(tree, rng.random(tree.num_nodes))
    stopped = TRAVERSAL.stop_probabilities(tree)
    assert 0 <= verdict.node < tree.num_nodes and 0 <= verdict.next_token < vocab
    assert stopped.sum() == pytest.approx(1.0, abs=1e-9) and stopped.min() >= 0


@DERANDOMIZED
@given(st.integers(0, 10_000), st.sampled_from([(2, 1), (2, 2), (1, 3), (3,)]),
       st.sampled_from(["with_replacement", "without_replacement"]))
def test_a_draft_equal_to_the_target_keeps_a_full_depth_path(seed, shape, scheme):
    model = random_model(seed, 3)
    for _, tree in TreeDrafter(model, model, shape, scheme).enumerate(0):
        assert TRAVERSAL.expected_accepted(tree) == pytest.approx(len(shape), abs=1e-12)


@DERANDOMIZED
@given(st.integers(0, 10_000), st.sampled_from([(2, 1), (2, 2), (3, 2)]), st.integers(2, 4))
def test_repeated_point_mass_drafts_count_like_one_chain(seed, shape, vocab):
    """q = δ_x everywhere, i.i.d.: every draw repeats x, a repeat is rejected outright, and
    E[kept] = Σ_k Π_{j≤k} p(x | x^{j−1}), as block verification of the chain x…x."""
    token = seed % vocab
    target = random_model(seed, vocab)
    [(_, tree)] = TreeDrafter(target, constant_model(np.eye(vocab)[token]), shape).enumerate(0)
    path_probs = np.cumprod([target((0,) + (token,) * k)[token] for k in range(len(shape))]).sum()
    assert TRAVERSAL.expected_accepted(tree) == pytest.approx(path_probs, abs=1e-12)
