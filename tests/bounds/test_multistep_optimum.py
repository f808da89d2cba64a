"""The multi-step optimum (SPEC.md §7.4): the ladder token-wise ≤ block/traversal ≤ best
lossless verifier ≤ best coupling on enumerated chains and trees, the two-token example
10/9, 11/9, 11/9, 12/9, the chain closed form against the coupling LP, block = the best
lossless verifier on chains, traversal below it on a tree."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from specbound.bounds import multistep
from specbound.verifiers import get_verifier
from specbound.verifiers.enumeration import TreeDrafter
from specbound.verifiers.tree import tokenwise_expected_accepted
from support.trees import (
    CHAINS, DERANDOMIZED, TOKENWISE, TREES, TWO_TOKEN, constant_model, probability_rows, random_model,
)

LP_TOLERANCE = 1e-9
BLOCK, TRAVERSAL, SINGLE = get_verifier("block"), get_verifier("traversal"), get_verifier("single")


def test_two_token_example_ladder():
    """p = (1/3, 2/3), q = (2/3, 1/3) at every position, γ = 2: 10/9 < 11/9 = 11/9 < 12/9."""
    tokenwise = TWO_TOKEN.expectation(0, lambda tree: tokenwise_expected_accepted(tree, SINGLE))
    assert tokenwise == pytest.approx(10 / 9, abs=1e-12)
    assert TWO_TOKEN.expectation(0, BLOCK.expected_accepted) == pytest.approx(11 / 9, abs=1e-12)
    assert TWO_TOKEN.lossless_verifier_optimum(0) == pytest.approx(11 / 9, abs=LP_TOLERANCE)
    assert TWO_TOKEN.coupling_optimum(0) == pytest.approx(12 / 9, abs=LP_TOLERANCE)
    assert TWO_TOKEN.chain_coupling_optimum(0) == pytest.approx(12 / 9, abs=1e-12)


@pytest.mark.parametrize("drafter", CHAINS.values(), ids=CHAINS.keys())
def test_chain_coupling_optimum_closed_form_equals_the_lp(drafter):
    assert drafter.coupling_optimum(0) == pytest.approx(drafter.chain_coupling_optimum(0), abs=LP_TOLERANCE)


@pytest.mark.parametrize("drafter", CHAINS.values(), ids=CHAINS.keys())
def test_chain_ladder_and_block_is_the_best_lossless_verifier(drafter):
    """token-wise ≤ block = best lossless verifier ≤ best coupling ([BLOCK]'s optimality)."""
    tokenwise = drafter.expectation(0, lambda tree: tokenwise_expected_accepted(tree, SINGLE))
    block = drafter.expectation(0, BLOCK.expected_accepted)
    verifier = drafter.lossless_verifier_optimum(0)
    assert tokenwise <= block + 1e-12
    assert block == pytest.approx(verifier, abs=LP_TOLERANCE)
    assert verifier <= drafter.coupling_optimum(0) + LP_TOLERANCE


@pytest.mark.parametrize("drafter", TREES.values(), ids=TREES.keys())
def test_tree_ladder(drafter):
    """token-wise RRS ≤ traversal ≤ best lossless verifier ≤ best coupling ≤ depth."""
    tokenwise = drafter.expectation(0, lambda tree: tokenwise_expected_accepted(tree, TOKENWISE[drafter.draft_scheme]))
    traversal = drafter.expectation(0, TRAVERSAL.expected_accepted)
    verifier = drafter.lossless_verifier_optimum(0)
    coupling = drafter.coupling_optimum(0)
    depth = max(tree.max_depth for _, tree in drafter.enumerate(0))
    assert tokenwise <= traversal + 1e-12
    assert traversal <= verifier + LP_TOLERANCE
    assert verifier <= coupling + LP_TOLERANCE
    assert coupling <= depth + LP_TOLERANCE


def test_traversal_is_not_the_best_lossless_verifier_of_a_tree():
    """Unlike block verification on chains: the best lossless verifier of these drafted
    trees keeps 0.11 more drafts per step than traversal (1.268 against 1.158)."""
    drafter = TREES["tree-s8-V3-3x1-with_re-eos"]
    assert drafter.lossless_verifier_optimum(0) - drafter.expectation(0, TRAVERSAL.expected_accepted) > 0.1


@DERANDOMIZED
@given(probability_rows(3), probability_rows(3), st.integers(1, 3))
def test_context_free_chain_coupling_optimum_is_the_sum_of_block_overlaps(target_row, draft_row, depth):
    drafter = TreeDrafter(constant_model(target_row), constant_model(draft_row), (1,) * depth)
    overlap = 0.0
    target_k, draft_k = np.array(1.0), np.array(1.0)
    for _ in range(depth):
        target_k, draft_k = np.multiply.outer(target_k, target_row), np.multiply.outer(draft_k, draft_row)
        overlap += np.minimum(target_k, draft_k).sum()
    assert drafter.coupling_optimum(0) == pytest.approx(overlap, abs=LP_TOLERANCE)


@DERANDOMIZED
@given(st.integers(0, 10_000), st.integers(1, 3), st.integers(2, 3))
def test_deterministic_drafts_close_the_whole_ladder(seed, depth, vocab):
    """q = δ_x: every rung equals Σ_k P_target(x…x, k tokens); nothing is left to optimise."""
    token = seed % vocab
    target = random_model(seed, vocab)
    drafter = TreeDrafter(target, constant_model(np.eye(vocab)[token]), (1,) * depth)
    path_probs = np.cumprod([target((0,) + (token,) * k)[token] for k in range(depth)]).sum()
    assert drafter.expectation(0, BLOCK.expected_accepted) == pytest.approx(path_probs, abs=1e-12)
    assert drafter.lossless_verifier_optimum(0) == pytest.approx(path_probs, abs=LP_TOLERANCE)
    assert drafter.coupling_optimum(0) == pytest.approx(path_probs, abs=LP_TOLERANCE)


def test_coupling_lp_on_given_arrays():
    """Two trees, two sequences: the LP puts the mass where the prefixes are longest."""
    value = multistep.coupling_optimum([0.5, 0.5], [0.5, 0.5], [[2, 0], [1, 1]])
    assert value == pytest.approx(0.5 * 2 + 0.5 * 1, abs=LP_TOLERANCE)
    assert multistep.coupling_optimum([1.0], [1.0], [[0]]) == 0.0


def test_bad_inputs_raise_naming_the_argument():
    with pytest.raises(ValueError, match="prefix_lengths"):
        multistep.coupling_optimum([1.0], [0.5, 0.5], [[1]])
    with pytest.raises(ValueError, match="tree_probs"):
        multistep.coupling_optimum([-1.0], [1.0], [[1]])
    with pytest.raises(ValueError, match="tree_of"):
        multistep.lossless_verifier_optimum([1.0], [1], [0], np.ones((1, 1)), [1.0])
    with pytest.raises(ValueError, match="draft_block_laws"):
        multistep.chain_coupling_optimum([np.ones(2)], [np.ones(3)])
    with pytest.raises(ValueError, match="branching"):
        TreeDrafter(constant_model([0.5, 0.5]), constant_model([0.5, 0.5]), (2, 1)).chain_coupling_optimum(0)
