"""Properties of the single-step verifiers: SPEC §4.4 fixtures, exact losslessness by
enumeration, statistical losslessness of the sampling code, acceptance ≤ α*,
Yin's Thm 5 for the ε-biased rules, bad-input errors, and the edge cases of issue #10
(disjoint supports, rows equal up to rounding, tiny and subnormal draft masses)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from support.edge_cases import distribution_pairs
from support.instances import FIXTURE_A, FIXTURE_B, FIXTURE_OPTIMUM, random_pair
from specbound.drafts import optimal_acceptance_bruteforce
from specbound.drafts import get_draft_scheme
from specbound.probability import as_target_and_draft, total_variation
from specbound.verifiers import VERIFIERS, get_verifier
from specbound.verifiers.rrs_exact import min_sum_curve

LOSSLESS = ["single", "rrs", "rrs_without_replacement", "kseq", "spechub", "greedy", "optimal"]

FIXTURE_ACCEPTANCE = {
    # (fixture, verifier, n): SPEC §4.4
    ("A", "rrs", 2): 0.720000,
    ("A", "rrs", 3): 0.768000,
    ("A", "rrs_without_replacement", 2): 0.764286,
    ("A", "rrs_without_replacement", 3): 0.840298,
    ("A", "kseq", 2): 0.750000,
    ("A", "kseq", 3): 0.793950,
    ("A", "spechub", 2): 0.766667,
    ("A", "greedy", 2): 0.766667,
    ("A", "greedy", 3): 0.933333,
    ("A", "single", 1): 0.600000,
    ("B", "rrs", 2): 0.860000,
    ("B", "rrs", 3): 0.902000,
    ("B", "rrs_without_replacement", 2): 0.873512,
    ("B", "rrs_without_replacement", 3): 0.936190,
    ("B", "kseq", 2): 0.896510,
    ("B", "kseq", 3): 0.950542,
    ("B", "spechub", 2): 1.0,
    ("B", "greedy", 2): 1.0,
    ("B", "greedy", 3): 1.0,
    ("B", "single", 1): 0.800000,
}
FIXTURES = {"A": FIXTURE_A, "B": FIXTURE_B}


def num_drafts_for(name):
    fixed = VERIFIERS[name].fixed_num_drafts
    return [fixed] if fixed is not None else [1, 2, 3]


@pytest.mark.parametrize(("fixture", "name", "num_drafts"), sorted(FIXTURE_ACCEPTANCE))
def test_fixture_acceptance(fixture, name, num_drafts):
    target, draft = FIXTURES[fixture]
    rate = get_verifier(name).acceptance_rate(target, draft, num_drafts)[0]
    assert rate == pytest.approx(FIXTURE_ACCEPTANCE[fixture, name, num_drafts], abs=1e-6)


@pytest.mark.parametrize(("fixture", "scheme", "num_drafts"), sorted(FIXTURE_OPTIMUM))
def test_optimal_verifier_reaches_fixture_optimum(fixture, scheme, num_drafts):
    target, draft = FIXTURES[fixture]
    verifier = get_verifier("optimal", draft_scheme=scheme)
    rate = verifier.acceptance_rate(target, draft, num_drafts)[0]
    assert rate == pytest.approx(FIXTURE_OPTIMUM[fixture, scheme, num_drafts], abs=1e-6)


def enumerated_law_and_acceptance(verifier, target, draft, num_drafts):
    """Σ_x̄ D(x̄) π(·|x̄) and Σ_x̄ D(x̄) π(x̄|x̄) by enumerating every draft tuple."""
    tuples, tuple_probs = get_draft_scheme(verifier.scheme).joint_law(draft, num_drafts)
    batch = len(tuples)
    laws = verifier.output_law(np.tile(target, (batch, 1)), np.tile(draft, (batch, 1)), tuples)
    hits = np.zeros(batch)
    for i in range(num_drafts):
        is_new = np.all(tuples[:, :i] != tuples[:, i : i + 1], axis=1)
        hits += np.where(is_new, laws[np.arange(batch), tuples[:, i]], 0.0)
    return tuple_probs @ laws, tuple_probs @ hits


@pytest.mark.parametrize("name", LOSSLESS)
def test_verifier_is_lossless_by_enumeration(name, rng):
    """Output law = target to 1e-12, and the closed-form acceptance equals the enumerated
    one, over all draft tuples, for V ≤ 6, n ≤ 3, many random instances with zeros."""
    verifier = get_verifier(name)
    checked = 0
    for vocab in (3, 4, 5, 6):
        for num_drafts in num_drafts_for(name):
            for _ in range(6 if name != "optimal" else 2):
                target, draft = random_pair(rng, vocab)
                if get_draft_scheme(verifier.scheme).needs_distinct_support and num_drafts > np.count_nonzero(draft):
                    continue
                law, acceptance = enumerated_law_and_acceptance(verifier, target, draft, num_drafts)
                np.testing.assert_allclose(law, target, atol=1e-12, rtol=0)
                exact = verifier.acceptance_rate(target, draft, num_drafts)[0]
                assert exact == pytest.approx(acceptance, abs=1e-9)
                checked += 1
    assert checked >= 12


@pytest.mark.parametrize("scheme", ["with_replacement", "without_replacement", "greedy"])
def test_optimal_verifier_is_lossless_for_every_scheme(scheme, rng):
    verifier = get_verifier("optimal", draft_scheme=scheme)
    for vocab, num_drafts in [(4, 2), (5, 3), (6, 2)]:
        target, draft = random_pair(rng, vocab, zeros=False)
        law, acceptance = enumerated_law_and_acceptance(verifier, target, draft, num_drafts)
        np.testing.assert_allclose(law, target, atol=1e-9, rtol=0)
        assert acceptance == pytest.approx(
            optimal_acceptance_bruteforce(target, draft, num_drafts, scheme).acceptance[0], abs=1e-9
        )


@pytest.mark.parametrize("name", [n for n in LOSSLESS if n != "optimal"])
def test_acceptance_is_at_most_the_optimum(name, rng):
    verifier = get_verifier(name)
    for vocab in range(3, 11):
        for num_drafts in num_drafts_for(name):
            target, draft = random_pair(rng, vocab)
            if get_draft_scheme(verifier.scheme).needs_distinct_support and num_drafts > np.count_nonzero(draft):
                continue
            optimum = optimal_acceptance_bruteforce(target, draft, num_drafts, verifier.scheme).acceptance[0]
            assert verifier.acceptance_rate(target, draft, num_drafts)[0] <= optimum + 1e-12


@pytest.mark.parametrize("name", ["greedy", "spechub"])
def test_greedy_and_spechub_reach_the_greedy_optimum(name, rng):
    verifier = get_verifier(name)
    for vocab in range(3, 9):
        for num_drafts in num_drafts_for(name):
            target, draft = random_pair(rng, vocab)
            if num_drafts > np.count_nonzero(draft):
                continue
            optimum = optimal_acceptance_bruteforce(target, draft, num_drafts, verifier.scheme).acceptance[0]
            assert verifier.acceptance_rate(target, draft, num_drafts)[0] == pytest.approx(optimum, abs=1e-12)


# Statistical losslessness of the sampling code. A χ² goodness-of-fit test at level
# 0.001 on V = 50 cells with 100,000 draws: a bias of 0.01 in total variation gives a
# non-centrality of at least N·(2·0.01)²/(2·max p) = 254 here (max p = 0.079), far above
# the ~60 needed for power > 0.999 with 49 degrees of freedom (critical value 85.4; power
# at 254 > 1 − 1e-6). The acceptance rate is checked at 4σ (level 6e-5): a bias of 0.01
# in it is at least 6.3σ at N = 100,000 (σ ≤ 0.0016), power > 0.98.
SIGNIFICANCE = 1e-3
SAMPLES = 100_000


def sampled_verdicts(verifier, target, draft, num_drafts, rng):
    tokens, accepted = [], []
    for _ in range(SAMPLES // 50_000):
        drafts = get_draft_scheme(verifier.scheme).sample(np.tile(draft, (50_000, 1)), num_drafts, rng)
        verdict = verifier.verify(target, draft, drafts, rng)
        tokens.append(verdict.tokens)
        accepted.append(verdict.accepted)
    return np.concatenate(tokens), np.concatenate(accepted)


@pytest.mark.parametrize("name", [n for n in LOSSLESS if n != "optimal"])
def test_verify_samples_the_target(name):
    rng = np.random.default_rng(7)
    verifier = get_verifier(name)
    num_drafts = num_drafts_for(name)[-1]
    target, draft = random_pair(rng, 50, concentration=1.0, zeros=False)
    tokens, accepted = sampled_verdicts(verifier, target, draft, num_drafts, rng)
    counts = np.bincount(tokens, minlength=50)
    assert stats.chisquare(counts, SAMPLES * target).pvalue > SIGNIFICANCE
    exact = verifier.acceptance_rate(target, draft, num_drafts)[0]
    sigma = np.sqrt(exact * (1 - exact) / SAMPLES)
    assert abs(accepted.mean() - exact) < 4 * sigma


def test_statistical_test_detects_a_biased_sampler():
    """The χ² test above has the power it claims: a 0.01-TV bias is rejected."""
    rng = np.random.default_rng(7)
    target, _ = random_pair(rng, 50, concentration=1.0, zeros=False)
    shifted = target.copy()
    top, bottom = np.argsort(target)[-1], np.argsort(target)[-2]
    shifted[top] += 0.01
    shifted[bottom] -= 0.01
    counts = np.bincount(rng.choice(50, size=SAMPLES, p=shifted), minlength=50)
    assert stats.chisquare(counts, SAMPLES * target).pvalue < SIGNIFICANCE


def test_measured_acceptance_matches_exact_for_the_optimal_verifier():
    rng = np.random.default_rng(11)
    verifier = get_verifier("optimal", draft_scheme="without_replacement")
    target, draft = random_pair(rng, 5, zeros=False)
    drafts = get_draft_scheme("without_replacement").sample(np.tile(draft, (40_000, 1)), 2, rng)
    verdict = verifier.verify(target, draft, drafts, rng)
    counts = np.bincount(verdict.tokens, minlength=5)
    assert stats.chisquare(counts, 40_000 * target).pvalue > SIGNIFICANCE
    exact = verifier.acceptance_rate(target, draft, 2)[0]
    assert abs(verdict.accepted.mean() - exact) < 4 * np.sqrt(exact * (1 - exact) / 40_000)


# --- ε-biased decoding [YIN §4] ---------------------------------------------------------
def loss_star(target, draft, weights):
    """Loss*(b) = ½Σ|p − b·q| − ½Σ(1 − b)·q (SPEC §3), written out independently."""
    return 0.5 * np.abs(target - weights * draft).sum(-1) - 0.5 * ((1 - weights) * draft).sum(-1)


@pytest.mark.parametrize("epsilon", [0.0, 0.01, 0.05, 0.1, 0.2, 0.4, 0.8, 5.0])
def test_decoding_opt_sits_on_the_pareto_front(epsilon, rng):
    opt = get_verifier("decoding_opt", epsilon=epsilon)
    uno = get_verifier("decoding_uno", epsilon=epsilon)
    for _ in range(20):
        target, draft = random_pair(rng, 12)
        bias = opt.bias(target, draft)
        weights = opt.acceptance_weights(target[None], draft[None])
        np.testing.assert_allclose(bias, loss_star(target, draft, weights), atol=1e-12)
        np.testing.assert_allclose(
            opt.rejection_rate(target, draft) + bias, total_variation(target, draft), atol=1e-12
        )
        assert uno.bias(target, draft)[0] >= bias[0] - 1e-12
        assert get_verifier("decoding_uno", epsilon=epsilon, resample="draft").bias(target, draft)[0] >= bias[0] - 1e-12


def test_decoding_opt_with_zero_epsilon_is_speculative_sampling(rng):
    target, draft = random_pair(rng, 8)
    opt = get_verifier("decoding_opt", epsilon=0.0)
    assert opt.bias(target, draft)[0] == pytest.approx(0.0, abs=1e-15)
    assert opt.acceptance_rate(target, draft, 1)[0] == pytest.approx(
        get_verifier("single").acceptance_rate(target, draft, 1)[0], abs=1e-15
    )


@pytest.mark.parametrize("name", ["decoding_opt", "decoding_uno"])
def test_biased_decoding_output_law_is_exact(name, rng):
    """Enumerated output law equals ``output_distribution``, and sampling follows it."""
    verifier = get_verifier(name, epsilon=0.1)
    target, draft = random_pair(rng, 6, zeros=False)
    law, acceptance = enumerated_law_and_acceptance(verifier, target, draft, 1)
    np.testing.assert_allclose(law, verifier.output_distribution(target, draft)[0], atol=1e-12)
    assert acceptance == pytest.approx(verifier.acceptance_rate(target, draft, 1)[0], abs=1e-12)
    sample_rng = np.random.default_rng(3)
    drafts = get_draft_scheme("with_replacement").sample(np.tile(draft, (100_000, 1)), 1, sample_rng)
    tokens = verifier.verify(target, draft, drafts, sample_rng).tokens
    assert stats.chisquare(np.bincount(tokens, minlength=6), 100_000 * law).pvalue > SIGNIFICANCE


# --- bad input ----------------------------------------------------------------------------
GOOD_TARGET, GOOD_DRAFT = FIXTURE_A


@pytest.mark.parametrize(
    ("target", "draft", "message"),
    [
        ([0.5, np.nan, 0.25, 0.25], GOOD_DRAFT, "target_probs: contains NaN"),
        (GOOD_TARGET, [0.5, -0.1, 0.3, 0.3], "draft_probs: contains negative"),
        (GOOD_TARGET, [0.5, 0.5], "draft_probs: vocabulary size 2 differs"),
        ([0.5, 0.3, 0.1, 0.05], GOOD_DRAFT, "target_probs: rows must sum to 1"),
        (GOOD_TARGET, np.ones((2, 3, 4)) / 4, "draft_probs: expected shape"),
    ],
)
def test_bad_distributions_raise(target, draft, message):
    with pytest.raises(ValueError, match=message):
        get_verifier("rrs").acceptance_rate(target, draft, 2)


def test_bad_draft_tokens_raise():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="draft_tokens: token ids must lie in"):
        get_verifier("rrs").verify(GOOD_TARGET, GOOD_DRAFT, [[0, 4]], rng)
    with pytest.raises(ValueError, match="repeats one"):
        get_verifier("rrs_without_replacement").verify(GOOD_TARGET, GOOD_DRAFT, [[1, 1]], rng)
    with pytest.raises(ValueError, match="zero draft probability"):
        get_verifier("single").verify(GOOD_TARGET, [0.5, 0.5, 0.0, 0.0], [[3]], rng)
    with pytest.raises(ValueError, match="most probable"):
        get_verifier("greedy").verify(GOOD_TARGET, GOOD_DRAFT, [[0, 3]], rng)
    with pytest.raises(ValueError, match="hub"):
        get_verifier("spechub").verify(GOOD_TARGET, GOOD_DRAFT, [[0, 1]], rng)


def test_bad_num_drafts_raise():
    with pytest.raises(ValueError, match="only 2 tokens with positive probability"):
        get_verifier("rrs_without_replacement").acceptance_rate(GOOD_TARGET, [0.5, 0.5, 0, 0], 3)
    with pytest.raises(ValueError, match="spechub.*exactly 2"):
        get_verifier("spechub").acceptance_rate(GOOD_TARGET, GOOD_DRAFT, 3)
    with pytest.raises(ValueError, match="num_drafts: expected a positive integer"):
        get_verifier("rrs").acceptance_rate(GOOD_TARGET, GOOD_DRAFT, 0)
    with pytest.raises(ValueError, match="unknown verifier"):
        get_verifier("nope")
    with pytest.raises(ValueError, match="epsilon"):
        get_verifier("decoding_opt", epsilon=-0.1)
    with pytest.raises(ValueError, match="does not take parameters"):
        get_verifier("rrs", epsilon=0.1)


def test_optimal_verifier_refuses_large_problems():
    target = np.full(40, 1 / 40)
    with pytest.raises(ValueError):
        get_verifier("optimal").acceptance_rate(target, target, 4)


@pytest.mark.parametrize("num_drafts", [1, 2, 3])
def test_rows_equal_up_to_rounding_are_accepted_for_sure(num_drafts):
    """p ≤ q everywhere with Σq exceeding Σp by one ulp (seen at T = 0.1 on the default
    pair): (p − q)+ has no mass, the two-sided TV is 1e-17; every exact acceptance is 1
    and none divides by the empty residual."""
    from specbound.studies.acceptance import acceptance_methods, method_acceptance

    target = np.array([[0.3, 0.7, 0.0]])
    draft = target.copy()
    draft[0, 1] = np.nextafter(draft[0, 1], 1.0)
    for method in acceptance_methods():
        assert method_acceptance(method, target, draft, num_drafts)[0] == pytest.approx(1.0, abs=1e-12), method


# --- edge cases (issue #10) ------------------------------------------------------------------
LARGEST_BELOW_ONE = np.nextafter(1.0, 0.0)  # rejects every acceptance ratio below 1


def both_paths(verifier, target, draft, tokens, uniforms):
    """Emitted tokens of the numpy path and of the torch path (given the rows the numpy path
    computes with) on the same uniforms.  # -> [batch], [batch]"""
    checked_target, checked_draft = as_target_and_draft(target, draft)
    rows = len(tokens)
    reference = verifier.verify_with_uniforms(np.tile(target, (rows, 1)), np.tile(draft, (rows, 1)), tokens, uniforms)
    fast = verifier.verify_torch_with_uniforms(
        torch.tensor(np.tile(checked_target, (rows, 1))), torch.tensor(np.tile(checked_draft, (rows, 1))),
        torch.tensor(tokens), torch.tensor(uniforms),
    )
    return reference.tokens, fast.tokens.numpy()


def test_kseq_with_disjoint_supports_emits_from_the_target():
    """Σ min(p, q) = 0: no draft can be accepted and the residual is p itself (with β = 0
    the weight p_acc/β is its limit n). It was 0/0: a NaN output law, and verify emitted
    token 0, which the target rules out (issue #10)."""
    verifier = get_verifier("kseq")
    target, draft = np.array([0.0, 0.0, 1.0]), np.array([0.0, 1.0, 0.0])
    np.testing.assert_array_equal(verifier.output_law(target, draft, [[1, 1]]), [[0.0, 0.0, 1.0]])
    assert verifier.acceptance_rate(target, draft, 2)[0] == 0.0
    tokens = np.array([[1, 1], [1, 1], [1, 1]])
    uniforms = np.array([[0.5, 0.5, 0.0], [0.5, 0.5, 0.5], [0.5, 0.5, LARGEST_BELOW_ONE]])
    for emitted in both_paths(verifier, target, draft, tokens, uniforms):
        assert emitted.tolist() == [2, 2, 2]


ROUNDING_PAIRS = {
    # p ≤ q at every token once stored, with p/q < 1 somewhere: (p − q)+ has no mass while
    # a draft can still be rejected with probability ~1e-16
    "one ulp apart": ([0.3, 0.7, 0.0], [0.3, np.nextafter(0.7, 1.0), 0.0]),
    "dominant token stored as 1.0": ([1.0, 0.0], [1.0, 1e-17]),
}


@pytest.mark.parametrize("pair", sorted(ROUNDING_PAIRS))
@pytest.mark.parametrize("name", [n for n in LOSSLESS if n != "optimal"] + ["decoding_opt"])
def test_a_rejection_between_rows_equal_up_to_rounding_emits_from_the_target(name, pair):
    """The residual (p − q)+ cancels to 0 while a ratio below 1 still rejects: the output
    law raised ZeroResidualError, and so did verify on a rejection; now the token after
    such a rejection comes from p (``residual_law``), never one the target rules out."""
    verifier = get_verifier(name)
    target, draft = (np.array(row) for row in ROUNDING_PAIRS[pair])
    scheme = get_draft_scheme(verifier.scheme)
    for num_drafts in num_drafts_for(name):
        if scheme.needs_distinct_support and num_drafts > np.count_nonzero(draft):
            continue
        tuples, tuple_probs = scheme.joint_law(draft, num_drafts)
        laws = verifier.output_law(np.tile(target, (len(tuples), 1)), np.tile(draft, (len(tuples), 1)), tuples)
        assert np.all(np.isfinite(laws)) and np.all(laws[:, target == 0] == 0)
        np.testing.assert_allclose(tuple_probs @ laws, target, atol=1e-12)
        uniforms = np.full((len(tuples), num_drafts + 1), LARGEST_BELOW_ONE)
        for emitted in both_paths(verifier, target, draft, tuples, uniforms):
            assert np.all(target[emitted] > 0), (num_drafts, emitted)


def test_min_sum_curve_is_exact_beside_a_tiny_draft_token():
    """G(t) = Σ min(p, t·q) at and between its breakpoints. The draft mass beyond a
    breakpoint was 1 minus a running sum, 1e-16 off beside a draft token of 1e-12, which
    the ratio 4e11 turned into an error of 9e-5."""
    target, draft = np.array([0.05, 0.3, 0.25, 0.4]), np.array([0.33, 0.3, 0.37 - 1e-12, 1e-12])
    ratios = np.sort(target / draft)
    thresholds = np.concatenate([ratios, 0.5 * (ratios[1:] + ratios[:-1])])
    exact = [np.minimum(target, t * draft).sum() for t in thresholds]
    np.testing.assert_allclose(min_sum_curve(target, draft)(thresholds), exact, atol=1e-15, rtol=0)


def test_rrs_without_replacement_keeps_the_mass_beside_the_two_largest_drafts():
    """n = 3 drafts of a 3-token draft law take every token, so the target token is always
    among them and α = 1. 1 − q(x1) − q(x2) for the two largest draft tokens was a
    difference, 1e-17 with an error of 1e-22: α came out 0.9999982."""
    target, draft = [1.0, 0.0, 0.0], [1e-17, 3.23677253e-07, 1.0 - 3.23677253e-07]
    assert get_verifier("rrs_without_replacement").acceptance_rate(target, draft, 3)[0] == pytest.approx(1.0, abs=1e-12)


def test_rrs_without_replacement_acceptance_of_equal_rows_is_one():
    """p = q: the first draft is accepted for sure. The recursion's scale 1/Σq of a row
    summing to 1 − 1e-16 made a rejection of ~1e-16 whose residual is empty, and
    normalising it raised ZeroResidualError."""
    row = [0.0009870315138376723, 0.6227184063715607, 0.027219710608208474, 0.3304195503237634, 0.0,
           0.018655301182629716]
    assert get_verifier("rrs_without_replacement").acceptance_rate(row, row, 2)[0] == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize(("target", "draft"), [
    ([0.0, 1.0], [1.0, 1e-310]),
    ([0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 1e-310, 1e-310]),
    ([0.2, 0.5, 0.3, 0.0], [0.7, 0.3 - 2e-305, 1e-305, 1e-305]),
])
def test_rrs_without_replacement_acceptance_with_subnormal_draft_masses(target, draft):
    """Once the dominant drafts are rejected, the next ones come from a rest of 1e-305 or
    less, whose scale 1/(1 − q(S)) overflows: the acceptance was NaN. It equals the
    enumerated one."""
    verifier = get_verifier("rrs_without_replacement")
    target, draft = np.array(target), np.array(draft)
    for num_drafts in range(1, np.count_nonzero(draft) + 1):
        _, enumerated = enumerated_law_and_acceptance(verifier, target, draft, num_drafts)
        assert verifier.acceptance_rate(target, draft, num_drafts)[0] == pytest.approx(enumerated, abs=1e-12)



def test_optimal_verifier_law_beside_a_rare_draft_tuple():
    """A tuple of probability 7e-13 sits below the LP's tolerance: its conditional law was
    coupling / D_k and summed to 0.9998. Every conditional is a law, and the output law is p."""
    verifier = get_verifier("optimal")
    target, draft = np.array([1.0, 0.0]), np.array([1.0 - 8.6288e-07, 8.6288e-07])
    tuples, tuple_probs = get_draft_scheme("with_replacement").joint_law(draft, 2)
    laws = verifier.output_law(np.tile(target, (len(tuples), 1)), np.tile(draft, (len(tuples), 1)), tuples)
    np.testing.assert_allclose(laws.sum(axis=1), 1.0, atol=1e-9, rtol=0)
    np.testing.assert_allclose(tuple_probs @ laws, target, atol=1e-9, rtol=0)


@settings(max_examples=60, deadline=None)
@given(pair=distribution_pairs(max_vocab=300), num_drafts=st.sampled_from([0, 1, 2, 3, 6]), batch=st.integers(1, 3))
def test_rrs_acceptance_is_numpys_unaccepted_mass_bit_for_bit(pair, num_drafts, batch):
    """The compiled |u^{M+1}| of RRS with i.i.d. drafts (``unaccepted_totals``, two passes a
    draft) is numpy's ``unaccepted_mass(...).sum(-1)`` bit for bit, rows of zeros, ties and
    subnormal masses included, a row at a time or several."""
    from specbound.verifiers.rrs import unaccepted_mass, unaccepted_totals

    target, draft = (np.tile(row / row.sum(), (batch, 1)) for row in pair)
    draft[1:] = np.roll(draft[1:], 1, axis=1)  # other rows, other pairs
    expected = unaccepted_mass(target, draft, num_drafts).sum(axis=-1)
    np.testing.assert_array_equal(unaccepted_totals(target, draft, num_drafts), expected)
