"""Exact acceptance of RRS without replacement: the grouped/bracketed n = 3 algorithm
equals the plain recursion, its brackets always contain the exact value, and the
min-sum curve is the function it claims to be."""

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from support.edge_cases import distribution_pairs
from support.instances import random_pair
from specbound.verifiers import rrs_exact as rrs_acceptance
from specbound.verifiers.rrs_exact import (
    _recursive_acceptance,
    min_sum_curve,
    recursion_refusal,
    rrs_without_replacement_acceptance,
    three_draft_bounds,
)


def instances(rng, count=60):
    for i in range(count):
        vocab = int(rng.choice([3, 4, 5, 8, 20, 60]))
        target, draft = random_pair(rng, vocab, concentration=0.4)
        if i % 2:  # ties in the draft, as a low-precision softmax produces
            draft = np.round(draft, 2)
            draft /= draft.sum()
        if np.count_nonzero(draft) >= 3:
            yield target, draft


def test_min_sum_curve_is_the_sum_of_minima(rng):
    target, draft = random_pair(rng, 30)
    thresholds = np.concatenate([[0.0, 1e-3, 1.0], rng.exponential(3.0, size=50), [1e6]])
    curve = min_sum_curve(target, draft)
    direct = np.minimum(target[None, :], thresholds[:, None] * draft[None, :]).sum(axis=1)
    np.testing.assert_allclose(curve(thresholds), direct, atol=1e-14)


def test_three_draft_acceptance_equals_the_recursion(rng):
    checked = 0
    for target, draft in instances(rng):
        exact = _recursive_acceptance(target, draft, 3)
        low, high = three_draft_bounds(target, draft)
        assert high - low <= 2e-10
        assert rrs_without_replacement_acceptance(target, draft, 3) == pytest.approx(exact, abs=1e-12)
        checked += 1
    assert checked >= 40


@pytest.mark.parametrize("bins", [1, 2, 5])
def test_coarse_brackets_contain_the_exact_value(bins, rng, monkeypatch):
    monkeypatch.setattr(rrs_acceptance, "FIRST_BIN_COUNT", 0)  # no exact first pass
    monkeypatch.setattr(rrs_acceptance, "COARSE_BIN_COUNT", bins)
    widths = []
    for target, draft in instances(rng):
        exact = _recursive_acceptance(target, draft, 3)
        low, high = three_draft_bounds(target, draft, tolerance=1.0)  # no refinement
        assert low - 1e-13 <= exact <= high + 1e-13
        widths.append(high - low)
    assert max(widths) > 1e-3  # the brackets were really coarse, so the check had teeth


def test_any_bins_of_x1_and_x2_values_bracket_the_exact_value(rng):
    """The bracket is certified for every partition of the x1 values and of the x2 values
    into runs, not only the ones the refinement picks, and with x2 bins of its own for each
    x1 bin: random starts on both sides, random x1 bins over other x2 bins than the rest,
    rows with ties, a dominant draft token (s up to 10^6) and tokens of p = 0 or q = 0."""
    checked = widths = 0
    for target, draft in instances(rng, count=80):
        if checked % 3 == 1:  # a dominant draft token: 1 − q(x1) tiny, s huge
            draft = np.where(np.arange(draft.size) == np.argmax(draft), 1.0, 1e-6 * draft)
            draft /= draft.sum()
        exact = _recursive_acceptance(target, draft, 3)
        levels = rrs_acceptance._ThreeLevels.of(target, draft)
        if levels is None:
            continue
        for _ in range(4):
            starts = _random_starts(rng, len(levels.first_values))
            ends = np.append(starts[1:], len(levels.first_values))
            own = rng.random(len(starts)) < 0.5  # these x1 bins over x2 bins of their own
            low, high = np.empty(len(starts)), np.empty(len(starts))
            for rows in filter(np.any, (own, ~own)):
                second = levels.distinct[_random_starts(rng, len(levels.distinct))]
                low[rows], high[rows] = rrs_acceptance._bracket(levels, starts[rows], ends[rows], second)
            low, high = levels.bracket(low, high)
            assert low - 1e-12 <= exact <= high + 1e-12
            widths += high - low > 1e-3
        exact_bins = rrs_acceptance._Bins.even(levels, (len(levels.first_values), len(levels.distinct)))
        shares = rrs_acceptance._bracket(levels, exact_bins.starts, exact_bins.ends, levels.distinct)
        low, high = levels.bracket(*shares)
        assert low == pytest.approx(exact, abs=1e-12) and high == pytest.approx(exact, abs=1e-12)  # a bin per value
        checked += 1
    assert checked >= 50 and widths >= 20


def _random_starts(rng, count):
    """Starts of a random partition of range(count) into runs, the last value alone (as
    ``_bin_starts`` keeps it: its x2 = x1 term cancels only there)."""
    starts = np.r_[True, rng.random(count - 1) < rng.choice([0.1, 0.5, 0.9])]
    starts[-1] = True
    return np.flatnonzero(starts)


def _record_brackets(patch):
    """Every bracket ``three_draft_bounds`` reaches, pass by pass (``_ThreeLevels.bracket``)."""
    brackets = []
    bracket = rrs_acceptance._ThreeLevels.bracket
    patch.setattr(rrs_acceptance._ThreeLevels, "bracket",
                  lambda levels, low, high: brackets.append(bracket(levels, low, high)) or brackets[-1])
    return brackets


def _refined_brackets(target, draft, coarse):
    """The brackets of every pass of ``three_draft_bounds`` from ``coarse`` bins a side."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rrs_acceptance, "FIRST_BIN_COUNT", 0)  # no exact first pass
        patch.setattr(rrs_acceptance, "COARSE_BIN_COUNT", coarse)
        brackets = _record_brackets(patch)
        final = three_draft_bounds(target, draft)
    assert brackets[-1:] in ([], [final])  # none where p ≤ q everywhere: α = 1 at once
    return brackets or [final]


@settings(max_examples=60)
@given(pair=distribution_pairs(max_vocab=40), coarse=st.sampled_from([1, 2, 4]), ties=st.booleans())
def test_every_pass_of_the_refined_n3_bracket_holds_the_exact_value(pair, coarse, ties):
    """From a coarse pass, the refinement re-brackets only the widest x1 bins, each over x2
    bins of its own, and keeps the others' bounds: every bracket it reaches holds the value
    of the plain recursion, and the last is within the tolerance."""
    target, draft = (row / row.sum() for row in pair)
    if ties:  # ties in the draft, as a low-precision softmax produces
        draft = np.round(draft, 2) / np.round(draft, 2).sum()
    if np.count_nonzero(draft) < 3:
        return
    exact = _recursive_acceptance(target, draft, 3)
    brackets = _refined_brackets(target, draft, coarse)
    for low, high in brackets:
        assert low - 1e-12 <= exact <= high + 1e-12
    assert brackets[-1][1] - brackets[-1][0] <= 2e-10


def test_from_one_bin_a_side_every_pass_holds_the_exact_value(rng):
    """The same on the rows of ``instances`` (ties, a draft token of 0) from one bin a side,
    where most rows take three passes or more: the check has teeth."""
    several = 0
    for target, draft in instances(rng):
        exact = _recursive_acceptance(target, draft, 3)
        brackets = _refined_brackets(target, draft, 1)
        for low, high in brackets:
            assert low - 1e-12 <= exact <= high + 1e-12
        assert brackets[-1][1] - brackets[-1][0] <= 2e-10
        several += len(brackets) >= 3
    assert several >= 20


def test_bf16_probabilities_close_in_one_coarse_pass_and_a_bin_per_value_is_exact(monkeypatch):
    """A bf16 model's softmax has few distinct values (1,830 x1 and 2,052 draft values
    here): more than a bin-per-value first pass takes (``FIRST_BIN_COUNT``), so the coarse
    pass brackets it, within the tolerance at once; a bin per value (``FIRST_BIN_COUNT``
    raised above them) is exact and inside that bracket."""
    generator = torch.Generator().manual_seed(0)
    shared = 3 * torch.randn(20_000, generator=generator)
    target, draft = (
        torch.softmax((shared + 0.5 * torch.randn(20_000, generator=generator)).bfloat16().float() / 0.7, -1)
        .double()
        .numpy()
        for _ in range(2)
    )
    target, draft = target / target.sum(), draft / draft.sum()
    passes = _record_passes(monkeypatch)
    low, high = three_draft_bounds(target, draft)
    assert len(passes) == 1 and max(passes[0]) <= rrs_acceptance.COARSE_BIN_COUNT
    assert 0.0 < high - low <= 2e-10
    monkeypatch.setattr(rrs_acceptance, "FIRST_BIN_COUNT", 4096)
    exact, also_exact = three_draft_bounds(target, draft)
    assert exact == also_exact
    assert low - 1e-13 <= exact <= high + 1e-13
    assert 0.0 < exact < 1.0


def test_large_exact_recursion_is_refused():
    target = np.full(1000, 1 / 1000)
    draft = np.linspace(1, 2, 1000)
    draft /= draft.sum()
    with pytest.raises(ValueError, match="n = 4"):
        rrs_without_replacement_acceptance(target, draft, 4)


@pytest.mark.parametrize("num_drafts", [2, 3, 4])
def test_a_draft_stored_as_one_with_a_tiny_rest_keeps_its_rest(num_drafts):
    """At low temperature a draft row can hold q(top) = 1.0 exactly beside tokens of 1e-17
    (seen at T = 0.1 on the default pair): 1 − q(top) must be the rest's summed mass, not
    1.0 − 1.0 = 0 (which gave NaN for n = 3 and a wrong 0.5 for n = 2). The acceptance
    must equal that of the same row with a representable rest."""
    target = np.array([0.5, 0.3, 0.15, 0.05, 0.0])
    values = []
    for rest in (1e-9, 1e-17, 1e-30):
        draft = np.array([1.0 - 4 * rest, rest, rest, rest, rest])
        assert (draft[0] == 1.0) == (rest < 1e-16)
        values.append(rrs_without_replacement_acceptance(target, draft, num_drafts))
    assert np.all(np.isfinite(values))
    np.testing.assert_allclose(values[1:], values[0], atol=1e-9)


# -- work limits ---------------------------------------------------------------------------
def test_past_its_work_limit_the_n3_bracket_stops_certified_and_says_so(monkeypatch):
    """Float64 rows with all-distinct values used to refine to D1·D2 bins (102 s at 40k
    tokens, > 300 s and 4.8 GB at 200k); past the limit the bracket reached is returned,
    its midpoint is the acceptance, and a BracketWarning gives it."""
    rng = np.random.default_rng(5)
    target, draft = rng.dirichlet(np.ones(3000)), rng.dirichlet(np.ones(3000))
    exact_low, exact_high = three_draft_bounds(target, draft)
    assert exact_high - exact_low <= 2e-10  # within the default limit: exact, as before
    monkeypatch.setattr(rrs_acceptance, "BRACKET_SECONDS_LIMIT", 0.01)
    low, high = three_draft_bounds(target, draft)
    assert low - 1e-13 <= exact_low <= exact_high <= high + 1e-13
    assert 2e-10 < high - low < 1e-3
    with pytest.warns(rrs_acceptance.BracketWarning, match="certified bracket"):
        value = rrs_without_replacement_acceptance(target, draft, 3)
    assert value == 0.5 * (low + high)


def test_an_n3_row_too_large_for_even_one_bin_is_refused(monkeypatch):
    rng = np.random.default_rng(6)
    target, draft = rng.dirichlet(np.ones(2000)), rng.dirichlet(np.ones(2000))
    monkeypatch.setattr(rrs_acceptance, "BRACKET_SECONDS_LIMIT", 1e-6)
    with pytest.raises(rrs_acceptance.WorkLimitError, match="n = 3"):
        three_draft_bounds(target, draft)


def test_the_n4_recursion_is_refused_by_its_time_not_its_branch_count():
    """447 rejectable tokens of 1,000 make 447² < 200,000 branches, which the old limit let
    through: about 36 s of level calls. The time estimate refuses it at once."""
    target = np.full(1000, 1 / 1000)
    draft = np.r_[np.full(447, 1.5), np.full(553, 1.0)]
    draft /= draft.sum()
    assert np.count_nonzero(draft > target) == 447
    with pytest.raises(rrs_acceptance.WorkLimitError, match="n = 4"):
        rrs_without_replacement_acceptance(target, draft, 4)
    assert rrs_acceptance.recursion_seconds(447, 1000, 4) > rrs_acceptance.RECURSION_SECONDS_LIMIT
    assert rrs_acceptance.recursion_seconds(10**6, 10, 10**20) == np.inf  # no float overflow, no loop


@settings(max_examples=60, deadline=None)
@given(distribution_pairs(max_vocab=9), st.integers(2, 6), st.sampled_from((1e-9, 1e-5, 1e-3, 20.0)))
def test_the_recursions_estimate_refuses_exactly_the_rows_the_computation_refuses(pair, num_drafts, limit):
    """``recursion_refusal`` (what the studies ask every row before computing any) is the
    computation's own refusal: the same message where it refuses, no refusal where the
    computation gives a value. Limits from 1e-9 s (every n ≥ 4 row refused) to the
    default mix both kinds of row. Rows have at least n drafts' tokens, as every caller gives
    them (``DraftScheme.effective_num_drafts``)."""
    target, draft = pair
    assume(np.count_nonzero(draft) >= num_drafts)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rrs_acceptance, "RECURSION_SECONDS_LIMIT", limit)
        reason = recursion_refusal(target, draft, num_drafts)
        try:
            rrs_without_replacement_acceptance(target, draft, num_drafts)
        except rrs_acceptance.WorkLimitError as error:
            split = rrs_acceptance._splits_at_first_draft(draft, num_drafts)
            assert reason == str(error) or (reason is None and split)  # a split row's branches decide alone
        else:
            assert reason is None
    if num_drafts < 4:
        assert reason is None


def test_the_recursions_estimate_names_the_rows_rejectable_tokens():
    target = np.full(1000, 1 / 1000)
    draft = np.r_[np.full(447, 1.5), np.full(553, 1.0)]
    draft /= draft.sum()
    assert "447 rejectable tokens, V = 1,000" in recursion_refusal(target, draft, 4)
    assert recursion_refusal(target, target, 4) is None  # nothing to reject: the recursion is one level


def _zipf_like_row(rng, vocab_size):
    """A float64 row pair of all-distinct values shaped like a language model's (Zipf-like,
    the draft the target plus noise)."""
    logits = np.empty(vocab_size)
    logits[rng.permutation(vocab_size)] = -2.5 * np.log(np.arange(1, vocab_size + 1)) + 0.3 * rng.normal(size=vocab_size)
    return tuple(np.exp(row / 0.7) / np.exp(row / 0.7).sum() for row in (logits, logits + 0.8 * rng.normal(size=vocab_size)))


def _record_passes(monkeypatch):
    passes = []
    bracket = rrs_acceptance._bracket
    monkeypatch.setattr(rrs_acceptance, "_bracket", lambda levels, starts, ends, second: passes.append(
        (len(starts), len(second))) or bracket(levels, starts, ends, second))
    return passes


def test_bins_of_equal_mass_times_gap_close_the_bracket_far_below_a_bin_per_value(monkeypatch):
    """3000 distinct draft values, 1308 of them above the target: bins of equal Σ √(mass·gap)
    below the largest values (one bin each) close the bracket at 32 bins a side, where the
    equal runs of values before them needed the 1308 x1 values exactly and 512 x2 bins."""
    target, draft = _zipf_like_row(np.random.default_rng(7), 3000)
    monkeypatch.setattr(rrs_acceptance, "FIRST_BIN_COUNT", 4096)
    exact_low, exact_high = three_draft_bounds(target, draft)  # one exact pass: 3000 values fit
    assert exact_low == exact_high
    levels = rrs_acceptance._ThreeLevels.of(target, draft)
    bins = rrs_acceptance._Bins.even(levels, (32, 32)).evaluated(levels)
    low, high = levels.bracket(bins.low, bins.high)
    assert low - 1e-13 <= exact_low <= high + 1e-13 and high - low <= 2e-10


def test_refining_only_the_widest_bins_closes_at_a_fraction_of_refining_all(monkeypatch):
    """From 8 bins a side, refining every x1 bin (x1 doubling every pass, x2 every second)
    closes this row at 64 × 32 bins after 16 × 16 and 32 × 16: 2,880 pairs of bins in all.
    Re-bracketing only the widest bins, each pass's bins no more than that schedule's, closes
    it within the tolerance at under half of those pairs."""
    target, draft = _zipf_like_row(np.random.default_rng(7), 3000)
    exact, _ = three_draft_bounds(target, draft)
    monkeypatch.setattr(rrs_acceptance, "FIRST_BIN_COUNT", 64)
    monkeypatch.setattr(rrs_acceptance, "COARSE_BIN_COUNT", 8)
    passes = _record_passes(monkeypatch)
    low, high = three_draft_bounds(target, draft)
    assert high - low <= 2e-10 and low - 1e-13 <= exact <= high + 1e-13
    assert max(passes[0]) <= 8 and max(second for _, second in passes) <= 32
    assert sum(first * second for first, second in passes) < 2880 / 2


def test_a_row_of_more_values_than_one_pass_holds_starts_coarse_and_one_that_fits_is_exact_at_once(monkeypatch):
    """More distinct draft values than FIRST_BIN_COUNT: the first pass has COARSE_BIN_COUNT
    bins a side and the bracket it reaches (refined if need be) holds the exact value; at
    most FIRST_BIN_COUNT values on both sides: one pass with a bin per value, exact. The x2
    side holds the values of the tokens that can weigh as x2 (r = p²/q below the largest
    s = 1/(1 − q(x1))), with a margin, and no others."""
    target, draft = _zipf_like_row(np.random.default_rng(7), 3000)
    passes = _record_passes(monkeypatch)
    monkeypatch.setattr(rrs_acceptance, "FIRST_BIN_COUNT", 4096)
    exact_low, exact_high = three_draft_bounds(target, draft)  # 3000 values fit one pass of 4096 bins
    ratio = np.maximum(target - draft, 0.0) / np.maximum(draft - target, 0.0).sum() / draft
    largest_scale = 1.0 / (1.0 - draft[draft > target].max())
    weighing = len(np.unique(draft[ratio < largest_scale]))
    assert len(passes) == 1 and passes[0][0] == np.count_nonzero(draft > target)
    assert weighing <= passes[0][1] <= len(np.unique(draft[ratio < 1.001 * largest_scale])) < len(np.unique(draft))
    assert exact_low == exact_high  # a bin per value: exact
    passes.clear()
    monkeypatch.setattr(rrs_acceptance, "FIRST_BIN_COUNT", 1000)
    monkeypatch.setattr(rrs_acceptance, "COARSE_BIN_COUNT", 16)
    low, high = three_draft_bounds(target, draft)
    assert max(passes[0]) <= 16
    assert high - low <= 2e-10 and low - 1e-13 <= exact_low <= high + 1e-13  # certified: it holds the value


# -- compiled kernels ----------------------------------------------------------------------
def test_min_sum_curve_counts_a_token_whose_ratio_overflows():
    """q = 1e-310 beside p = 0.5: p/q overflows; the token adds t·q at a finite t and p at ∞."""
    target, draft = np.array([0.5, 0.3, 0.2]), np.array([1e-310, 0.6, 0.4])
    thresholds = np.array([0.0, 0.5, 2.0, 1e300, np.inf])
    curve = min_sum_curve(target, draft)
    direct = np.minimum(target[None, :], thresholds[:, None] * draft[None, :]).sum(axis=1)
    np.testing.assert_allclose(curve(thresholds), direct, rtol=1e-15)
    assert curve(np.inf) == 1.0


def test_min_sum_pieces_carried_from_call_to_call_find_every_threshold(rng):
    """Each threshold is looked for on the piece of G the one before it in its place fell
    on (``_bracket_shares`` carries them from x1 bin to x1 bin): thresholds that jump up,
    down and onto breakpoints give G exactly as a fresh look-up does."""
    target, draft = random_pair(rng, 200)
    curve = rrs_acceptance._min_sum_arrays(target, draft)[0]
    breakpoints = curve[0]
    pieces = rrs_acceptance._new_pieces(50)
    for _ in range(20):
        thresholds = np.where(rng.random(50) < 0.3, rng.choice(breakpoints, 50), rng.exponential(2.0, 50))
        carried, fresh = np.empty(50), np.empty(50)
        rrs_acceptance._min_sum_values(curve, thresholds, pieces, carried)
        rrs_acceptance._min_sum_values(curve, thresholds, rrs_acceptance._new_pieces(50), fresh)
        direct = np.minimum(target[None, :], thresholds[:, None] * draft[None, :]).sum(axis=1)
        np.testing.assert_array_equal(carried, fresh)
        np.testing.assert_allclose(carried, direct, atol=1e-14)


def test_two_draft_acceptance_equals_the_sum_over_first_drafts(rng):
    """n = 2 (``_two_draft_acceptance``, one sort and look-ups) equals the sum over first
    drafts x1 written out: Σ min(p, q) + Σ_x1 (q − p)+(x1)·Σ_y min(p²(y), q(y)/(1 − q(x1))),
    p² = norm((p − q)+), on rows with ties, a dominant token and tokens of p = 0 or q = 0."""
    for target, draft in instances(rng, count=60):
        residual = np.maximum(target - draft, 0.0)
        if residual.sum() <= 0:
            continue
        residual /= residual.sum()
        second = [np.minimum(residual, draft / (1.0 - draft[x])).sum() for x in range(draft.size)]
        expected = np.minimum(target, draft).sum() + np.dot(np.maximum(draft - target, 0.0), second)
        assert rrs_without_replacement_acceptance(target, draft, 2) == pytest.approx(expected, abs=1e-14)
