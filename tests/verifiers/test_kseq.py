"""K-SEQ's ρ* (``specbound.verifiers.kseq``): the scan-order bisection of checked rows
(``kseq_scale_of``) returns the plain bisection's ρ* bit for bit, on generated rows with ties,
zeros, p/q beyond float64's range and β = 0, and on long heavy-tailed rows where most steps
are decided from the scan order; at ρ* p_acc < ρβ; the scan-order β stays within its
stated bound; numpy sums a row pairwise, as that bound assumes.
Letters: p = target, q = draft (SPEC.md §0)."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from edge_cases import PAIR_KINDS, distribution_pairs
from specbound.bounds.rows import RowPairs
from specbound.verifiers import get_verifier
from specbound.verifiers.kseq import ScanBeta, kseq_scale, kseq_scale_of

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
    rng = np.random.default_rng(seed)
    for scale in 1.0 + 5.0 * rng.random(40):
        scan = ScanBeta(rows, 0)
        for narrowed in (False, True):
            if narrowed and not scan._narrow(scale, scale):
                continue
            beta, error = scan._estimate(scale)
            exact = math.fsum(np.minimum(rows.target[0] / scale, rows.draft[0]))
            assert abs(beta - exact) <= error + 2 * np.finfo(float).eps * exact


def pairwise_sum(values):
    """numpy's pairwise summation (``pairwise_sum`` in numpy's loops_utils.h.src): blocks of at most
    128 values summed in 8 running sums, halved above that at a multiple of 8."""
    if len(values) < 8:
        total = 0.0
        for value in values:
            total += value
        return total
    if len(values) <= 128:
        running = list(values[:8])
        stop = len(values) - len(values) % 8
        for start in range(8, stop, 8):
            running = [total + value for total, value in zip(running, values[start : start + 8])]
        left = (running[0] + running[1]) + (running[2] + running[3])
        total = left + ((running[4] + running[5]) + (running[6] + running[7]))
        for value in values[stop:]:
            total += value
        return total
    half = len(values) // 2
    half -= half % 8
    return pairwise_sum(values[:half]) + pairwise_sum(values[half:])


@pytest.mark.parametrize("vocab", [5, 100, 1000, 70001])
def test_numpy_sums_a_row_pairwise(vocab):
    """The error bound the scan-order bisection relies on (``_pairwise_additions``) is that
    of numpy's pairwise sum along a contiguous row, which is what ``.sum(-1)`` computes here."""
    rng = np.random.default_rng(vocab)
    rows = rng.random((2, vocab)) ** 8
    assert rows.sum(-1)[1] == pairwise_sum(rows[1].tolist())


def test_torch_scale_equals_the_numpy_scale():
    target, draft = heavy_tailed_pair(3, vocab=500)
    for num_drafts in COUNTS:
        torch_scale = kseq_scale(torch.from_numpy(target[None]), torch.from_numpy(draft[None]), num_drafts)
        np.testing.assert_allclose(torch_scale.numpy(), kseq_scale(target[None], draft[None], num_drafts), rtol=1e-12)
