"""Global Resolution (``specbound.verifiers.global_resolution``, SPEC.md §4.5): its acceptance
is α* with replacement — the coupling LP's value on small vocabularies, the prefix scan's at
V = 151,936 for n = 2..8 — on the edge families too; the ranks it hands out keep every slot's
mass, so one draft's rank is uniform; ``verify`` samples its exact output law. Losslessness by
enumeration and the torch path are held for every registered verifier in
``test_verifier_properties.py``. Letters: p = target, q = draft (SPEC.md §0).
"""

import numpy as np
import pytest
from hypothesis import given

from support.edge_cases import PAIR_KINDS, distribution_pairs
from specbound.bounds.subset import scan_order
from specbound.drafts import optimal_acceptance, optimal_acceptance_lp
from specbound.verifiers import get_verifier
from specbound.verifiers.global_resolution import ResolutionPlan

TOLERANCE = 1e-9
VERIFIER = get_verifier("global_resolution")


@pytest.mark.parametrize("num_drafts", [1, 2, 3, 4])
def test_global_resolution_acceptance_is_the_lp_optimum(num_drafts):
    rng = np.random.default_rng(41 + num_drafts)
    for _ in range(6):
        vocab = int(rng.integers(2, 6))
        target = rng.dirichlet(np.full(vocab, rng.choice([0.3, 1.0, 4.0])))
        draft = rng.dirichlet(np.full(vocab, rng.choice([0.3, 1.0, 4.0])))
        reached = VERIFIER.acceptance_rate(target[None], draft[None], num_drafts)[0]
        best = optimal_acceptance_lp(target[None], draft[None], num_drafts, "with_replacement")[0]
        assert reached == pytest.approx(best, abs=TOLERANCE)


def softmax_row(rng, vocab, scale):
    logits = rng.standard_normal(vocab) * scale
    weights = np.exp(logits - logits.max())
    return weights / weights.sum()


@pytest.mark.parametrize("num_drafts", range(2, 9))
def test_global_resolution_reaches_the_optimum_at_full_vocabulary(num_drafts):
    rng = np.random.default_rng(num_drafts)
    target = softmax_row(rng, 151_936, 3.0)
    draft = target ** 0.8 * np.exp(0.5 * rng.standard_normal(target.size))
    draft /= draft.sum()
    reached = VERIFIER.acceptance_rate(target[None], draft[None], num_drafts)[0]
    best = optimal_acceptance(target[None], draft[None], num_drafts, "with_replacement").acceptance[0]
    assert abs(reached - best) <= TOLERANCE
    assert best > get_verifier("kseq").acceptance_rate(target[None], draft[None], num_drafts)[0]


@given(pair=distribution_pairs(kinds=PAIR_KINDS))
def test_global_resolution_reaches_the_optimum_on_edge_cases(pair):
    target, draft = pair
    for num_drafts in (1, 2, 3):
        reached = VERIFIER.acceptance_rate(target[None], draft[None], num_drafts)[0]
        try:
            best = VERIFIER.optimum(target[None], draft[None], num_drafts)[0]
        except ValueError:  # the scheme's α* refuses subnormal masses, by name
            continue
        assert reached == pytest.approx(best, abs=TOLERANCE)


@given(pair=distribution_pairs(kinds=PAIR_KINDS))
def test_ranks_keep_every_slots_mass(pair):
    """Own length plus the lengths swapped into a slot give back q of that slot's token:
    the population of one draft's ranks stays uniform, whatever the exchanges."""
    target, draft = (row / row.sum() for row in pair)
    order = scan_order(target[None], draft[None])[0]
    for num_drafts in (2, 3):
        plan = ResolutionPlan(order, target, draft, num_drafts)
        mass = plan.own.copy()
        np.add.at(mass, plan.donor, plan.length)
        np.add.at(mass, plan.receiver, plan.length)
        np.testing.assert_allclose(mass, draft[order], rtol=1e-12, atol=1e-300)
        assert np.all(plan.own >= 0) and np.all(plan.length > 0)
        assert plan.length.size < 2 * target.size  # each swap ends a receiver's need or a donor's slack
        assert np.all(plan.accepted <= target[order])


def test_global_resolution_samples_its_output_law():
    rng = np.random.default_rng(7)
    target = np.array([0.05, 0.4, 0.3, 0.2, 0.05])
    draft = np.array([0.3, 0.1, 0.2, 0.25, 0.15])
    tokens = np.array([[0, 3, 0, 4]])
    law = VERIFIER.output_law(target[None], draft[None], tokens)[0]
    draws = 20_000
    emitted = VERIFIER.verify_with_uniforms(
        np.tile(target, (draws, 1)), np.tile(draft, (draws, 1)), np.tile(tokens, (draws, 1)), rng.random((draws, 5))
    ).tokens
    counts = np.bincount(emitted, minlength=target.size)
    standard_error = np.sqrt(law * (1 - law) / draws)
    assert np.all(np.abs(counts / draws - law) <= 4 * standard_error + 1e-12)


def test_an_inexact_accepted_mass_costs_acceptance_never_the_target_law(monkeypatch):
    """Whatever accepted mass ŷ ≤ min(p, z) a plan carries — here 0.7 of the optimal one, as a
    solve short of its optimum would — the emitted law is p exactly (SPEC.md §4.5, step 5)."""
    original = ResolutionPlan.__init__

    def shrunk(plan, *arguments):
        original(plan, *arguments)
        plan.accepted = 0.7 * plan.accepted

    monkeypatch.setattr(ResolutionPlan, "__init__", shrunk)
    rng = np.random.default_rng(3)
    scheme = VERIFIER.draft_scheme
    for num_drafts in (2, 3):
        target, draft = rng.dirichlet(np.ones(5)), rng.dirichlet(np.ones(5))
        tuples, probs = scheme.joint_law(draft, num_drafts)
        laws = VERIFIER.output_law(np.tile(target, (len(tuples), 1)), np.tile(draft, (len(tuples), 1)), tuples)
        np.testing.assert_allclose(probs @ laws, target, atol=1e-12, rtol=0)
        hits = sum(prob * law[np.unique(drafts)].sum() for prob, law, drafts in zip(probs, laws, tuples))
        assert hits < VERIFIER.optimum(target[None], draft[None], num_drafts)[0] - 0.05
