"""The optimum per request (``engine.optimum``): each verified position's exact acceptance
and α* recorded beside the run, never changing its tokens."""

import math
import time

import numpy as np
import pytest
import torch

from engine_fixtures import EOS
from specbound.engine import CausalLM, Decoder, ModelDrafter, Processing, build_method
from specbound.engine.optimum import OptimumRecorder, OptimumTally

PROMPT = [1, 2, 3]


def decoder_of(target_model, draft_model, processing, budget=math.inf):
    """A decoder that computes the figures at every verified position (no time budget: the
    tiny models decode far faster than a 6-token row's optimum is solved)."""
    decoder = Decoder(CausalLM(target_model), ModelDrafter(CausalLM(draft_model), processing), processing, (EOS,))
    decoder.optimum.budget = budget
    return decoder


def run(decoder, method, seeds=range(12), max_new_tokens=12):
    return [decoder.generate(PROMPT, method, max_new_tokens, torch.Generator().manual_seed(seed)) for seed in seeds]


def test_a_chain_sits_at_its_optimum_and_its_mean_acceptance_matches_the_measured(target_model, draft_model):
    """One draft: speculative sampling is optimal, gap 0 at every position; the measured
    acceptance estimates the mean exact acceptance (both over the same verifications)."""
    decoder = decoder_of(target_model, draft_model, Processing(0.8))
    generations = run(decoder, build_method("chain", gamma=3), seeds=range(40))
    tally = generations[0].stats.optimum
    for generation in generations[1:]:
        tally = tally.merge(generation.stats.optimum)
    summary = tally.summary()
    assert summary["computed"] == summary["positions"] == sum(
        sum(generation.stats.attempts_by_position) for generation in generations)
    assert np.allclose(tally.acceptances, tally.optima, atol=1e-9) and abs(summary["acceptance_gap"]) < 1e-9
    measured = sum(sum(g.stats.accepts_by_position) for g in generations) / summary["positions"]
    spread = np.sqrt(np.mean(tally.acceptances) * (1 - np.mean(tally.acceptances)) / summary["positions"])
    assert abs(measured - summary["expected_acceptance"]) < 4.5 * spread


def test_a_tree_records_an_optimum_at_or_above_its_acceptance(target_model, draft_model):
    decoder = decoder_of(target_model, draft_model, Processing(0.8))
    generation = run(decoder, build_method("tree", num_drafts=2, depth=2))[0]
    tally = generation.stats.optimum
    assert tally.positions > 0 and len(tally.acceptances) == tally.positions
    assert all(best >= acceptance - 1e-9 for acceptance, best in zip(tally.acceptances, tally.optima))
    assert generation.stats.optimum.summary()["standard_error"]["acceptance_gap"] == 0.0
    assert "optimum" not in generation.stats.to_dict()  # timed: kept out of the records that must repeat


def test_a_decoder_records_nothing_until_given_a_budget(target_model, draft_model):
    processing = Processing(0.8)
    decoder = Decoder(CausalLM(target_model), ModelDrafter(CausalLM(draft_model), processing), processing, (EOS,))
    tally = run(decoder, build_method("chain", gamma=3), seeds=range(2))[0].stats.optimum
    assert tally.positions > 0 and not tally.acceptances


class SlowVerifier:
    """A verifier's acceptance and α* that take ``seconds`` each."""

    def __init__(self, verifier, seconds):
        self.verifier, self.seconds = verifier, seconds

    def acceptance_rate(self, *args):
        time.sleep(self.seconds)
        return self.verifier.acceptance_rate(*args)

    def optimum(self, *args):
        return self.verifier.optimum(*args)


def test_a_costly_optimum_is_sampled_within_the_budget_and_reports_a_standard_error():
    from specbound.verifiers import get_verifier

    recorder, tally = OptimumRecorder(budget=0.1, seed=0), OptimumTally()
    verifier = SlowVerifier(get_verifier("single"), seconds=0.002)
    target, draft = torch.tensor([[0.6, 0.4]]), torch.tensor([[0.3, 0.7]])
    for _ in range(200):
        time.sleep(0.002)  # decoding between verifications: as long as one computation
        recorder.record(tally, verifier, target, draft, 1)
    assert tally.positions == 200 and 5 <= len(tally.acceptances) <= 60  # about 10%
    assert tally.seconds < 0.2 * recorder.decoding_seconds
    summary = tally.summary()
    assert summary["expected_acceptance"] == pytest.approx(0.7)
    assert summary["standard_error"]["expected_acceptance"] == pytest.approx(0.0, abs=1e-12)  # every value 0.7


def test_recording_never_changes_the_tokens(target_model, draft_model):
    processing = Processing(0.8)
    method = build_method("tree", num_drafts=2, depth=2)
    recorded = run(decoder_of(target_model, draft_model, processing), method, seeds=range(4))
    skipping = decoder_of(target_model, draft_model, processing, budget=0.0)
    unrecorded = run(skipping, method, seeds=range(4))
    assert [g.tokens for g in recorded] == [g.tokens for g in unrecorded]
    assert all(not g.stats.optimum.acceptances and g.stats.optimum.positions for g in unrecorded)


def test_a_run_without_verified_positions_has_no_figures():
    summary = OptimumTally().summary()
    assert summary["expected_acceptance"] is None and summary["positions"] == 0
