"""The decoding loop in-process: requests of any number of sampling settings decode in one
batch of one decoder, each getting the tokens of its solo run; the cache entries reserved are
bounded (a request beyond them refused for now, one alone always taken) and freed when
requests end; a step that raises fails the requests decoding in it (HTTP 500 in their
responses), and the waiting and later requests decode on; admission fills every batch slot
and queue place."""

from __future__ import annotations

import gc
import queue

import pytest
import torch

from support.chat_pair import tiny_pair
from specbound.api import Speculator
from specbound.engine.backends.torch import CausalLM
from specbound.engine.decode import Decoder
from specbound.engine.processing import Sampling
from specbound.serve.batching import BatchingLoop, CacheFull, Failed, Finished, Job, Overloaded

VOCAB = 12
WAIT_SECONDS = 30
CHAIN = {"gamma": 3}


def job(temperature: float, seed: int, events: queue.Queue, max_tokens: int = 12, top_k=None, top_p=None) -> Job:
    return Job([5, 8], max_tokens, Sampling(temperature, top_k, top_p), seed, (), events.put)


def outcome(events: queue.Queue):
    while True:
        event = events.get(timeout=WAIT_SECONDS)
        if isinstance(event, (Finished, Failed)):
            return event


@pytest.fixture
def speculator():
    return Speculator(pair=tiny_pair())


def held(speculator) -> tuple[int, int]:
    """Decoders and language models (each with its caches) alive over ``speculator``'s pair."""
    gc.collect()
    models = (speculator.pair.target, speculator.pair.draft)
    objects = gc.get_objects()
    decoders = [item for item in objects if type(item) is Decoder and item.target.model is models[0]]
    lms = [item for item in objects if type(item) is CausalLM and any(item.model is model for model in models)]
    return len(decoders), len(lms)


def test_distinct_sampling_settings_share_one_decoder_and_its_caches(speculator):
    """Twelve requests, each with a sampling setting of its own, one after the other: the
    server holds one decoder and its two language models after the last, as after the first."""
    loop = BatchingLoop(speculator, "chain", CHAIN, max_batch=4, max_queue=8)
    loop.start()
    try:
        counts = []
        for index in range(12):
            events = queue.Queue()
            loop.submit(job(0.05 + 0.08 * index, index, events, max_tokens=4))
            assert isinstance(outcome(events), Finished)
            if index in (0, 11):
                counts.append(held(speculator))
        assert counts == [(1, 2)] * 2
        assert loop.health()["settings"] == loop.health()["cache_tokens"] == 0
    finally:
        loop.stop(10)


def test_a_batch_of_distinct_sampling_settings_gives_each_request_its_solo_tokens(speculator):
    """Five requests of five settings (greedy, top-k, top-p among them) decoded together in one
    batch get exactly the tokens each gets decoded alone with its own decoder (float32: the
    forward is batch-invariant)."""
    settings = [Sampling(0.0), Sampling(0.7), Sampling(1.3, top_k=4), Sampling(1.0, top_p=0.8), Sampling(0.9, 5, 0.9)]
    loop = BatchingLoop(speculator, "chain", CHAIN, max_batch=5, max_queue=0)
    streams = [queue.Queue() for _ in settings]
    for seed, (sampling, events) in enumerate(zip(settings, streams)):
        loop.submit(Job([5, 8, 9], 16, sampling, 100 + seed, (), events.put))
    loop.start()  # all five queued before the first step: they join the batch together
    try:
        together = [outcome(events).specbound["token_ids"] for events in streams]
    finally:
        loop.stop(10)
    solo = []
    for seed, sampling in enumerate(settings):
        alone = Speculator(pair=tiny_pair())
        decoder, plan = alone.decoder_for(sampling, "chain", CHAIN)
        generator = torch.Generator().manual_seed(100 + seed)
        solo.append(decoder.generate([5, 8, 9], plan, 16, generator).tokens)
    assert together == solo
    assert len({tuple(tokens) for tokens in solo}) > 1


def test_the_cache_bound_refuses_for_now_and_frees_what_ended(speculator):
    """max_cache_tokens 40: a request reserving 18 entries (2 prompt tokens, 12 new, a chain
    of 3 below its root) is taken, a second one too, a third refused (54 > 40) until one ends;
    a request needing more than the bound alone is taken when nothing else is reserved."""
    loop = BatchingLoop(speculator, "chain", CHAIN, max_batch=4, max_queue=8, max_cache_tokens=40)
    first, second = queue.Queue(), queue.Queue()
    loop.submit(job(0.5, 0, first))
    assert loop.health()["cache_tokens"] == 18
    loop.submit(job(0.6, 0, second))
    with pytest.raises(CacheFull, match="36 of its 40 cache entries.*needs 18"):
        loop.submit(job(0.7, 0, queue.Queue()))
    loop.start()
    try:
        assert isinstance(outcome(first), Finished) and isinstance(outcome(second), Finished)
        assert loop.health()["cache_tokens"] == 0
        large = queue.Queue()
        loop.submit(job(0.7, 0, large, max_tokens=60))
        assert loop.health()["cache_tokens"] == 66
        with pytest.raises(CacheFull):
            loop.submit(job(0.7, 1, queue.Queue(), max_tokens=1))
        assert isinstance(outcome(large), Finished) and loop.health()["cache_tokens"] == 0
    finally:
        loop.stop(10)


def test_a_failing_step_fails_its_requests_only_and_the_loop_runs_on(speculator):
    """One slot: the request in the failing step gets 500, the waiting one of another setting
    and a later one of the same are served."""
    loop = BatchingLoop(speculator, "chain", CHAIN, max_batch=1, max_queue=8)
    score, calls = loop.decoder.target.score, []

    def fails_once(*arguments, **options):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("an injected fault")
        return score(*arguments, **options)

    loop.decoder.target.score = fails_once
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
