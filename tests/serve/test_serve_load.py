"""One server under mixed load for a bounded time: normal requests (streaming and not,
completions and chat) interleaved with bodies over the size limit or prompts far over the
context, clients that disconnect mid-request and requests each with a sampling setting never
seen before. Every normal request is answered whole; every other gets its expected answer (413 or 400; 200) or none
(it left); nothing answers 500; ``/health``, probed all along, answers every time in under
0.1 s; afterwards nothing is left running, waiting or reserved in the cache, and the server's
resident memory is within 10% of what it was after a warm-up."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest

from support.serving import LIMIT_BODY_BYTES, MODEL

FAST_SECONDS, SLOW_SECONDS, WARM_UP_SECONDS = 12, 60, 3
NORMAL_CLIENTS = 3  # with one of each other kind, within --max-batch 4 --max-queue 4
HEALTH_SECONDS = 0.1
HEALTH_EVERY = 0.05
MEMORY_GROWTH = 0.10
PROMPTS = ["red cat", "blue dog runs", "green", "cat sleeps dog"]


async def normal(http: httpx.AsyncClient, number: int) -> None:
    """One normal request, answered whole (or an AssertionError)."""
    max_tokens = 4 + number % 9
    body = {"model": MODEL, "max_tokens": max_tokens, "seed": number, "stream": number % 2 == 0}
    if number % 3:
        body["prompt"] = PROMPTS[number % len(PROMPTS)]
        path = "/v1/completions"
    else:
        body["messages"] = [{"role": "user", "content": PROMPTS[number % len(PROMPTS)]}]
        path = "/v1/chat/completions"
    if not body["stream"]:
        response = await http.post(path, json=body)
        assert response.status_code == 200, response.text
        reply = response.json()
        assert reply["choices"][0]["finish_reason"] == "length"
        assert reply["usage"]["completion_tokens"] == max_tokens
        return
    async with http.stream("POST", path, json=body) as response:
        assert response.status_code == 200, await response.aread()
        events = [line async for line in response.aiter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    last = json.loads(events[-2].removeprefix("data: "))
    assert last["choices"][0]["finish_reason"] == "length" and last["usage"]["completion_tokens"] == max_tokens


async def oversized(http: httpx.AsyncClient, number: int) -> None:
    """A body over the limit (413), or within it with a prompt far over the context (400)."""
    words = LIMIT_BODY_BYTES * (1 + number % 16) // 4 if number % 2 else LIMIT_BODY_BYTES // 5
    body = b'{"model": "tiny-test-pair", "prompt": "' + b"red " * words + b'"}'
    response = await http.post("/v1/completions", content=body, headers={"Content-Type": "application/json"})
    expected = (413, "request_too_large") if number % 2 else (400, "context_length_exceeded")
    assert (response.status_code, response.json()["error"]["code"]) == expected


async def disconnecting(http: httpx.AsyncClient, number: int) -> None:
    body = {"model": MODEL, "prompt": "red", "max_tokens": 200, "seed": number}
    if number % 2:
        async with http.stream("POST", "/v1/completions", json=body | {"stream": True}) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    break  # leave after the first event
        return
    with pytest.raises(httpx.ReadTimeout):
        await http.post("/v1/completions", json=body, timeout=0.2)


async def new_setting(http: httpx.AsyncClient, number: int) -> None:
    body = {"model": MODEL, "prompt": "dog", "max_tokens": 3, "temperature": round(0.05 + 0.001 * (number % 1500), 3)}
    response = await http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text


async def repeat(kind, http: httpx.AsyncClient, until: float, counts: dict, first: int) -> None:
    number = first
    while time.monotonic() < until:
        await kind(http, number)
        counts[kind.__name__] = counts.get(kind.__name__, 0) + 1
        number += 1


def probe_health(server, stop: threading.Event, latencies: list) -> None:
    with httpx.Client(base_url=server.url, timeout=5) as http:
        while not stop.is_set():
            started = time.monotonic()
            assert http.get("/health").status_code == 200
            latencies.append(time.monotonic() - started)
            stop.wait(HEALTH_EVERY)


def load(server, seconds: float, first: int = 0) -> dict:
    """Every kind of client at once for ``seconds``; the count of each kind's requests."""
    async def run():
        counts, until = {}, time.monotonic() + seconds
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            clients = [repeat(normal, http, until, counts, first + 1000 * index) for index in range(NORMAL_CLIENTS)]
            clients += [repeat(kind, http, until, counts, first) for kind in (oversized, disconnecting, new_setting)]
            await asyncio.wait_for(asyncio.gather(*clients), seconds + 60)
        return counts

    return asyncio.run(run())


def settle(server) -> dict:
    deadline = time.monotonic() + 10
    while True:
        health = server.health()
        if health["running"] == health["queued"] == health["tracked"] == health["settings"] == 0 \
                or time.monotonic() > deadline:
            return health


def check_under_load(server, seconds: float) -> None:
    load(server, WARM_UP_SECONDS, first=10**6)
    settle(server)
    memory = server.rss_bytes()
    stop, latencies = threading.Event(), []
    prober = threading.Thread(target=probe_health, args=(server, stop, latencies))
    prober.start()
    try:
        counts = load(server, seconds)
    finally:
        stop.set()
        prober.join(10)
    assert counts["normal"] >= NORMAL_CLIENTS and min(counts.values()) >= 2, counts
    assert len(latencies) >= seconds / (HEALTH_EVERY + HEALTH_SECONDS) / 2
    assert max(latencies) < HEALTH_SECONDS, sorted(latencies)[-5:]
    health = settle(server)
    assert health["running"] == health["queued"] == health["tracked"] == health["settings"] == 0, health
    assert health["cache_tokens"] == 0, health
    assert health["cancelled"] >= counts["disconnecting"] // 2, health
    assert server.rss_bytes() <= memory * (1 + MEMORY_GROWTH), (memory, server.rss_bytes())


def test_a_mixed_load_is_served_whole_with_health_fast_and_memory_flat(limits_server):
    check_under_load(limits_server, FAST_SECONDS)


@pytest.mark.slow
def test_a_minute_of_mixed_load_is_served_whole_with_health_fast_and_memory_flat(limits_server):
    check_under_load(limits_server, SLOW_SECONDS)
