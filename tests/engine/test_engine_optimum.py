"""The optimum per request (``engine.optimum``): each verified position's exact acceptance
and α* recorded beside the run, never changing its tokens."""

import math
import time

import numpy as np
import pytest
import torch

from support.models import EOS
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


class Clock:
    """A stand-in for the recorder's clock (``time.perf_counter``), moved by hand."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class TimedVerifier:
    """A verifier whose acceptance costs ``seconds`` on ``clock`` (``first`` on its first call:
    compiling its loops), as the recorder times it."""

    def __init__(self, clock, seconds, first=None):
        from specbound.verifiers import get_verifier

        self.verifier, self.clock, self.seconds, self.first = get_verifier("single"), clock, seconds, first

    def acceptance_rate(self, *args):
        self.clock.advance(self.seconds if self.first is None else self.first)
        self.first = None
        return self.verifier.acceptance_rate(*args)

    def optimum(self, *args):
        return self.verifier.optimum(*args)


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr("specbound.engine.optimum.time", clock)
    return clock


ROWS = (torch.tensor([[0.6, 0.4]]), torch.tensor([[0.3, 0.7]]))


def serve_requests(recorder, verifier, clock, steps, step_seconds, idle_seconds=100.0, prefill_seconds=1.0):
    """Requests of ``steps`` verified positions each, ``step_seconds`` of decoding before each,
    ``idle_seconds`` between requests: (tallies, the requests' wall seconds)."""
    tallies, wall = [], 0.0
    for step_count in steps:
        clock.advance(idle_seconds)
        started = clock.now
        clock.advance(prefill_seconds)
        tally = OptimumTally()
        for _ in range(step_count):
            clock.advance(step_seconds)
            recorder.record(tally, verifier, *ROWS, 1)
        tallies.append(tally)
        wall += clock.now - started
    return tallies, wall


def test_slow_steps_count_as_decoding_and_idle_time_between_requests_does_not(clock):
    """Steps of 2 s (a loaded machine) are decoding time, so a computation of 0.02 s fits the
    10% budget at every position; 100 s idle between requests adds nothing."""
    recorder = OptimumRecorder(budget=0.1, seed=0)
    tallies, wall = serve_requests(recorder, TimedVerifier(clock, 0.02), clock, [22, 22], step_seconds=2.0)
    assert [len(tally.acceptances) for tally in tallies] == [22, 22]
    assert recorder.decoding_seconds == pytest.approx(2 * 21 * 2.0)  # each request from its first position on


def test_the_first_computation_s_compile_time_is_left_out_of_the_cost_estimate(clock):
    """A verifier's first call takes 5 s (its loops compile): the recorder warms it up
    outside the tallies and the estimate, so a second request computes as the first."""
    recorder = OptimumRecorder(budget=0.1, seed=0)
    verifier = TimedVerifier(clock, 0.01, first=5.0)
    tallies, _ = serve_requests(recorder, verifier, clock, [22, 22], step_seconds=0.2)
    assert recorder.warm_up_seconds == pytest.approx(5.0)
    assert all(len(tally.acceptances) == 22 and tally.seconds == pytest.approx(22 * 0.01) for tally in tallies)


@pytest.mark.parametrize("seed", range(3))
def test_the_time_spent_stays_within_the_budget_of_the_decoding_time(clock, seed):
    """A computation 4× a step's decoding time (the budget allows 1 position in 40): over
    many requests of every length, the seconds spent stay within 10% of the requests' wall
    time, up to one computation; every request computes at least one position."""
    recorder = OptimumRecorder(budget=0.1, seed=seed)
    steps = np.random.default_rng(seed).integers(1, 120, size=40)
    tallies, wall = serve_requests(recorder, TimedVerifier(clock, 0.2), clock, steps, step_seconds=0.05)
    spent = sum(tally.seconds for tally in tallies)
    assert spent <= 0.1 * wall + 0.2
    assert all(tally.acceptances for tally in tallies)
    assert sum(len(tally.acceptances) for tally in tallies) < 0.2 * sum(steps)  # sampled, not all computed


def test_sampled_means_are_weighted_by_the_chance_each_position_had():
    """A request's first position is always computed, the rest at a rate: weighting each by
    1/π makes the mean estimate the mean over every position (here: first 0.2, the rest 0.8,
    sampled at π = 0.1 → mean of 10 positions ≈ 0.74, not the unweighted 0.5)."""
    tally = OptimumTally([0.2, 0.8], [0.2, 0.8], [1.0, 10.0], [1.0, 1.0], positions=11)
    summary = tally.summary()
    assert summary["expected_acceptance"] == pytest.approx((0.2 + 10 * 0.8) / 11)
    assert summary["standard_error"]["expected_acceptance"] > 0


def test_the_gap_is_never_negative_where_rounding_puts_the_optimum_below_the_acceptance():
    acceptances = [0.5, 0.7, 0.61]
    optima = [0.5 - 4.6e-16, 0.7 - 3.7e-15, 0.75]  # α* ≥ acceptance exactly; rounding breaks the first two
    summary = OptimumTally(acceptances, optima, [1.0] * 3, [1.0] * 3, positions=3).summary()
    assert summary["acceptance_gap"] >= 0 and summary["optimal_acceptance"] >= summary["expected_acceptance"]
    assert summary["acceptance_gap"] == pytest.approx(0.14 / 3)
    lone = OptimumTally([0.5], [0.5 - 4.6e-16], [1.0], [1.0], positions=1).summary()
    assert lone["acceptance_gap"] == 0.0 and lone["optimal_acceptance"] == lone["expected_acceptance"]


def test_two_requests_in_one_process_both_compute_their_figures(target_model, draft_model):
    """The recorder a ``Speculator``'s decoders get (``BUDGET``): a second request computes
    as the first did."""
    from specbound.engine.optimum import BUDGET

    decoder = decoder_of(target_model, draft_model, Processing(0.8), budget=BUDGET)
    first, second = run(decoder, build_method("chain", gamma=3), seeds=range(2), max_new_tokens=24)
    for generation in (first, second):
        assert generation.stats.optimum.summary()["computed"] > 0
