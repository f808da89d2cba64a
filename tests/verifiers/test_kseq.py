"""K-SEQ's ρ* (``specbound.verifiers.kseq``): the scan-order bisection of checked rows
(``kseq_scale_of``) returns the plain bisection's ρ* bit for bit, on generated rows with ties,
zeros, p/q beyond float64's range and β = 0, and on long heavy-tailed rows where most steps
are decided from the scan order; at ρ* p_acc < ρβ; the scan-order β stays within its
stated bound; the pass's compiled comparison is numpy's or left to it; the compiled exact
acceptance is its formula evaluated exactly.
Letters: p = target, q = draft (SPEC.md §0)."""

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from support.edge_cases import PAIR_KINDS, distribution_pairs
from specbound.bounds.rows import RowPairs
from specbound.verifiers import get_verifier
from specbound.verifiers.kseq import (
    far_estimate,
    kseq_scale,
    kseq_scale_of,
    near_estimate,
    near_form,
    pairwise_additions,
    pass_decision,
)

COUNTS = (1, 2, 3, 4, 6)


@st.composite
def kseq_pairs(draw):
    """(target [V], draft [V]): an edge-case pair (``edge_cases``), or a pair whose draft is
    the target scaled by a few factors, so that many tokens share one ratio p/q."""
    if draw(st.booleans()):
        return draw(distribution_pairs(max_vocab=12, kinds=PAIR_KINDS))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    vocab = draw(st.integers(2, 40))
    target = rng.dirichlet(np.full(vocab, draw(st.sampled_from((0.1, 1.0)))))
    target[rng.random(vocab) < 0.2] = 0.0
    if not target.any():
        target[0] = 1.0
    factors = rng.choice([0.0, 0.5, 1.0, 2.0, 3.0], size=vocab)
    draft = target * factors
    if not draft.any():
        draft[-1] = 1.0
    return target / target.sum(), draft / draft.sum()


def heavy_tailed_pair(seed, vocab=4000):
    """A long pair like a language model's rows: a few likely tokens and a long tail."""
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal(vocab) * 3.0
    target = np.exp(logits - logits.max())
    draft = np.exp(logits + rng.standard_normal(vocab) - logits.max())
    return target / target.sum(), draft / draft.sum()


def scales_agree(target, draft):
    rows = RowPairs.checked(target, draft)
    for num_drafts in COUNTS:
        expected = kseq_scale(rows.target, rows.draft, num_drafts)
        np.testing.assert_array_equal(kseq_scale_of(rows, num_drafts), expected)


@given(kseq_pairs())
def test_scan_bisection_equals_the_bisection(pair):
    scales_agree(*pair)


@pytest.mark.parametrize("seed", range(6))
def test_scan_bisection_equals_the_bisection_on_long_rows(seed):
    scales_agree(*heavy_tailed_pair(seed))


def test_scan_bisection_equals_the_bisection_on_a_batch():
    """Each row stops at its own bracket width, so a row's ρ* is the same alone or in a batch."""
    pairs = [heavy_tailed_pair(seed, vocab=1000) for seed in range(3)]
    target, draft = np.stack([p for p, _ in pairs]), np.stack([q for _, q in pairs])
    rows = RowPairs.checked(target, draft)
    for num_drafts in COUNTS:
        alone = [kseq_scale(rows.target[i : i + 1], rows.draft[i : i + 1], num_drafts)[0] for i in range(3)]
        np.testing.assert_array_equal(kseq_scale(rows.target, rows.draft, num_drafts), alone)
        np.testing.assert_array_equal(kseq_scale_of(rows, num_drafts), alone)


def test_scan_bisection_equals_the_bisection_beyond_the_float_range_and_without_overlap():
    """p/q overflows where q is subnormal; disjoint supports give β = 0 at every ρ."""
    target, draft = heavy_tailed_pair(7, vocab=200)
    draft[:5] = 5e-324
    scales_agree(target, draft / draft.sum())
    disjoint_target, disjoint_draft = np.zeros(200), np.zeros(200)
    disjoint_target[:100], disjoint_draft[100:] = target[:100], draft[100:]
    scales_agree(disjoint_target / disjoint_target.sum(), disjoint_draft / disjoint_draft.sum())


def test_kseq_acceptance_of_checked_rows_equals_acceptance_rate():
    kseq = get_verifier("kseq")
    for seed in range(3):
        target, draft = heavy_tailed_pair(seed)
        for num_drafts in COUNTS:
            np.testing.assert_array_equal(
                kseq.acceptance_rate_of(RowPairs.checked(target, draft), num_drafts),
                kseq.acceptance_rate(target, draft, num_drafts),
            )


@given(kseq_pairs())
def test_scale_brackets_the_root(pair):
    """ρ* lies in [1, n], and at it p_acc < ρβ (the comparison the bisection makes), so the
    residual is non-negative, unless ρ* is n itself."""
    rows = RowPairs.checked(*pair)
    for num_drafts in COUNTS[1:]:
        scale = kseq_scale_of(rows, num_drafts)[0]
        beta = np.minimum(rows.target[0] / scale, rows.draft[0]).sum()
        assert 1.0 <= scale <= num_drafts
        assert scale == num_drafts or 1.0 - (1.0 - beta) ** num_drafts < scale * beta


@pytest.mark.parametrize("seed", range(4))
def test_scan_beta_is_within_its_bound(seed):
    """The scan-order β, far and near form, is within its bound of Σ min(p/ρ, q) summed
    exactly (``math.fsum``; each term's own rounding is ≤ u of it)."""
    target, draft = heavy_tailed_pair(seed)
    rows = RowPairs.checked(target, draft)
    in_order = (rows.target_in_scan_order[0], rows.draft_in_scan_order[0])
    rng = np.random.default_rng(seed)
    narrowed = 0
    for scale in 1.0 + 5.0 * rng.random(40):
        exact = math.fsum(np.minimum(rows.target[0] / scale, rows.draft[0]))
        estimates = [far_estimate(*in_order, rows.target_inside[0], rows.draft_inside[0], scale)]
        near = near_form(*in_order, scale, scale)
        if near[0] >= 0:
            estimates.append(near_estimate(*in_order, near, scale))
            narrowed += 1
        for beta, error in estimates:
            assert abs(beta - exact) <= error + 2 * np.finfo(float).eps * exact
    assert narrowed == 40


def numpys_additions(length: int) -> int:
    """The most additions one term meets in numpy's pairwise sum of ``length`` contiguous
    values, step by step as numpy sums: fewer than 8 values one after the other from 0; up to
    128 in 8 running sums, combined in three levels, the leftover added one by one; more
    split in two halves (the first a multiple of 8), summed apart and added."""
    if length < 8:
        return length
    if length <= 128:
        return (length // 8 - 1) + 3 + length % 8
    half = length // 2
    half -= half % 8
    return 1 + max(numpys_additions(half), numpys_additions(length - half))


@pytest.mark.parametrize("lengths", [range(0, 3000), [8191, 8192, 65_536, 151_936, 151_937, 10**6, 10**8]])
def test_pairwise_additions_bounds_what_numpys_sum_does(lengths):
    """The certificate's count of additions (``certain``'s A) is at least numpy's own, at
    every length: a smaller A would let a rounding of the pass flip a decision."""
    for length in lengths:
        assert pairwise_additions(length) >= numpys_additions(length), length


def test_pass_decision_is_numpys_comparison():
    """The pass's comparison 1 − (1 − β)ⁿ ≥ ρβ as numpy makes it (its own pow()), also where
    ρβ is within ulps of 1 − (1 − β)ⁿ: decided alike, or left to numpy's power (only there);
    numpy's power is within the 8 ulps of the C library's that the decision allows for."""
    rng = np.random.default_rng(5)
    bases = np.concatenate([rng.random(20000), 1.0 - rng.random(5000) * 1e-6, rng.random(5000) ** 20])
    for num_drafts in (3, 4, 6):
        library = np.array([math.pow(base, num_drafts) for base in bases])
        assert np.all(np.abs(bases**num_drafts - library) <= 8 * np.spacing(library))
    for num_drafts in COUNTS:
        left = 0
        for beta in np.concatenate([rng.random(300), 1.0 - rng.random(100) * 1e-3, rng.random(100) * 1e-3]):
            at_root = 1.0 - ((1.0 - np.array([beta])) ** num_drafts)[0]  # ρβ there: the comparison's edge
            for offset in range(-12, 13):
                product = at_root
                for _ in range(abs(offset)):
                    product = np.nextafter(product, np.inf * offset)
                scale = np.array([product / beta])
                expected = bool(1.0 - (1.0 - np.array([beta])) ** num_drafts >= scale * beta)
                decision = pass_decision(beta, scale[0], num_drafts)
                left += decision < 0
                assert decision < 0 or decision == expected
        assert left == 0 if num_drafts <= 2 else 0 < left < 500 * 25 / 2


def acceptance_formula(target, draft, scale, num_drafts) -> float:
    """α = p_acc + (1 − β)ⁿ Σ_y r(y)(1 − (1 − w(y))ⁿ) at ``scale``, exactly (``Fraction``)."""
    p, q = ([Fraction(x) for x in row] for row in (target, draft))
    accepted = [min(p_y / Fraction(scale), q_y) for p_y, q_y in zip(p, q)]
    beta = sum(accepted)
    none_accepted = (1 - beta) ** num_drafts
    leftover = [max(p_y - (1 - none_accepted) / beta * a_y, Fraction(0)) for p_y, a_y in zip(p, accepted)]
    rejected = [(q_y - a_y) / (1 - beta) for q_y, a_y in zip(q, accepted)]  # w
    hits = sum(r_y * (1 - (1 - w_y) ** num_drafts) for r_y, w_y in zip(leftover, rejected)) / sum(leftover)
    return float(1 - none_accepted + none_accepted * hits)


@pytest.mark.parametrize("seed", range(3))
def test_kseq_acceptance_is_its_formula(seed):
    """The compiled acceptance is within a few ulps of its formula evaluated exactly from the
    same float rows, at ρ* and at scales above it: at ρ* the residual and a rejected draft's
    law barely overlap (the residual is where ρ*q < p, up to rounding), above it they do."""
    rng = np.random.default_rng(seed)
    target, draft = rng.dirichlet(np.full(100, 0.3), size=2)  # little overlap: (1 − β)ⁿ weighs in
    target[:10] = 0.0  # tokens only the draft proposes: their w(y) is all of q
    target /= target.sum()
    kseq = get_verifier("kseq")
    rows = RowPairs.checked(target, draft)
    for num_drafts in COUNTS:
        root = kseq_scale_of(rows, num_drafts)[0]
        for scale in (root, 0.5 * (root + num_drafts) + 0.5, num_drafts + 1.0):
            computed = kseq._acceptance_rate(rows.target, rows.draft, num_drafts, np.array([scale]))[0]
            exact = acceptance_formula(rows.target[0], rows.draft[0], scale, num_drafts)
            assert computed == pytest.approx(exact, rel=0, abs=8 * np.finfo(float).eps)


def test_torch_scale_equals_the_numpy_scale():
    target, draft = heavy_tailed_pair(3, vocab=500)
    for num_drafts in COUNTS:
        torch_scale = kseq_scale(torch.from_numpy(target[None]), torch.from_numpy(draft[None]), num_drafts)
        np.testing.assert_allclose(torch_scale.numpy(), kseq_scale(target[None], draft[None], num_drafts), rtol=1e-12)
