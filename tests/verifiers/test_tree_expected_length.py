"""The drafted tree, its law, and the exact expected accepted length of one step (SPEC.md
§7.3): token-wise verification with any registered per-node verifier, block and traversal,
against exact enumeration and seeded Monte Carlo; tree verifiers in the registry."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from specbound.tables.bounds import lossless_verifiers
from specbound.verifiers import VERIFIERS, ScoredTree, get_verifier
from specbound.verifiers.enumeration import TreeDrafter
from specbound.verifiers.tree import scored_tree, tokenwise_expected_accepted, tokenwise_outcome_law
from support.trees import (
    CHAINS, DERANDOMIZED, TOKENWISE, TREES, TWO_TOKEN, constant_model, lossless_error, probability_rows, random_model,
)

TARGET = np.array([0.5, 0.3, 0.2])
DRAFT = np.array([0.2, 0.3, 0.5])
DRAFTERS = {**CHAINS, **TREES}


def small_tree(**changes) -> ScoredTree:
    """The root draws (2, 0, 2): children 2 and 0; the child 2 draws (1,)."""
    fields = dict(parents=(-1, 0, 0, 1), tokens=(0, 2, 0, 1), draft_tokens={0: (2, 0, 2), 1: (1,)},
                  draft_scheme="with_replacement", draft_probs=np.vstack([DRAFT, DRAFT, np.zeros(3), np.zeros(3)]),
                  target_probs=np.tile(TARGET, (4, 1)))
    fields.update(changes)
    return ScoredTree(**fields)


# -- the drafted tree ----------------------------------------------------------------------
def test_drafted_tree_structure():
    tree = small_tree()
    assert tree.num_nodes == 4 and tree.vocab_size == 3 and tree.max_depth == 2 and not tree.is_chain
    assert tree.children(0) == (1, 2) and tree.children(1) == (3,) and tree.is_leaf(2)
    assert tree.child_with_token(0, 0) == 2 and tree.child_with_token(0, 1) is None
    assert tree.depths.tolist() == [0, 1, 1, 2]
    assert tree.path_nodes(3) == (1, 3) and tree.path_tokens(3) == (2, 1) and tree.prefix(3) == (0, 2, 1)
    assert tree.longest_root_path((2, 1, 0)) == 2 and tree.longest_root_path((1,)) == 0


def test_chain_constructor_numbers_nodes_by_depth():
    chain = ScoredTree.chain(1, [0, 2], np.tile(TARGET, (3, 1)), np.tile(DRAFT, (2, 1)))
    assert chain.is_chain and chain.parents == (-1, 0, 1) and chain.tokens == (1, 0, 2)
    assert dict(chain.draft_tokens) == {0: (0,), 1: (2,)} and chain.depths.tolist() == [0, 1, 2]


def test_drafted_tree_is_immutable():
    tree = small_tree()
    with pytest.raises(ValueError):
        tree.target_probs[0, 0] = 1.0
    with pytest.raises(TypeError):
        tree.draft_tokens[0] = (1,)


@pytest.mark.parametrize("changes, message", [
    (dict(parents=(-1, 0, 0, 3)), "parent precedes"),
    (dict(tokens=(0, 0, 2, 1)), "distinct draws"),
    (dict(tokens=(0, 2, 0, 7)), "tokens: expected"),
    (dict(draft_tokens={0: (2, 0, 2)}), "internal nodes"),
    (dict(target_probs=np.tile([0.5, 0.3, 0.3], (4, 1))), "target_probs: rows must sum to 1"),
    (dict(target_probs=np.tile(TARGET, (3, 1))), "target_probs: expected"),
    (dict(draft_probs=np.vstack([[0.0, 0.5, 0.5], DRAFT, np.zeros(3), np.zeros(3)])), "zero draft probability"),
    (dict(draft_scheme="without_replacement"), "never repeats"),
    (dict(draft_scheme="no_such_scheme"), "unknown draft scheme"),
])
def test_invalid_trees_are_rejected(changes, message):
    with pytest.raises(ValueError, match=message):
        small_tree(**changes)


def test_trusted_rows_are_kept_without_a_copy_and_the_structure_is_still_checked():
    """The engine's path: float64 rows from its one processing step, not re-checked."""
    target, draft = np.tile(TARGET, (4, 1)), np.vstack([DRAFT, DRAFT, np.zeros(3), np.zeros(3)])
    tree = small_tree(target_probs=target, draft_probs=draft, check_rows=False)
    assert np.shares_memory(tree.target_probs, target) and np.shares_memory(tree.draft_probs, draft)
    assert target.flags.writeable and not tree.target_probs.flags.writeable
    with pytest.raises(ValueError, match="float64"):
        small_tree(target_probs=target.astype(np.float32), check_rows=False)
    with pytest.raises(ValueError, match="distinct draws"):
        small_tree(tokens=(0, 0, 2, 1), check_rows=False)


def test_drafted_tree_from_the_engines_arrays_is_the_checked_tree():
    """float32 torch rows and token tensors per internal node, as the engine holds them."""
    tree = small_tree()
    engine_tree = scored_tree(
        parents=list(tree.parents), tokens=list(tree.tokens),
        draft_tokens={v: torch.tensor(draws) for v, draws in tree.draft_tokens.items()},
        draft_scheme="with_replacement",
        draft_rows={v: torch.tensor(tree.draft_probs[v], dtype=torch.float32) for v in tree.draft_tokens},
        target_rows=torch.tensor(tree.target_probs, dtype=torch.float32),
    )
    assert engine_tree.tokens == tree.tokens and dict(engine_tree.draft_tokens) == dict(tree.draft_tokens)
    traversal = get_verifier("traversal")
    assert traversal.num_uniforms(engine_tree) == 4
    np.testing.assert_allclose(traversal.outcome_law(engine_tree), traversal.outcome_law(tree), atol=1e-7)
    np.testing.assert_allclose(engine_tree.target_probs.sum(axis=1), 1.0, atol=1e-15)


@pytest.mark.parametrize("drafter", DRAFTERS.values(), ids=DRAFTERS.keys())
def test_enumerated_tree_law_sums_to_one(drafter):
    trees = drafter.enumerate(0)
    assert abs(sum(p for p, _ in trees) - 1.0) < 1e-12
    assert len({(t.parents, t.tokens, tuple(sorted(t.draft_tokens.items()))) for _, t in trees}) == len(trees)


def test_duplicate_draws_share_one_child():
    drafter = TreeDrafter(constant_model([0.5, 0.5]), constant_model([0.5, 0.5]), (2, 1))
    trees = [tree for _, tree in drafter.enumerate(1)]
    assert len(trees) == 2 * 2 + 2 * 4  # (a, a), (b, b): one child each; (a, b), (b, a): two
    assert all(tree.children(0) == (1,) for tree in trees if tree.draft_tokens[0] == (0, 0))


def test_without_replacement_stops_at_the_draft_support():
    drafter = TreeDrafter(constant_model([0.2, 0.5, 0.3]), constant_model([0.0, 1.0, 0.0]), (3,), "without_replacement")
    [(probability, tree)] = drafter.enumerate(0)
    assert probability == 1.0 and tree.draft_tokens[0] == (1,)


@pytest.mark.parametrize("scheme", ["with_replacement", "without_replacement"])
def test_sampled_trees_follow_the_enumerated_law(scheme):
    """χ² of sampled tree counts against the enumerated law, trees expected fewer than 5
    times pooled into one cell (seeded: the same p-value on every run)."""
    drafter = TreeDrafter(random_model(3, 3), random_model(4, 3, point_mass_prob=0.0), (2, 1), scheme)
    law = {(t.tokens, tuple(sorted(t.draft_tokens.items()))): p for p, t in drafter.enumerate(0)}
    rng = np.random.default_rng(20240611)
    draws = 2500
    counts = dict.fromkeys(law, 0)
    for _ in range(draws):
        tree = drafter.sample(0, rng)
        counts[(tree.tokens, tuple(sorted(tree.draft_tokens.items())))] += 1  # a KeyError: a tree outside the law
    expected = np.array([law[key] * draws for key in law])
    observed = np.array([counts[key] for key in law])
    rare = expected < 5
    expected = np.append(expected[~rare], expected[rare].sum())
    observed = np.append(observed[~rare], observed[rare].sum())
    assert stats.chisquare(observed, expected).pvalue > 1e-3


# -- token-wise verification with any per-node verifier -----------------------------------
@pytest.mark.parametrize("drafter", DRAFTERS.values(), ids=DRAFTERS.keys())
def test_tokenwise_walk_is_lossless(drafter):
    verifier = TOKENWISE[drafter.draft_scheme]
    assert lossless_error(drafter, lambda tree: tokenwise_outcome_law(tree, verifier)) < 1e-12


PER_NODE_CASES = {  # every lossless per-node verifier, on a tree drafted with its scheme
    name: TreeDrafter(random_model(60 + k, 3), random_model(80 + k, 3, point_mass_prob=0.0),
                      (VERIFIERS[name].fixed_num_drafts or 2,) * 2, get_verifier(name).scheme)
    for k, name in enumerate(sorted(n for n, v in VERIFIERS.items() if v.per_node and v.lossless))
}


@pytest.mark.parametrize("name", PER_NODE_CASES)
def test_tokenwise_walk_with_every_registered_lossless_verifier_is_lossless(name):
    drafter, verifier = PER_NODE_CASES[name], get_verifier(name)
    assert lossless_error(drafter, lambda tree: tokenwise_outcome_law(tree, verifier)) < 1e-10
    for _, tree in drafter.enumerate(0)[:20]:
        law = tokenwise_outcome_law(tree, verifier)
        assert law.sum() == pytest.approx(1.0, abs=1e-12)
        from_law = float(tree.depths @ law.sum(axis=1))
        assert tokenwise_expected_accepted(tree, verifier) == pytest.approx(from_law, abs=1e-12)


def test_tokenwise_walk_with_a_verifier_per_depth_is_lossless():
    """A method's verifier per depth (``Method.verifier_at``): RRS at the root, K-SEQ below."""
    drafter = TreeDrafter(random_model(5, 3), random_model(6, 3), (2, 2))
    rrs, kseq = get_verifier("rrs"), get_verifier("kseq")

    def verifier_at(depth, num_drafts):
        return (rrs if depth == 0 else kseq).for_num_drafts(num_drafts)

    assert lossless_error(drafter, lambda tree: tokenwise_outcome_law(tree, verifier_at)) < 1e-12
    gaps = [tokenwise_expected_accepted(tree, verifier_at) - tokenwise_expected_accepted(tree, rrs)
            for _, tree in drafter.enumerate(0)]
    assert max(np.abs(gaps)) > 1e-3  # the depth-1 verifier is used


def test_tokenwise_refuses_a_verifier_of_another_scheme_and_tree_verifiers():
    tree = small_tree()
    with pytest.raises(ValueError, match="without_replacement drafts"):
        tokenwise_expected_accepted(tree, get_verifier("rrs_without_replacement"))
    with pytest.raises(ValueError, match="per-node verifier"):
        tokenwise_expected_accepted(tree, get_verifier("traversal"))


def test_two_token_example_tokenwise_keeps_ten_ninths():
    expected = TWO_TOKEN.expectation(0, lambda tree: tokenwise_expected_accepted(tree, get_verifier("single")))
    assert expected == pytest.approx(10 / 9, abs=1e-12)


@DERANDOMIZED
@given(probability_rows(3), probability_rows(3), st.integers(1, 3))
def test_context_free_chain_keeps_the_geometric_sum(target_row, draft_row, gamma):
    """One acceptance α = Σ min(p, q) at every position: E[kept] = α + α² + … + α^γ [LEV]."""
    drafter = TreeDrafter(constant_model(target_row), constant_model(draft_row), (1,) * gamma)
    expected = drafter.expectation(0, lambda tree: tokenwise_expected_accepted(tree, get_verifier("single")))
    alpha = np.minimum(target_row, draft_row).sum()
    assert expected == pytest.approx(sum(alpha**k for k in range(1, gamma + 1)), abs=1e-12)


# -- the exact expected length against realised counts ------------------------------------
def standard_error_of(values: np.ndarray) -> float:
    return float(values.std(ddof=1) / np.sqrt(len(values)))


def tokenwise_realised(tree, verifier, rng) -> int:
    """One token-wise walk of ``tree`` with ``verifier``'s own sampling code (SPEC.md §6)."""
    node = 0
    while not tree.is_leaf(node):
        draws = tree.draft_tokens[node]
        verdict = verifier.for_num_drafts(len(draws)).verify(tree.target_probs[node], tree.draft_probs[node],
                                                              [draws], rng)
        child = tree.child_with_token(node, int(verdict.tokens[0]))
        if child is None:
            break
        node = child
    return int(tree.depths[node])


REALISED_CASES = {
    "tokenwise-rrs_without_replacement": (TreeDrafter(random_model(41, 3), random_model(42, 3), (2, 1, 1),
                                                      "without_replacement"), "rrs_without_replacement"),
    "tokenwise-single": (TreeDrafter(random_model(21, 4), random_model(22, 4), (1, 1, 1)), "single"),
    "block": (TreeDrafter(random_model(21, 4), random_model(22, 4), (1, 1, 1)), "block"),
    "traversal": (TreeDrafter(random_model(41, 3), random_model(42, 3), (2, 1, 1), "without_replacement"), "traversal"),
}


@pytest.mark.parametrize("case", REALISED_CASES)
def test_realised_accepted_counts_match_the_exact_expectation(case):
    """Drafted trees drawn from their law and verified with the verifier's own sampling code
    (seeded): the mean realised count is within 4 standard errors of the exact expectation
    averaged over the drafts (the sampler of the drafts is tested above)."""
    drafter, name = REALISED_CASES[case]
    verifier = get_verifier(name)
    trees = drafter.enumerate(0)
    if verifier.per_node:
        exact = [tokenwise_expected_accepted(tree, verifier) for _, tree in trees]
    else:
        exact = [verifier.expected_accepted(tree) for _, tree in trees]
    rng = np.random.default_rng(2026)
    drawn = rng.choice(len(trees), size=3000, p=np.array([p for p, _ in trees]))
    realised = []
    for index in drawn:
        tree = trees[index][1]
        if verifier.per_node:
            realised.append(tokenwise_realised(tree, verifier, rng))
        else:
            realised.append(tree.depths[verifier.verify_tree(tree, rng.random(tree.num_nodes)).node])
    realised = np.array(realised, dtype=float)
    assert abs(realised.mean() - np.dot([p for p, _ in trees], exact)) <= 4 * standard_error_of(realised)
    # paired with the exact expectation of the same drafted steps: less noise, the same mean
    paired = realised - np.array(exact)[drawn]
    assert abs(paired.mean()) <= 4 * standard_error_of(paired) and paired.std() < realised.std()


# -- tree verifiers in the one registry ---------------------------------------------------
@pytest.mark.parametrize("name", ["block", "traversal"])
def test_tree_verifiers_are_registered_beside_the_per_node_ones(name):
    verifier = get_verifier(name)
    assert VERIFIERS[name] is type(verifier) and verifier.lossless and not verifier.per_node
    assert verifier.label and verifier.scheme in ("with_replacement", "without_replacement")
    assert name not in {v.name for v in lossless_verifiers()}
    with pytest.raises(ValueError, match="whole drafted tree"):
        verifier.verify(TARGET, DRAFT, [[0]], np.random.default_rng(0))
    with pytest.raises(ValueError, match="whole drafted tree"):
        verifier.acceptance_rate(TARGET, DRAFT, 1)
    with pytest.raises(ValueError, match="multi-step optimum"):
        verifier.optimum(TARGET, DRAFT, 1)
    with pytest.raises(ValueError, match="ScoredTree"):
        verifier.expected_accepted("not a tree")
