"""Properties of the optimal acceptance α* (SPEC §4.2): the LP, the brute-force subset
formula and the fast prefix scan agree with SPEC §4.4's fixtures and with each other."""

import numpy as np
import pytest

from instances import FIXTURE_A, FIXTURE_B, random_pair
from specbound.bounds import (
    MAX_LP_VARIABLES,
    optimal_acceptance_bruteforce,
    optimal_acceptance_lp,
    optimal_coupling,
)
from specbound.drafts import get_draft_scheme

FIXTURES = {"A": FIXTURE_A, "B": FIXTURE_B}
FIXTURE_OPTIMUM = {
    # (fixture, scheme, n): the α* rows of SPEC §4.4 (spechub = greedy with n = 2)
    ("A", "with_replacement", 2): 0.790000,
    ("A", "with_replacement", 3): 0.871000,
    ("A", "without_replacement", 2): 0.834524,
    ("A", "without_replacement", 3): 1.000000,
    ("A", "greedy", 2): 0.766667,
    ("A", "greedy", 3): 0.933333,
    ("A", "spechub", 2): 0.766667,
    ("A", "with_replacement", 1): 0.600000,
    ("B", "with_replacement", 2): 1.0,
    ("B", "with_replacement", 3): 1.0,
    ("B", "without_replacement", 2): 1.0,
    ("B", "without_replacement", 3): 1.0,
    ("B", "greedy", 2): 1.0,
    ("B", "greedy", 3): 1.0,
    ("B", "with_replacement", 1): 0.800000,
}


@pytest.mark.parametrize(("fixture", "scheme", "num_drafts"), sorted(FIXTURE_OPTIMUM))
def test_lp_and_bruteforce_match_spec_fixtures(fixture, scheme, num_drafts):
    target, draft = FIXTURES[fixture]
    expected = FIXTURE_OPTIMUM[fixture, scheme, num_drafts]
    lp = optimal_acceptance_lp(target, draft, num_drafts, scheme)
    brute = optimal_acceptance_bruteforce(target, draft, num_drafts, scheme)
    assert lp[0] == pytest.approx(expected, abs=1e-6)
    assert brute.acceptance[0] == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("scheme", ["with_replacement", "without_replacement", "greedy"])
def test_optimal_coupling_has_the_right_marginals_and_value(rng, scheme):
    for _ in range(5):
        target, draft = random_pair(rng, 6)
        tuples, tuple_probs = get_draft_scheme(scheme).joint_law(draft, 3)
        coupling, acceptance = optimal_coupling(target, tuples, tuple_probs)
        assert np.all(coupling >= 0)
        np.testing.assert_allclose(coupling.sum(axis=1), tuple_probs, atol=1e-9)
        np.testing.assert_allclose(coupling.sum(axis=0), target, atol=1e-9)
        hits = np.zeros_like(coupling)
        np.put_along_axis(hits, tuples, 1.0, axis=1)
        assert (coupling * hits).sum() == pytest.approx(acceptance, abs=1e-9)


def test_lp_equals_bruteforce_on_random_instances(rng):
    """Strong duality of the OT LP (SPEC §4.2): LP optimum = subset formula."""
    for scheme in ["with_replacement", "without_replacement", "greedy", "spechub"]:
        for trial in range(20):
            vocab = int(rng.integers(3, 7))
            target, draft = random_pair(rng, vocab, concentration=[0.3, 1.0, 3.0][trial % 3])
            num_drafts = 2 if scheme == "spechub" else int(rng.integers(1, 4))
            lp = optimal_acceptance_lp(target, draft, num_drafts, scheme)
            brute = optimal_acceptance_bruteforce(target, draft, num_drafts, scheme)
            assert lp[0] == pytest.approx(brute.acceptance[0], abs=1e-8), (scheme, target, draft)


def test_bruteforce_certificate_attains_the_minimum(rng):
    target, draft = random_pair(rng, 5)
    result = optimal_acceptance_bruteforce(target, draft, 2, "with_replacement")
    subset = result.optimal_subset[0]
    assert result.acceptance[0] == pytest.approx(
        1 + target[subset].sum() - draft[subset].sum() ** 2, abs=1e-12
    )


def test_optimal_coupling_refuses_a_too_large_lp():
    vocab = 200
    tuples = np.array([[x, y] for x in range(vocab) for y in range(vocab)])
    assert len(tuples) * vocab > MAX_LP_VARIABLES
    with pytest.raises(ValueError, match="variables"):
        optimal_coupling(np.full(vocab, 1 / vocab), tuples, np.full(len(tuples), 1 / len(tuples)))


def test_bruteforce_refuses_a_large_vocabulary():
    with pytest.raises(ValueError, match="2\\^V"):
        optimal_acceptance_bruteforce(np.full(20, 0.05), np.full(20, 0.05), 2, "with_replacement")


@pytest.mark.parametrize(
    ("target", "draft", "num_drafts", "scheme", "message"),
    [
        ([0.5, 0.6], [0.5, 0.5], 2, "with_replacement", "target_probs: rows must sum"),
        ([0.5, 0.5], [0.2, 0.3, 0.5], 2, "with_replacement", "vocabulary size"),
        ([0.5, 0.5], [0.5, 0.5], 0, "with_replacement", "num_drafts"),
        ([0.5, 0.5], [0.5, 0.5], 3, "without_replacement", "num_drafts"),
        ([0.5, 0.5], [0.5, 0.5], 3, "spechub", "num_drafts"),
        ([0.5, 0.5], [0.5, 0.5], 2, "no_such_scheme", "scheme"),
    ],
)
def test_lp_and_bruteforce_reject_bad_input(target, draft, num_drafts, scheme, message):
    for solver in (optimal_acceptance_lp, optimal_acceptance_bruteforce):
        with pytest.raises(ValueError, match=message):
            solver(target, draft, num_drafts, scheme)
