"""The tail cut (specbound.bounds.tail): all numbers of drafts from one pass give each n's
own cut, the protected tokens stay, and the tail factor is its definition."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support.edge_cases import distribution_pairs
from specbound.bounds.rows import RowPairs
from specbound.bounds.subset import scan_order
from specbound.bounds.tail import cut_tail, cut_tails, scan_guesses, tail_factor


def reference_cut(target, draft, budget, num_drafts):
    """The cut for one n by its definition, token by token: with F = Σ_{i<n} 1/(1 − S_i)
    (``tail_factor``, tested on its own below, so that weights on a level's edge fall on the
    same side as the cut's), drop the levels of the weight w = p + F·q — 16 a binade,
    [2^e(1 + j/16), 2^e(1 + (j + 1)/16)), the subnormals 16 below them — from the smallest
    while δp + δq·F stays within the budget, never the n largest draft tokens (ties to the
    lower id) or the largest target token."""
    keep = np.maximum(target, draft) > 0
    largest = sorted(range(draft.size), key=lambda token: (-draft[token], token))[:num_drafts]
    factor = tail_factor(draft, num_drafts)
    weight = target + factor * draft  # F is finite (1/(1 − S_i) capped at 1e300)
    droppable = keep & (weight <= budget)
    droppable[largest] = False
    droppable[np.argmax(target)] = False
    level = np.full(draft.size, np.inf)
    for token in np.flatnonzero(droppable):
        if weight[token] < 2.0**-1022:  # subnormal: sixteenths of [0, 2^-1022), below every binade
            level[token] = np.floor(np.ldexp(weight[token], 1026))
        else:
            mantissa, exponent = np.frexp(weight[token])  # mantissa·2^exponent, mantissa in [1/2, 1)
            level[token] = 16 * (exponent + 1022) + np.floor((2 * mantissa - 1) * 16)
    dropped = np.zeros(draft.size, dtype=bool)
    for lowest in np.unique(level[droppable]):
        trial = dropped | (level == lowest)
        # no q dropped, no move, even at factor ∞ (a point-mass draft)
        draft_moved = factor * draft[trial].sum() if draft[trial].any() else 0.0
        if target[trial].sum() + draft_moved > budget:
            break
        dropped = trial
    kept = keep & ~dropped
    return kept, target[~kept].sum(), draft[~kept].sum()


def tailed_rows(rng, vocab_size):
    logits = rng.normal(size=(2, vocab_size)) * rng.uniform(2.0, 8.0)
    logits[1] += rng.normal(size=vocab_size)
    rows = np.exp(logits - logits.max(axis=1, keepdims=True))
    rows[:, rng.random(vocab_size) < 0.05] = 0.0
    rows[:, 0] += 1e-3  # never an all-zero row
    return rows / rows.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("budget", [0.0, 1e-6, 1e-4, 1e-2])
def test_one_pass_for_every_number_of_drafts_gives_each_ns_own_cut(rng, budget):
    for _ in range(25):
        target, draft = tailed_rows(rng, int(rng.integers(5, 400)))
        cuts = cut_tails(target, draft, budget, [1, 2, 3, 4, 6])
        for num_drafts, cut in cuts.items():
            kept, dropped_target, dropped_draft = reference_cut(target, draft, budget, num_drafts)
            np.testing.assert_allclose(cut.target, target[kept] / target[kept].sum(), rtol=1e-12)
            np.testing.assert_allclose(cut.draft, draft[kept] / draft[kept].sum(), rtol=1e-12)
            assert cut.dropped_target == pytest.approx(dropped_target, rel=1e-12, abs=1e-300)
            assert cut.dropped_draft == pytest.approx(dropped_draft, rel=1e-12, abs=1e-300)
            assert cut.bound <= budget or budget == 0.0
            single = cut_tail(target, draft, budget, num_drafts)
            np.testing.assert_array_equal(single[0], cut.target)


def test_the_cut_never_drops_the_largest_draft_tokens():
    """The n largest draft tokens and the largest target token stay even under a budget
    so large that every other token goes (the greedy scheme's fixed drafts and the number
    of distinct drafts must not change)."""
    draft = np.concatenate([[0.6, 0.3], np.full(1000, 0.1 / 1000)])
    draft[7] *= 1.5  # the third largest draft token, otherwise like the tail
    draft /= draft.sum()
    target = np.concatenate([[0.2, 0.2], np.zeros(1000)])
    target[500] = 0.6
    cut_target, cut_draft, _, dropped_draft, _ = cut_tail(target, draft, 10.0, 3)
    assert len(cut_draft) == 4 and dropped_draft > 0.09
    kept = draft[[0, 1, 7, 500]]
    np.testing.assert_allclose(cut_draft, kept / kept.sum(), rtol=1e-12)
    np.testing.assert_allclose(cut_target, target[[0, 1, 7, 500]], rtol=1e-12)


def test_tail_factor_sums_the_mass_left_after_the_largest_draft_tokens(rng):
    """Σ_{i<n} 1/(1 − S_i) from its definition on random rows; on a row holding
    q(top) = 1.0 beside two 1e-17 tokens, 1 − S_1 is their 2e-17, not 1.0 − 1.0."""
    for num_drafts in (1, 2, 3, 6):
        draft = rng.dirichlet(np.ones(50))
        largest = np.concatenate([[0.0], np.cumsum(np.sort(draft)[::-1])])[:num_drafts]
        assert tail_factor(draft, num_drafts) == pytest.approx(np.sum(1.0 / (1.0 - largest)), rel=1e-12)
    peaked = np.array([1.0, 1e-17, 1e-17, 0.0])
    assert tail_factor(peaked, 3) == pytest.approx(1.0 + 1.0 / 2e-17 + 1.0 / 1e-17, rel=1e-12)


@settings(max_examples=25, deadline=None)
@given(pair=distribution_pairs(max_vocab=40), budget=st.sampled_from([1e-6, 1e-3, 0.05, 0.5]), flat=st.booleans())
def test_cut_tails_keeps_the_reference_cut_on_edge_cases(pair, budget, flat):
    """Every n's cut is the token-by-token reference's, also where the largest draft tokens
    are themselves below the budget (a flat draft: they are protected for one n, free for a
    smaller one), with ties, zeros and subnormal masses."""
    target, draft = (row / row.sum() for row in pair)
    if flat:
        draft = np.full(draft.size, 1.0 / draft.size)
    for count, cut in cut_tails(target, draft, budget, [1, 2, 3, 4, 6]).items():
        with np.errstate(divide="ignore", invalid="ignore"):  # a point-mass draft: factor ∞
            kept, dropped_target, dropped_draft = reference_cut(target, draft, budget, count)
        np.testing.assert_allclose(cut.target, target[kept] / target[kept].sum(), rtol=1e-12)
        np.testing.assert_allclose(cut.draft, draft[kept] / draft[kept].sum(), rtol=1e-12)
        assert cut.dropped_target == pytest.approx(dropped_target, rel=1e-12, abs=1e-300)
        assert cut.dropped_draft == pytest.approx(dropped_draft, rel=1e-12, abs=1e-300)


@pytest.mark.parametrize("budget", [2.0**-14, 3 * 2.0**-16, 1e-4, 2.0**-9])
def test_cut_tails_keeps_the_reference_cut_where_masses_are_powers_of_two(rng, budget):
    """Masses 2^-k lie on a level's lower edge, where the cut's threshold falls: the cut
    keeps the level it does not drop whole, as the reference does."""
    masses = np.concatenate([2.0 ** -np.arange(1, 25), [2.0**-24]])  # sums to 1 exactly
    for _ in range(5):
        target, draft = rng.permutation(masses), rng.permutation(masses)
        for count, cut in cut_tails(target, draft, budget, [1, 2, 3, 4, 6]).items():
            kept, dropped_target, dropped_draft = reference_cut(target, draft, budget, count)
            np.testing.assert_array_equal(cut.tokens, np.flatnonzero(kept))
            assert (cut.dropped_target, cut.dropped_draft) == (dropped_target, dropped_draft)


def test_the_cut_drops_the_lightest_tokens_so_cuts_of_different_n_are_not_nested():
    """Budget 1.5e-3. At n = 1 (F = 1) ten draft-only tokens of q = 1e-4 weigh 1e-3 together
    and are dropped first, after which the target-only token of p = 6e-4 no longer fits; at
    n = 2 (F = 1 + 1/(1 − 0.9) = 11) each of them weighs 1.1e-3, more than that token, which
    goes first, and then the ten no longer fit. A cut by max(p, q) keeps the target-only
    token at n = 2 as well. Each cut's scan-order guess is still its scan order."""
    draft = np.concatenate([[0.9, 0.1 - 1e-3], np.full(10, 1e-4), [0.0]])
    target = np.concatenate([[0.5, 0.5 - 6e-4], np.zeros(10), [6e-4]])
    cuts = cut_tails(target, draft, 1.5e-3, [1, 2])
    assert cuts[1].tokens.tolist() == [0, 1, 12] and cuts[1].dropped_draft == pytest.approx(1e-3)
    assert cuts[2].tokens.tolist() == list(range(12)) and cuts[2].dropped_target == pytest.approx(6e-4)
    assert all(cut.bound <= 1.5e-3 for cut in cuts.values())
    for count, guess in scan_guesses(cuts, target, draft).items():
        rows = RowPairs.checked(cuts[count].target[None], cuts[count].draft[None])
        np.testing.assert_array_equal(guess, rows.scan_order)


@settings(max_examples=40, deadline=None)
@given(pair=distribution_pairs(max_vocab=40), budget=st.sampled_from([0.0, 1e-6, 1e-3, 0.05, 0.5]), flat=st.booleans())
def test_scan_guesses_give_each_cuts_scan_order(pair, budget, flat):
    """The scan order of every n's cut as the study checks it (``RowPairs.checked``) is the
    same with its guess, which one sort of the tokens any cut keeps gives (the cuts need
    not be nested), as without, with ties, zeros and subnormal masses."""
    target, draft = (row / row.sum() for row in pair)
    if flat:
        draft = np.full(draft.size, 1.0 / draft.size)
    cuts = cut_tails(target, draft, budget, [1, 2, 3, 4, 6])
    for count, guess in scan_guesses(cuts, target, draft).items():
        rows = RowPairs.checked(cuts[count].target[None], cuts[count].draft[None], guess)
        assert guess is not None
        np.testing.assert_array_equal(rows.scan_order, scan_order(rows.target, rows.draft))


def test_scan_guesses_are_the_scan_orders_on_model_shaped_rows(rng):
    """On rows shaped like a model's (float32 probabilities, long tails) every guess is
    already the cut's scan order: the one sort per row is all that is sorted."""
    for _ in range(10):
        target, draft = tailed_rows(rng, 5000).astype(np.float32).astype(np.float64)
        target, draft = target / target.sum(), draft / draft.sum()
        cuts = cut_tails(target, draft, 1e-4, [2, 3, 4, 6])
        assert len({cut.tokens.size for cut in cuts.values()}) > 1  # the guesses are restricted
        for count, guess in scan_guesses(cuts, target, draft).items():
            rows = RowPairs.checked(cuts[count].target[None], cuts[count].draft[None])
            np.testing.assert_array_equal(guess, rows.scan_order)


@pytest.mark.parametrize("num_cuts", [9, 33, 65])
def test_scan_guesses_of_many_cuts(rng, num_cuts):
    """Past 8 cuts the union's marks take a wider type (a bit per cut); past 64 each cut is
    sorted alone (no guess), and the scan orders are the same either way."""
    target, draft = tailed_rows(rng, 400)
    cuts = cut_tails(target, draft, 1e-3, range(1, num_cuts + 1))
    guesses = scan_guesses(cuts, target, draft)
    assert len(guesses) == num_cuts and all((guess is None) == (num_cuts > 64) for guess in guesses.values())
    for count, guess in guesses.items():
        rows = RowPairs.checked(cuts[count].target[None], cuts[count].draft[None], guess)
        np.testing.assert_array_equal(rows.scan_order, scan_order(rows.target, rows.draft))
        if guess is not None:
            np.testing.assert_array_equal(guess, rows.scan_order)
