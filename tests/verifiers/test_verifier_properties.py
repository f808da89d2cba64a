"""Property-based tests (hypothesis) of every registered per-node verifier, on generated
(target, draft) pairs that include the edge cases where floating point and 0/0 bite:
disjoint supports, point masses on either side, p = q exactly and up to one ulp, a draft
token with a tiny (down to subnormal) probability, a dominant token stored as 1.0 beside
tiny ones, and rows that sum to 1 only within float32 rounding.

For every verifier, number of drafts (n ≤ 3) and pair (V ≤ 6), by enumerating the draft
scheme's joint law D:
- the exact output law is a distribution, finite, zero where the target is zero, and
  Σ_x̄ D(x̄) π(·|x̄) = p for a lossless verifier (the verifier's own marginal law for a
  biased one);
- the exact acceptance is finite, in [0, 1], equals the enumerated P(y ∈ x̄), and is at
  most α* of its scheme (+1e-9) when the verifier is lossless;
- ``verify_with_uniforms`` never emits a token the target gives probability 0 (lossless
  verifiers), and the torch path emits the same tokens from the same uniforms.
The profile (``tests/conftest.py``) is derandomised with a fixed number of examples.
Letters: p = target, q = draft (SPEC.md §0).
"""

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from support.edge_cases import EXACT_KINDS, distribution_pairs
from specbound.bounds.subset import bruteforce_optimum
from specbound.probability import as_target_and_draft
from specbound.verifiers import VERIFIERS, get_verifier

TOLERANCE = 1e-9


def per_node_verifiers(small=False):
    """Every registered per-node verifier, the LP one for each draft scheme when ``small``."""
    verifiers = []
    for name, verifier_class in VERIFIERS.items():
        if not getattr(verifier_class, "per_node", True):
            continue
        if name == "optimal":
            if small:
                verifiers += [get_verifier(name, draft_scheme=scheme) for scheme in ("with_replacement", "greedy")]
        elif name == "decoding_uno":
            verifiers += [get_verifier(name, epsilon=0.05, resample=r) for r in ("target", "draft")]
        elif name == "decoding_opt":
            verifiers += [get_verifier(name, epsilon=epsilon) for epsilon in (0.0, 0.05)]
        else:
            verifiers.append(get_verifier(name))
    return verifiers


def draft_counts(verifier, draft, max_drafts=3):
    """The numbers of drafts to check: the verifier's own, capped for distinct-token schemes."""
    fixed = verifier.fixed_num_drafts or verifier.draft_scheme.fixed_num_drafts
    counts = [fixed] if fixed else range(1, max_drafts + 1)
    support = np.count_nonzero(draft)
    return [n for n in counts if not (verifier.draft_scheme.needs_distinct_support and n > support)]


def enumerated(verifier, target, draft, num_drafts):
    """(tuples [K, n], D [K], π(·|x̄) [K, V], π(x̄|x̄) [K]) over the scheme's joint law."""
    tuples, tuple_probs = verifier.draft_scheme.joint_law(draft, num_drafts)
    rows = len(tuples)
    laws = verifier.output_law(np.tile(target, (rows, 1)), np.tile(draft, (rows, 1)), tuples)
    hits = np.zeros(rows)
    for i in range(num_drafts):
        is_new = np.all(tuples[:, :i] != tuples[:, i : i + 1], axis=1)
        hits += np.where(is_new, laws[np.arange(rows), tuples[:, i]], 0.0)
    return tuples, tuple_probs, laws, hits


def check_exact_laws(verifier, target_probs, draft_probs, num_drafts):
    target, draft = (row[0] for row in as_target_and_draft(target_probs, draft_probs))
    tuples, tuple_probs, laws, hits = enumerated(verifier, target_probs, draft_probs, num_drafts)
    assert np.all(np.isfinite(laws)), "output_law is not finite"
    assert np.all(laws >= 0)
    np.testing.assert_allclose(laws.sum(axis=1), 1.0, atol=TOLERANCE, rtol=0)
    expected = target if verifier.lossless else verifier.output_distribution(target_probs, draft_probs)[0]
    if verifier.lossless:
        assert np.all(laws[:, target == 0] == 0), "output_law puts mass on a token the target rules out"
    np.testing.assert_allclose(tuple_probs @ laws, expected, atol=TOLERANCE, rtol=0)

    acceptance = verifier.acceptance_rate(target_probs, draft_probs, num_drafts)[0]
    assert np.isfinite(acceptance) and -TOLERANCE <= acceptance <= 1 + TOLERANCE
    assert acceptance == pytest.approx(tuple_probs @ hits, abs=TOLERANCE)
    try:
        optimum = verifier.optimum(target_probs, draft_probs, num_drafts)[0]
    except ValueError as error:  # the race quadrature (n ≥ 3) refuses subnormal masses, by name
        assert "draft_probs" in str(error) and "subnormal" in str(error)
        return
    assert np.isfinite(optimum) and -TOLERANCE <= optimum <= 1 + TOLERANCE
    # α* = 1 + min over H of p(H) − Q(H), Q from the enumerated joint law: every subset tried
    assert optimum == pytest.approx(bruteforce_optimum(target, tuples, tuple_probs)[0], abs=TOLERANCE)
    if verifier.lossless:
        assert acceptance <= optimum + TOLERANCE


def check_sampling_paths(verifier, target_probs, draft_probs, num_drafts, seed):
    """Three rows of uniforms per draft tuple of the joint law: random, all 0, and all the
    largest double below 1. Neither path emits a token the target rules out, and the two
    agree draw for draw on the random rows. (The extremes pick the first or last token of
    positive weight, so a residual entry of 1e-25 that is rounding in one path and 0 in
    the other — numpy and torch sum in different orders — parts them there, and 1 − 2⁻⁵³
    rejects a ratio p/q one ulp below 1.) The numpy path renormalises the rows it is given and a native torch
    path takes them as they are, so it gets the rows the numpy path computes with, bit for
    bit; a verifier without one runs the numpy path on the rows it is given."""
    target, draft = (row[0] for row in as_target_and_draft(target_probs, draft_probs))
    torch_rows = (target, draft) if verifier.native_torch() else (target_probs, draft_probs)
    tuples = np.repeat(verifier.draft_scheme.joint_law(draft, num_drafts)[0], 3, axis=0)
    rows = len(tuples)
    uniforms = np.random.default_rng(seed).random((rows, num_drafts + 1))
    uniforms[1::3] = 0.0
    uniforms[2::3] = np.nextafter(1.0, 0.0)
    reference = verifier.verify_with_uniforms(
        np.tile(target_probs, (rows, 1)), np.tile(draft_probs, (rows, 1)), tuples, uniforms
    )
    fast = verifier.verify_torch_with_uniforms(
        *(torch.tensor(np.tile(row, (rows, 1))) for row in torch_rows), torch.tensor(tuples), torch.tensor(uniforms),
    )
    if verifier.lossless:
        assert np.all(target[reference.tokens] > 0), "verify emitted a token of target probability 0"
        assert np.all(target[fast.tokens.numpy()] > 0), "verify_torch emitted a token of target probability 0"
    same = np.arange(rows) % 3 == 0
    np.testing.assert_array_equal(fast.tokens.numpy()[same], reference.tokens[same])
    np.testing.assert_array_equal(fast.accepted.numpy()[same], reference.accepted[same])


SCALABLE = per_node_verifiers()
SMALL = [verifier for verifier in per_node_verifiers(small=True) if verifier not in SCALABLE]


def verifier_id(verifier):
    return verifier.name + "".join(f"-{key}={value}" for key, value in vars(verifier).items())


@pytest.mark.parametrize("verifier", SCALABLE, ids=verifier_id)
@given(pair=distribution_pairs())
def test_exact_output_law_and_acceptance_on_edge_cases(verifier, pair):
    target, draft = pair
    for num_drafts in draft_counts(verifier, draft):
        check_exact_laws(verifier, target, draft, num_drafts)


@pytest.mark.parametrize("verifier", SCALABLE, ids=verifier_id)
@given(pair=distribution_pairs(), seed=st.integers(0, 2**16))
def test_verify_and_its_torch_path_on_edge_cases(verifier, pair, seed):
    target, draft = pair
    for num_drafts in draft_counts(verifier, draft):
        check_sampling_paths(verifier, target, draft, num_drafts, seed)


@pytest.mark.parametrize("verifier", SMALL, ids=verifier_id)
@settings(max_examples=8)
@given(pair=distribution_pairs(max_vocab=4, kinds=EXACT_KINDS, concentrations=(1.0, 5.0)), seed=st.integers(0, 2**16))
def test_optimal_verifier_on_edge_cases(verifier, pair, seed):
    """The LP verifier, one solve per row: V ≤ 4, n ≤ 2, few examples, and only on pairs
    whose draft tuples all have probability ≥ 1e-6: the LP's coupling is exact to its
    solver's tolerance only, and the conditional law of a rarer tuple can be a row of
    zeros (``test_verifiers.py::test_optimal_verifier_law_beside_a_rare_draft_tuple``)."""
    target, draft = pair
    assume(np.all((draft == 0) | (draft >= 1e-3)))
    for num_drafts in draft_counts(verifier, draft, max_drafts=2):
        check_exact_laws(verifier, target, draft, num_drafts)
        check_sampling_paths(verifier, target, draft, num_drafts, seed)
