"""Property-based tests (hypothesis) of every registered draft scheme on the edge-case
pairs of ``edge_cases`` (V ≤ 6, n ≤ 3): the exact joint law is a distribution on tuples of
draft tokens of positive probability (distinct where the scheme says so), the numpy and
torch samplers draw only such tuples, and α* from the scheme's prefix scan or closed form
is finite, in [0, 1], and equals the brute force over all 2^V subsets. Letters: p =
target, q = draft (SPEC.md §0).
"""

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from support.edge_cases import distribution_pairs
from specbound.drafts import DRAFT_SCHEMES, get_draft_scheme
from specbound.probability import as_target_and_draft

SCHEMES = sorted(DRAFT_SCHEMES)
TOLERANCE = 1e-9


def draft_counts(scheme, draft, max_drafts=3):
    counts = [scheme.fixed_num_drafts] if scheme.fixed_num_drafts else range(1, max_drafts + 1)
    return [n for n in counts if not (scheme.needs_distinct_support and n > np.count_nonzero(draft))]


def assert_draws_of(scheme, draft, tuples):
    """Every tuple has tokens of positive draft probability, distinct where the scheme
    draws distinct tokens.  # draft [V], tuples [K, n]"""
    assert np.all(draft[tuples] > 0), "a draft token of zero draft probability"
    if scheme.needs_distinct_support:
        ordered = np.sort(tuples, axis=1)
        assert np.all(ordered[:, 1:] != ordered[:, :-1]), "a repeated draft"


def ratio_overflows(target, draft):
    """Whether a token of positive draft probability has p/q beyond 1.8e308: ``bounds.subset``
    then orders it wrongly (``test_scan_order_keeps_the_order_of_overflowing_ratios``)."""
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        return bool(np.any((draft > 0) & np.isinf(target / draft)))


@pytest.mark.parametrize("name", SCHEMES)
@given(pair=distribution_pairs(), seed=st.integers(0, 2**16))
def test_joint_law_and_samplers_on_edge_cases(name, pair, seed):
    scheme = get_draft_scheme(name)
    _, draft = (row[0] for row in as_target_and_draft(*pair))
    for num_drafts in draft_counts(scheme, draft):
        tuples, probs = scheme.joint_law(draft, num_drafts)
        assert np.all(probs >= 0) and probs.sum() == pytest.approx(1.0, abs=1e-12)  # 5e-324² is 0
        assert_draws_of(scheme, draft, tuples)
        rows = np.tile(draft, (64, 1))
        assert_draws_of(scheme, draft, scheme.sample(rows, num_drafts, np.random.default_rng(seed)))
        generator = torch.Generator().manual_seed(seed)
        assert_draws_of(scheme, draft, scheme.sample_torch(torch.tensor(rows), num_drafts, generator).numpy())
        narrow = draft.astype(np.float32)  # the engine's rows: a float64 mass below 1e-45 is 0 here
        if not (scheme.needs_distinct_support and num_drafts > np.count_nonzero(narrow)):
            drawn = scheme.sample_torch(torch.tensor(np.tile(narrow, (64, 1))), num_drafts, generator).numpy()
            assert_draws_of(scheme, narrow, drawn)


@pytest.mark.parametrize("name", SCHEMES)
@given(pair=distribution_pairs())
def test_optimum_is_the_brute_force_optimum_on_edge_cases(name, pair):
    scheme = get_draft_scheme(name)
    target, draft = pair
    assume(not ratio_overflows(*(row[0] for row in as_target_and_draft(target, draft))))
    for num_drafts in draft_counts(scheme, draft):
        try:
            optimum = scheme.optimum(target, draft, num_drafts).acceptance[0]
        except ValueError as error:  # the race quadrature (n ≥ 3) refuses subnormal masses, by name
            assert "draft_probs" in str(error) and "subnormal" in str(error)
            continue
        assert np.isfinite(optimum) and -TOLERANCE <= optimum <= 1 + TOLERANCE
        brute_force = scheme.optimum_bruteforce(target, draft, num_drafts).acceptance[0]
        assert optimum == pytest.approx(brute_force, abs=TOLERANCE)


def test_without_replacement_optimum_beside_a_subnormal_rest():
    """q(top)²/(1 − q(top)) overflowed beside a rest of 1e-310, and α* was NaN; both drafts
    are always the two tokens, so α* = 1."""
    optimum = get_draft_scheme("without_replacement").optimum([0.0, 1.0], [1.0, 1e-310], 2).acceptance[0]
    assert optimum == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_without_replacement_sampler_never_draws_a_token_of_zero_probability(backend):
    """A tiny q's arrival E/q overflows to ∞ (1e-44 in float32, 5e-324 in float64) and tied
    with the tokens of zero probability, which then came out as drafts."""
    scheme = get_draft_scheme("without_replacement")
    tiny = 5e-324 if backend == "numpy" else 1e-44
    for row in ([tiny, 0.0, 0.0, 1.0], [1.0] + [0.0] * 20 + [tiny]):
        if backend == "numpy":
            row = np.array(row)
            drawn = scheme.sample(np.tile(row, (200, 1)), 2, np.random.default_rng(0))
        else:
            row = torch.tensor(row, dtype=torch.float32)
            drawn = scheme.sample_torch(row.repeat(200, 1), 2, torch.Generator().manual_seed(0)).numpy()
            row = row.numpy()
        assert np.all(row[drawn] > 0)


def test_scan_order_keeps_the_order_of_overflowing_ratios():
    """p/q with q subnormal overflows to ∞: it was tied with the tokens of q = 0 and with the
    other overflowing ratios (then in id order), so the prefix scan missed the minimising prefix."""
    scheme = get_draft_scheme("without_replacement")
    for target, draft in [
        ([0.17, 0.24, 0.13, 0.3726, 0.0248, 0.0626], [0.0, 0.0, 0.0, 0.0, 1.0, 1e-310]),  # tokens 4, 5 always
        ([0.536, 0.464, 0.0], [1e-310, 1e-310, 1.0]),  # H* = {2, 1}: token 1 before token 0
    ]:
        assert scheme.optimum(target, draft, 2).acceptance[0] == pytest.approx(
            scheme.optimum_bruteforce(target, draft, 2).acceptance[0], abs=1e-12
        )


def test_scan_order_is_the_exact_order_of_the_ratios_beside_subnormal_draft_probabilities():
    """Against exact rational ratios: p/q ascending, q = 0 < p after every finite ratio,
    p = q = 0 last, ties in id order — in rows that overflow and rows that do not."""
    from fractions import Fraction

    from specbound.bounds.subset import scan_order

    rng = np.random.default_rng(7)
    values = [0.0, 5e-324, 1e-310, 2e-310, 1e-300, 0.25, 0.5, 0.5, 1.0]
    rows_p = rng.choice(values, size=(40, 7))
    rows_q = rng.choice(values, size=(40, 7))

    def rank(p, q, token):
        if q == 0:
            return (2 if p > 0 else 3, Fraction(0), token)
        return (1, Fraction(p) / Fraction(q), token)

    for p, q in zip(rows_p, rows_q):
        expected = sorted(range(len(p)), key=lambda token: rank(p[token], q[token], token))
        assert scan_order(p[None], q[None])[0].tolist() == expected
