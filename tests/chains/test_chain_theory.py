"""Chain theory: [YIN] Thm 1 and Thm 3 (and the finite-lookahead cost) equal an exact
enumeration of the decoding algorithm itself on tiny chains; the residual chain, its M → ∞
limit and the batch-improvement closed forms; bad inputs are refused."""

import functools
import itertools
import math
from collections import defaultdict

import numpy as np
import pytest

from specbound.chains.theory import (
    MarkovChainPair,
    batch_expected_rejections,
    batch_improvement,
    batch_rejection_probability,
    bernoulli_batch_improvement,
    expected_rejections,
    lookahead_expected_cost,
    random_chain_pair,
    unaccepted_root_mass,
    uniform_batch_improvement,
)
from specbound.probability import residual


def sparse_chain_pair(rng, horizon, vocab_size):
    """Dirichlet rows with one exact zero per row in the target and in the draft, so that
    tokens the draft never proposes (and the target never emits) occur."""
    matrices = []
    for _ in range(2):
        rows = rng.dirichlet(np.ones(vocab_size), size=(horizon, vocab_size))
        zero = rng.integers(vocab_size, size=(horizon, vocab_size))
        np.put_along_axis(rows, zero[..., None], 0.0, axis=-1)
        matrices.append(rows / rows.sum(axis=-1, keepdims=True))
    return MarkovChainPair(matrices[0], matrices[1], rng.dirichlet(np.ones(vocab_size)))


def enumerated_decoding(chain, num_drafts, lookahead=None):
    """Exact law of the algorithm's run, by enumerating every draft tuple of every round and
    every outcome of its verification (no use of the theorems or of the f-recursion).

    Returns ({x_0..x_T: probability}, E[rejections], E[target calls]).
    """
    target, draft = chain.target_transitions, chain.draft_transitions
    horizon, vocab = chain.horizon, chain.vocab_size

    @functools.lru_cache(maxsize=None)
    def one_round(start, previous):
        """{(emitted tokens, rejected): probability} of a round whose root is ``start``."""
        length = min(lookahead or horizon, horizon - start + 1)
        continuations = []
        for tokens in itertools.product(range(vocab), repeat=length):
            prob, last = 1.0, previous
            for offset, token in enumerate(tokens):
                prob *= draft[start - 1 + offset, last, token]
                last = token
            if prob > 0:
                continuations.append((tokens, prob))
        outcomes = defaultdict(float)

        @functools.lru_cache(maxsize=None)
        def follow(path):
            """{(emitted, rejected): probability} once the root token of ``path`` is accepted."""
            ends, prob = defaultdict(float), 1.0
            for offset in range(1, length):
                target_row = target[start - 1 + offset, path[offset - 1]]
                draft_row = draft[start - 1 + offset, path[offset - 1]]
                accept = min(1.0, target_row[path[offset]] / draft_row[path[offset]])
                if accept < 1:
                    law = residual(target_row, draft_row)
                    for token in range(vocab):
                        ends[(path[:offset] + (token,), True)] += prob * (1 - accept) * law[token]
                prob *= accept
            if start + length <= horizon:
                bonus_law = target[start - 1 + length, path[-1]]
                for token in range(vocab):
                    ends[(path + (token,), False)] += prob * bonus_law[token]
            else:
                ends[(path, False)] += prob
            return dict(ends)

        # The root's residual chain p^1 = p, p^{m+1} = norm((p^m − q)+) does not depend on
        # the draft tokens; a residual is only used after a rejection, when it has mass.
        draft_row = draft[start - 1, previous]
        residual_laws = [target[start - 1, previous]]
        for _ in range(num_drafts):
            excess = np.maximum(residual_laws[-1] - draft_row, 0.0)
            residual_laws.append(excess / excess.sum() if excess.sum() > 0 else excess)
        accepted_along = defaultdict(float)  # path -> P(draft tuple and its root accepted)
        for drafts in itertools.product(continuations, repeat=num_drafts):
            reach = math.prod(prob for _, prob in drafts)
            for (path, _), residual_law in zip(drafts, residual_laws):
                accept = min(1.0, residual_law[path[0]] / draft_row[path[0]])
                accepted_along[path] += reach * accept
                reach *= 1 - accept
            for token in range(vocab):
                outcomes[((token,), True)] += reach * residual_laws[num_drafts][token]
        for path, weight in accepted_along.items():
            for end, prob in follow(path).items():
                outcomes[end] += weight * prob
        return dict(outcomes)

    states = {((token,), 0, 0): prob for token, prob in enumerate(chain.prompt_probs) if prob > 0}
    for length in range(1, horizon + 1):
        expanded = defaultdict(float)
        for (prefix, rejections, calls), prob in states.items():
            if len(prefix) != length:
                expanded[(prefix, rejections, calls)] += prob
                continue
            for (emitted, rejected), chance in one_round(length, prefix[-1]).items():
                expanded[(prefix + emitted, rejections + rejected, calls + 1)] += prob * chance
        states = expanded
    law = defaultdict(float)
    for (sequence, _, _), prob in states.items():
        law[sequence] += prob
    mean_rejections = sum(prob * rejections for (_, rejections, _), prob in states.items())
    mean_calls = sum(prob * calls for (_, _, calls), prob in states.items())
    return dict(law), mean_rejections, mean_calls


def target_chain_law(chain):
    """{x_0..x_T: probability} of the target chain."""
    law = {}
    for sequence in itertools.product(range(chain.vocab_size), repeat=chain.horizon + 1):
        prob = chain.prompt_probs[sequence[0]]
        for position in range(1, chain.horizon + 1):
            prob *= chain.target_transitions[position - 1, sequence[position - 1], sequence[position]]
        law[sequence] = prob
    return law


def assert_same_law(law, reference):
    for sequence in set(law) | set(reference):
        assert law.get(sequence, 0.0) == pytest.approx(reference.get(sequence, 0.0), abs=1e-12)


TINY_CHAINS = {
    "dirichlet": lambda: random_chain_pair(4, 3, np.random.default_rng(3)),
    "sparse": lambda: sparse_chain_pair(np.random.default_rng(4), 4, 3),
}


@pytest.mark.parametrize("chain_name", sorted(TINY_CHAINS))
def test_thm1_equals_enumeration_of_single_draft_decoding(chain_name):
    chain = TINY_CHAINS[chain_name]()
    law, rejections, calls = enumerated_decoding(chain, num_drafts=1)
    cost = expected_rejections(chain)
    assert cost.rejections == pytest.approx(rejections, abs=1e-12)
    assert cost.target_calls == pytest.approx(calls, abs=1e-12)
    assert_same_law(law, target_chain_law(chain))


@pytest.mark.parametrize("chain_name", sorted(TINY_CHAINS))
@pytest.mark.parametrize(("num_drafts", "horizon"), [(2, 4), (3, 3)])
def test_thm3_equals_enumeration_of_batch_decoding(chain_name, num_drafts, horizon):
    full = TINY_CHAINS[chain_name]()
    chain = MarkovChainPair(
        full.target_transitions[:horizon], full.draft_transitions[:horizon], full.prompt_probs
    )
    law, rejections, calls = enumerated_decoding(chain, num_drafts)
    cost = batch_expected_rejections(chain, num_drafts)
    assert cost.rejections == pytest.approx(rejections, abs=1e-12)
    assert cost.target_calls == pytest.approx(calls, abs=1e-12)
    assert_same_law(law, target_chain_law(chain))


@pytest.mark.parametrize("chain_name", sorted(TINY_CHAINS))
@pytest.mark.parametrize(("num_drafts", "lookahead"), [(1, 1), (1, 2), (2, 1), (2, 3)])
def test_lookahead_cost_equals_enumeration_with_bonus_tokens(chain_name, num_drafts, lookahead):
    chain = TINY_CHAINS[chain_name]()
    law, rejections, calls = enumerated_decoding(chain, num_drafts, lookahead)
    cost = lookahead_expected_cost(chain, num_drafts, lookahead)
    assert cost.rejections == pytest.approx(rejections, abs=1e-12)
    assert cost.target_calls == pytest.approx(calls, abs=1e-12)
    assert_same_law(law, target_chain_law(chain))


def test_batch_with_one_draft_equals_single_draft():
    chain = random_chain_pair(50, 7, np.random.default_rng(10))
    single, batch = expected_rejections(chain), batch_expected_rejections(chain, 1)
    assert batch.rejections == pytest.approx(single.rejections, abs=1e-12)
    assert batch.target_calls == pytest.approx(single.target_calls, abs=1e-12)


@pytest.mark.parametrize("num_drafts", [1, 2, 5, math.inf])
def test_lookahead_to_the_horizon_equals_the_f_recursion(num_drafts):
    chain = sparse_chain_pair(np.random.default_rng(11), 30, 5)
    reference = batch_expected_rejections(chain, num_drafts)
    for lookahead in (None, 30, 45):
        cost = lookahead_expected_cost(chain, num_drafts, lookahead)
        assert cost.rejections == pytest.approx(reference.rejections, abs=1e-11)
        assert cost.target_calls == pytest.approx(reference.target_calls, abs=1e-11)


def test_unaccepted_root_mass_follows_the_normalised_residual_chain():
    rng = np.random.default_rng(12)
    for _ in range(50):
        target, draft = rng.dirichlet(np.full(6, 0.5), size=2)
        target[rng.integers(6)] = 0.0
        draft[rng.integers(6)] = 0.0
        target, draft = target / target.sum(), draft / draft.sum()
        product, residual_law = 1.0, target[None, :]
        for num_drafts in range(1, 7):
            product *= 0.5 * np.abs(residual_law - draft).sum()
            residual_law = residual(residual_law, draft)
            mass = unaccepted_root_mass(target, draft, num_drafts)[0]
            assert mass.sum() == pytest.approx(product, abs=1e-12)
            np.testing.assert_allclose(mass, product * residual_law[0], atol=1e-12)


def test_point_mass_draft_keeps_the_rejection_product_at_one_half():
    # SPEC §2 caveat: draft δ_a, target ½δ_a + ½δ_b; Π r_m = 0.5 for every M.
    target, draft = np.array([0.5, 0.5]), np.array([1.0, 0.0])
    for num_drafts in [1, 2, 3, 10, 100, math.inf]:
        assert batch_rejection_probability(target, draft, num_drafts) == pytest.approx(0.5, abs=1e-15)


def test_rejection_product_reaches_target_mass_outside_the_draft_support():
    # Each rejected draft removes at least p(supp qᶜ)·q(y) from the residual mass at y, so
    # the limit p(supp qᶜ) is reached after at most max_y p(y) / (p(supp qᶜ) q(y)) + 1 drafts.
    rng = np.random.default_rng(13)
    for _ in range(50):
        target, draft = rng.dirichlet(np.ones(6), size=2)
        draft[:2] = 0.0
        draft /= draft.sum()
        outside = target[:2].sum()
        enough = math.ceil(np.max(target[2:] / (outside * draft[2:]))) + 1
        assert batch_rejection_probability(target, draft, math.inf) == pytest.approx(outside, abs=1e-15)
        assert batch_rejection_probability(target, draft, enough) == pytest.approx(outside, abs=1e-12)
        assert batch_rejection_probability(target, draft, 1) >= outside - 1e-15
    nested = batch_rejection_probability(np.array([0.5, 0.5, 0, 0]), np.full(4, 0.25), 60)
    assert 0 < nested < 1e-17


def test_expected_rejections_fall_with_more_drafts_to_a_positive_limit():
    chain = random_chain_pair(50, 7, np.random.default_rng(10))
    costs = [batch_expected_rejections(chain, m).rejections for m in (1, 2, 4, 8, 32, 400, 2000)]
    limit = batch_expected_rejections(chain, math.inf).rejections
    assert all(later < earlier for earlier, later in zip(costs, costs[1:]))
    assert costs[-1] > limit and costs[-1] - limit < 0.05
    assert limit > 10.0  # more drafts never make decoding free


@pytest.mark.parametrize("num_drafts", [1, 2, 3, 5, 8, math.inf])
def test_bernoulli_batch_improvement_closed_form_is_exact(num_drafts):
    grid = np.linspace(0.0, 1.0, 11)
    for draft_mean, target_mean in itertools.product(grid, grid):
        general = batch_improvement(
            [1 - target_mean, target_mean], [1 - draft_mean, draft_mean], num_drafts
        )
        closed = bernoulli_batch_improvement(draft_mean, target_mean, num_drafts)
        assert closed == pytest.approx(general, abs=1e-12)


@pytest.mark.parametrize("num_drafts", [1, 2, 3, 5, 8])
def test_uniform_batch_improvement_closed_form_is_exact(num_drafts):
    for vocab_size in range(1, 9):
        for support in range(1, vocab_size + 1):
            target = np.r_[np.full(support, 1 / support), np.zeros(vocab_size - support)]
            general = batch_improvement(target, np.full(vocab_size, 1 / vocab_size), num_drafts)
            closed = uniform_batch_improvement(vocab_size, support, num_drafts)
            assert closed == pytest.approx(general, abs=1e-12)


def test_random_chain_pair_is_reproducible_and_states_its_law():
    first = random_chain_pair(5, 4, np.random.default_rng(10))
    second = random_chain_pair(5, 4, np.random.default_rng(10))
    np.testing.assert_array_equal(first.target_transitions, second.target_transitions)
    np.testing.assert_array_equal(first.draft_transitions, second.draft_transitions)
    rng = np.random.default_rng(10)
    expected_target = rng.dirichlet(np.ones(4), size=(5, 4))
    expected_draft = rng.dirichlet(np.ones(4), size=(5, 4))
    np.testing.assert_allclose(first.target_transitions, expected_target, rtol=0, atol=1e-15)
    np.testing.assert_allclose(first.draft_transitions, expected_draft, rtol=0, atol=1e-15)
    np.testing.assert_array_equal(first.prompt_probs, np.full(4, 0.25))


def _valid_parts():
    chain = random_chain_pair(3, 4, np.random.default_rng(0))
    return chain.target_transitions, chain.draft_transitions, chain.prompt_probs


def test_rows_not_summing_to_one_are_refused():
    target, draft, prompt = _valid_parts()
    bad = target.copy()
    bad[1, 2, 0] += 0.1
    with pytest.raises(ValueError, match="target_transitions.*sum to 1"):
        MarkovChainPair(bad, draft, prompt)
    with pytest.raises(ValueError, match="draft_transitions.*sum to 1"):
        MarkovChainPair(target, draft * 0.9, prompt)
    with pytest.raises(ValueError, match="prompt_probs.*sum to 1"):
        MarkovChainPair(target, draft, prompt * 2)
    with pytest.raises(ValueError, match="negative"):
        MarkovChainPair(target, draft, np.array([1.5, -0.5, 0, 0]))


def test_mismatched_shapes_are_refused():
    target, draft, prompt = _valid_parts()
    with pytest.raises(ValueError, match="draft_transitions: shape"):
        MarkovChainPair(target, draft[:2], prompt)
    with pytest.raises(ValueError, match="prompt_probs: expected shape"):
        MarkovChainPair(target, draft, np.full(3, 1 / 3))
    with pytest.raises(ValueError, match=r"target_transitions: expected shape \[horizon"):
        MarkovChainPair(target[:, :, :3], draft, prompt)
    with pytest.raises(ValueError, match=r"target_transitions: expected shape \[horizon"):
        MarkovChainPair(target[0], draft, prompt)


def test_empty_horizon_is_refused():
    target, draft, prompt = _valid_parts()
    with pytest.raises(ValueError, match="T = 0"):
        MarkovChainPair(target[:0], draft[:0], prompt)
    with pytest.raises(ValueError, match="horizon"):
        random_chain_pair(0, 3, np.random.default_rng(0))


@pytest.mark.parametrize("num_drafts", [0, -1, 1.5, True, "2"])
def test_invalid_number_of_drafts_is_refused(num_drafts):
    chain = random_chain_pair(3, 4, np.random.default_rng(0))
    with pytest.raises(ValueError, match="num_drafts"):
        batch_expected_rejections(chain, num_drafts)
    with pytest.raises(ValueError, match="num_drafts"):
        bernoulli_batch_improvement(0.5, 0.2, num_drafts)


@pytest.mark.parametrize("lookahead", [0, -2, 1.5])
def test_invalid_lookahead_is_refused(lookahead):
    chain = random_chain_pair(3, 4, np.random.default_rng(0))
    with pytest.raises(ValueError, match="lookahead"):
        lookahead_expected_cost(chain, 1, lookahead)


def test_closed_forms_refuse_impossible_parameters():
    with pytest.raises(ValueError, match="draft_mean"):
        bernoulli_batch_improvement(1.2, 0.5, 2)
    with pytest.raises(ValueError, match="target_support_size"):
        uniform_batch_improvement(4, 5, 2)


def test_single_token_batch_functions_check_their_distributions():
    with pytest.raises(ValueError, match="target_probs.*sum to 1"):
        batch_improvement([0.5, 0.6], [0.5, 0.5], 2)
    with pytest.raises(ValueError, match="draft_probs: vocabulary size"):
        batch_rejection_probability([0.5, 0.5], [0.2, 0.3, 0.5], 2)
    with pytest.raises(ValueError, match="num_drafts"):
        unaccepted_root_mass([0.5, 0.5], [0.5, 0.5], 0)
