"""The decoding loop in-process: a step that raises fails the requests of its batch only
(HTTP 500 in their responses); the other sampling setting's batch and later requests of the
same setting decode on."""

from __future__ import annotations

import queue

import pytest

from tiny_pair import tiny_pair
from specbound.api import Speculator
from specbound.engine.processing import Processing
from specbound.serve.batching import BatchingLoop, Failed, Finished, Job, TooManySettings

VOCAB = 12
WAIT_SECONDS = 30


def job(temperature: float, seed: int, events: queue.Queue, max_tokens: int = 12) -> Job:
    return Job([5, 8], max_tokens, Processing(temperature, vocab_size=VOCAB), seed, (), events.put)


def outcome(events: queue.Queue):
    while True:
        event = events.get(timeout=WAIT_SECONDS)
        if isinstance(event, (Finished, Failed)):
            return event


@pytest.fixture
def speculator():
    return Speculator(pair=tiny_pair())


def test_a_failing_step_fails_its_batch_only_and_the_loop_runs_on(speculator):
    faulty = Processing(0.8, vocab_size=VOCAB)
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


def test_sampling_settings_beyond_the_limit_are_refused(speculator):
    loop = BatchingLoop(speculator, "chain", {"gamma": 3}, max_batch=4, max_queue=8, max_settings=2)
    events = queue.Queue()
    loop.submit(job(0.1, 0, events))
    loop.submit(job(0.2, 0, events))
    loop.submit(job(0.1, 1, events))  # a setting it has
    with pytest.raises(TooManySettings):
        loop.submit(job(0.3, 0, events))
