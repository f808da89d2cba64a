"""Draft schemes: exact joint laws are distributions with the right marginal structure,
and the numpy and torch samplers follow them (χ² at level 0.001)."""


import numpy as np
import pytest
import torch
from scipy import stats

from support.instances import random_pair
from specbound.drafts import DRAFT_SCHEMES, get_draft_scheme
from specbound.drafts.greedy import greedy_optimum, restricted_draft
from specbound.probability import top_tokens

SIGNIFICANCE = 1e-3
SCHEMES_AND_N = [("with_replacement", 2), ("without_replacement", 3), ("greedy", 3), ("spechub", 2)]


def tuple_counts(tokens, tuples):
    index = {tuple(t): k for k, t in enumerate(tuples.tolist())}
    counts = np.zeros(len(tuples))
    for row in map(tuple, tokens.tolist()):
        assert row in index, f"sampled tuple {row} has probability zero under the joint law"
        counts[index[row]] += 1
    return counts


@pytest.mark.parametrize(("scheme", "num_drafts"), SCHEMES_AND_N)
def test_joint_law_is_a_distribution_on_the_draft_support(scheme, num_drafts, rng):
    _, draft = random_pair(rng, 6)
    tuples, probs = get_draft_scheme(scheme).joint_law(draft, num_drafts)
    assert probs.sum() == pytest.approx(1.0, abs=1e-12)
    assert np.all(draft[tuples] > 0)


def test_without_replacement_first_draft_follows_the_draft(rng):
    _, draft = random_pair(rng, 6)
    tuples, probs = get_draft_scheme("without_replacement").joint_law(draft, 3)
    np.testing.assert_allclose(np.bincount(tuples[:, 0], probs, minlength=6), draft, atol=1e-12)


def test_spechub_and_greedy_share_the_pair_set_law(rng):
    _, draft = random_pair(rng, 6)
    laws = []
    for scheme in ("greedy", "spechub"):
        tuples, probs = get_draft_scheme(scheme).joint_law(draft, 2)
        law = {}
        for pair, prob in zip(map(frozenset, tuples.tolist()), probs):
            law[pair] = law.get(pair, 0.0) + prob
        laws.append(law)
    assert laws[0].keys() == laws[1].keys()
    for pair in laws[0]:
        assert laws[0][pair] == pytest.approx(laws[1][pair], abs=1e-12)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize(("scheme", "num_drafts"), SCHEMES_AND_N)
def test_sampler_follows_the_joint_law(scheme, num_drafts, backend):
    rng = np.random.default_rng(5)
    _, draft = random_pair(rng, 6, zeros=True)
    tuples, probs = get_draft_scheme(scheme).joint_law(draft, num_drafts)
    samples = 60_000
    batch = np.tile(draft, (samples, 1))
    if backend == "numpy":
        tokens = get_draft_scheme(scheme).sample(batch, num_drafts, rng)
    else:
        generator = torch.Generator().manual_seed(5)
        tokens = get_draft_scheme(scheme).sample_torch(torch.tensor(batch), num_drafts, generator).numpy()
    counts = tuple_counts(tokens, tuples)
    assert stats.chisquare(counts, samples * probs).pvalue > SIGNIFICANCE


def test_greedy_breaks_ties_towards_the_lower_token():
    draft = np.array([0.1, 0.3, 0.3, 0.3])
    tuples, _ = get_draft_scheme("greedy").joint_law(draft, 3)
    assert set(map(tuple, tuples[:, :2].tolist())) == {(1, 2)}
    torch_top = get_draft_scheme("greedy").sample_torch(torch.tensor(draft[None]), 3, torch.Generator().manual_seed(0))
    assert torch_top[0, :2].tolist() == [1, 2]


def test_greedy_optimum_is_its_numpy_formula_bit_for_bit(rng):
    """The compiled closed form gives what the formula gives in numpy, to the last bit, with
    its certificate: rows with ties and zeros, long rows (sums over several pairwise levels)
    and top sets of up to 5 tokens (their target mass summed in numpy's order too)."""
    for vocab, num_drafts in [(5, 2), (40, 3), (300, 4), (5000, 6), (70_000, 6)]:
        draft = rng.dirichlet(np.full(vocab, 0.3), size=4)
        levels = rng.integers(0, 4, vocab)  # ties and zeros, but n tokens of positive probability
        levels[:num_drafts] = np.maximum(levels[:num_drafts], 1)
        draft[0] = levels / levels.sum()
        target = rng.dirichlet(np.full(vocab, 0.3), size=4)
        top = top_tokens(draft, num_drafts - 1)
        np.put_along_axis(target[2:], top[2:], rng.random((2, num_drafts - 1)), axis=1)  # p(T) of its own order
        target[2:] /= target[2:].sum(axis=1, keepdims=True)
        target[1] = restricted_draft(draft, top)[1][1]  # p = q′: no loss, an empty certificate
        optimum = greedy_optimum(target, draft, top)
        in_top, rest_draft = restricted_draft(draft, top)
        shortfall = np.where(in_top, 0.0, np.maximum(rest_draft - target, 0.0))
        loss = shortfall.sum(axis=1) - np.where(in_top, target, 0.0).sum(axis=1)
        assert optimum.acceptance.tolist() == (1.0 - np.maximum(loss, 0.0)).tolist()
        np.testing.assert_array_equal(optimum.optimal_subset, (in_top | (shortfall > 0)) & (loss > 0)[:, None])
        assert not optimum.optimal_subset[1].any()


def test_with_replacement_all_in_mass_is_the_running_sum_to_the_n_bit_for_bit(rng):
    """Q(H_k) = q(H_k)^n from the compiled pass is numpy's running sum times itself n − 1
    times, to the last bit."""
    draft = rng.dirichlet(np.full(20_000, 0.3), size=3)
    inside = np.zeros((3, 20_001))
    np.cumsum(draft, axis=1, out=inside[:, 1:])
    expected = inside.copy()
    for num_drafts in range(1, 7):
        assert get_draft_scheme("with_replacement").all_in_mass(draft, num_drafts).tolist() == expected.tolist()
        expected *= inside


def test_a_joint_law_beyond_its_tuple_limit_is_refused_saying_the_limit_and_what_fits(monkeypatch):
    """support^n tuples above MAX_ENUMERATED_TUPLES, refused before enumerating, in words:
    how many tuples, the limit, and the n or the support that fits; a law of exactly the
    limit is listed (checked at a limit of 4^3, as listing 4^10 takes seconds)."""
    import specbound.drafts.base as base

    draft = np.full(4, 0.25)
    with monkeypatch.context() as patched:
        patched.setattr(base, "MAX_ENUMERATED_TUPLES", 4**3)
        assert len(get_draft_scheme("with_replacement").joint_law(draft, 3)[1]) == 4**3  # at the limit: listed
        with pytest.raises(ValueError, match="use n ≤ 3, or at n = 4 a draft of at most 2 tokens"):
            get_draft_scheme("with_replacement").joint_law(draft, 4)
    with pytest.raises(ValueError, match="lists every tuple") as refusal:
        get_draft_scheme("with_replacement").joint_law(draft, 12)
    message = str(refusal.value)
    assert "4^12 ≈ 1.7e7 tuples of the draft's 4 tokens of positive probability" in message
    assert "above the limit of 2,000,000 tuples" in message
    assert "use n ≤ 10, or at n = 12 a draft of at most 3 tokens of positive probability" in message


def test_bad_scheme_input_raises():
    with pytest.raises(ValueError, match="unknown draft scheme"):
        get_draft_scheme("beam")
    with pytest.raises(ValueError, match="only 2 tokens"):
        get_draft_scheme("without_replacement").sample([0.5, 0.5, 0.0], 3, np.random.default_rng(0))
    with pytest.raises(ValueError, match="n = 2 only"):
        get_draft_scheme("spechub").sample([0.5, 0.3, 0.2], 3, np.random.default_rng(0))
    with pytest.raises(ValueError, match="integer"):
        get_draft_scheme("with_replacement").sample([0.5, 0.5], 1.5, np.random.default_rng(0))
    assert set(DRAFT_SCHEMES) == {"with_replacement", "without_replacement", "greedy", "spechub"}
