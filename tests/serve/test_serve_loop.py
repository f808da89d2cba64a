"""The decoding loop in-process: a step that raises fails the requests of its batch only
(HTTP 500 in their responses), the other sampling setting's batch and later requests of the
same setting decode on; sampling settings are bounded while in use and released after;
admission fills every batch slot and queue place."""

from __future__ import annotations

import queue

import pytest

from tiny_pair import tiny_pair
from specbound.api import Speculator
from specbound.engine.processing import Sampling
from specbound.serve.batching import BatchingLoop, Failed, Finished, Job, Overloaded, SettingsBusy

VOCAB = 12
WAIT_SECONDS = 30


def job(temperature: float, seed: int, events: queue.Queue, max_tokens: int = 12) -> Job:
    return Job([5, 8], max_tokens, Sampling(temperature), seed, (), events.put)


def outcome(events: queue.Queue):
    while True:
        event = events.get(timeout=WAIT_SECONDS)
        if isinstance(event, (Finished, Failed)):
            return event


@pytest.fixture
def speculator():
    return Speculator(pair=tiny_pair())


def test_a_failing_step_fails_its_batch_only_and_the_loop_runs_on(speculator):
    faulty = Sampling(0.8)
    decoder, _ = speculator.decoder_for(faulty, "chain", {"gamma": 3})
    score, calls = decoder.target.score, []

    def fails_once(*arguments, **options):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("an injected fault")
        return score(*arguments, **options)

    decoder.target.score = fails_once
    loop = BatchingLoop(speculator, "chain", {"gamma": 3}, max_batch=4, max_queue=8)
    loop.start()
    try:
        failing, other = queue.Queue(), queue.Queue()
        loop.submit(job(0.8, 1, failing))
        loop.submit(job(0.5, 2, other))
        first = outcome(failing)
        assert isinstance(first, Failed) and first.status == 500
        assert isinstance(outcome(other), Finished)
        later = queue.Queue()
        loop.submit(job(0.8, 1, later))
        assert isinstance(outcome(later), Finished)
        assert loop.health()["running"] == 0 and not loop.health()["broken"]
    finally:
        loop.stop(10)


def test_a_sampling_setting_in_use_bounds_new_ones_and_is_released_when_its_requests_end(speculator):
    """Two settings in use (three requests, not yet decoding) with max_settings 2: a third
    setting is refused for now, a request of a setting in use is not; once the requests end,
    the third and a fourth setting are served one after the other, and no more than two
    settings' batches are kept."""
    loop = BatchingLoop(speculator, "chain", {"gamma": 3}, max_batch=4, max_queue=8, max_settings=2)
    first, second = queue.Queue(), queue.Queue()
    loop.submit(job(0.1, 0, first))
    loop.submit(job(0.2, 0, second))
    loop.submit(job(0.1, 1, second))  # a setting in use
    with pytest.raises(SettingsBusy):
        loop.submit(job(0.3, 0, queue.Queue()))
    loop.start()
    try:
        assert all(isinstance(outcome(events), Finished) for events in (first, second, second))
        assert loop.health()["settings"] == 0
        for temperature in (0.3, 0.4):
            later = queue.Queue()
            loop.submit(job(temperature, 0, later))
            assert isinstance(outcome(later), Finished)
            assert loop.health()["groups"] == 2
        assert loop.health()["settings"] == 0
    finally:
        loop.stop(10)


@pytest.mark.parametrize("max_queue", [0, 3])
def test_every_free_batch_slot_and_queue_place_is_taken_before_a_refusal(speculator, max_queue):
    """Admission counts the free batch slots, not only the queue: max_batch + max_queue
    requests are taken (max_queue 0: none waits), the next is refused."""
    loop = BatchingLoop(speculator, "chain", {"gamma": 3}, max_batch=4, max_queue=max_queue)
    events = queue.Queue()
    for seed in range(4 + max_queue):
        loop.submit(job(0.5, seed, events))
    with pytest.raises(Overloaded):
        loop.submit(job(0.5, 99, events))
