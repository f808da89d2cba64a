"""Continuous batching through the server: concurrent streams get the tokens of solo runs
with the same seeds, a client that disconnects frees its slot, and a bounded load (200
requests at concurrency 16, loopback only) loses, duplicates and leaks nothing."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest

from support.serving import API_KEY, MODEL

PROMPTS = ["red cat", "blue dog runs", "green", "cat sleeps dog", "red red blue", "dog", "green cat runs", "blue"]
LOAD_ROUNDS, LOAD_PER_ROUND, LOAD_CONCURRENCY, LOAD_SECONDS = 4, 50, 16, 120
RSS_GROWTH_LIMIT = 16 * 2**20  # bytes between the second round and the last


async def stream_text(client: openai.AsyncOpenAI, prompt: str, seed: int, max_tokens: int) -> tuple[str, str, int]:
    text, finish, usage = "", None, None
    async for chunk in await client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, seed=seed,
                                                       stream=True):
        text += chunk.choices[0].text
        finish = chunk.choices[0].finish_reason or finish
        usage = chunk.usage or usage
    return text, finish, usage.completion_tokens


def test_eight_concurrent_streams_get_the_tokens_of_solo_runs(server):
    async def run():
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=60)
        requests = [(prompt, 100 + index, 10 + 4 * index) for index, prompt in enumerate(PROMPTS)]
        solo = [await stream_text(client, *request) for request in requests]
        together = await asyncio.wait_for(asyncio.gather(*(stream_text(client, *request) for request in requests)), 60)
        await client.close()
        return solo, together

    solo, together = asyncio.run(run())
    assert together == solo
    assert {finish for _, finish, _ in solo} <= {"stop", "length"}
    assert sum(tokens for _, _, tokens in solo) > 3 * len(PROMPTS), "the streams must be long enough to overlap"


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_disconnects_mid_request_frees_its_slot(small_server, stream):
    """One sequence at a time: the disconnected request is dropped before it ends (its 250
    tokens take over a second), and the next request gets the slot. A streaming client leaves
    after its first chunk, a waiting one after 0.2 s."""
    before = small_server.health()
    body = {"model": MODEL, "prompt": "red", "max_tokens": 250, "seed": 1, "stream": stream}
    with httpx.Client(base_url=small_server.url, timeout=30) as http:
        if stream:
            with http.stream("POST", "/v1/completions", json=body) as response:
                lines = response.iter_lines()
                assert next(line for line in lines if line.startswith("data: "))
        else:
            with pytest.raises(httpx.ReadTimeout), httpx.Client(base_url=small_server.url, timeout=0.2) as impatient:
                impatient.post("/v1/completions", json=body)
        deadline = time.monotonic() + 10
        while small_server.health()["cancelled"] == before["cancelled"] and time.monotonic() < deadline:
            time.sleep(0.05)
        health = small_server.health()
        assert health["cancelled"] == before["cancelled"] + 1 and health["completed"] == before["completed"]
        assert health["running"] == health["in_batches"] == health["tracked"] == 0
        reply = http.post("/v1/completions", json={"model": MODEL, "prompt": "dog", "max_tokens": 8, "seed": 2})
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 8


def test_a_bounded_load_is_answered_whole_without_loss_duplicates_or_growth(server):
    """4 rounds of 50 requests at concurrency 16 (streaming and not, completions and chat);
    each (prompt, seed) is sent twice, in different rounds: both answers must be equal, so no
    two requests' tokens crossed. Every request gets one complete answer (or a clean 429);
    after each round nothing is left running, queued, in a batch or tracked by the loop; the
    server's resident memory grows
    by less than RSS_GROWTH_LIMIT from the second round to the last."""
    def request(number: int) -> dict:
        twin = number % (LOAD_ROUNDS * LOAD_PER_ROUND // 2)  # request n and n + 100 are twins
        body = {"model": MODEL, "max_tokens": 4 + twin % 13, "seed": 1000 + twin, "stream": twin % 3 == 0}
        if twin % 2:
            body["messages"] = [{"role": "user", "content": PROMPTS[twin % len(PROMPTS)]}]
        else:
            body["prompt"] = PROMPTS[twin % len(PROMPTS)]
        return body

    async def send(http: httpx.AsyncClient, limit: asyncio.Semaphore, number: int) -> tuple[int, dict]:
        body = request(number)
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        async with limit:
            if not body["stream"]:
                response = await http.post(path, json=body)
                return number, {"status": response.status_code, **response.json()}
            text, finish, usage, ids, done = "", None, None, set(), False
            async with http.stream("POST", path, json=body) as response:
                if response.status_code != 200:
                    return number, {"status": response.status_code, **json.loads(await response.aread())}
                async for line in response.aiter_lines():
                    if line == "data: [DONE]":
                        done = True
                    elif line.startswith("data: "):
                        chunk = json.loads(line[6:])
                        ids.add(chunk["id"])
                        for choice in chunk["choices"]:
                            text += choice.get("text") or choice.get("delta", {}).get("content") or ""
                            finish = choice["finish_reason"] or finish
                        usage = chunk.get("usage") or usage
            assert done and len(ids) == 1
            return number, {"status": 200, "id": ids.pop(), "text": text, "finish": finish, "usage": usage}

    def answer(result: dict) -> tuple:
        if "choices" in result:
            choice = result["choices"][0]
            text = choice["text"] if "text" in choice else choice["message"]["content"]
            return text, choice["finish_reason"], result["usage"]["completion_tokens"]
        return result["text"], result["finish"], result["usage"]["completion_tokens"]

    async def run_round(index: int) -> list:
        limit = asyncio.Semaphore(LOAD_CONCURRENCY)
        async with httpx.AsyncClient(base_url=server.url, headers=server.headers, timeout=60,
                                     limits=httpx.Limits(max_connections=LOAD_CONCURRENCY)) as http:
            numbers = range(index * LOAD_PER_ROUND, (index + 1) * LOAD_PER_ROUND)
            return await asyncio.gather(*(send(http, limit, number) for number in numbers))

    results, memory, started = {}, [], time.monotonic()
    for index in range(LOAD_ROUNDS):
        for number, result in asyncio.run(asyncio.wait_for(run_round(index), LOAD_SECONDS)):
            assert number not in results
            results[number] = result
        health = server.health()
        assert health["running"] == health["queued"] == health["in_batches"] == health["tracked"] == 0
        memory.append(server.rss_bytes())
    assert time.monotonic() - started < LOAD_SECONDS
    assert sorted(results) == list(range(LOAD_ROUNDS * LOAD_PER_ROUND))
    answered = {number: result for number, result in results.items() if result["status"] == 200}
    for number, result in results.items():
        if result["status"] != 200:
            assert result["status"] == 429 and result["error"]["code"] == "rate_limit_exceeded"
    assert len(answered) >= len(results) * 0.9, "a queue of 64 should take concurrency 16"
    assert len({result["id"] for result in answered.values()}) == len(answered)
    half = LOAD_ROUNDS * LOAD_PER_ROUND // 2
    for number in range(half):
        if number in answered and number + half in answered:
            assert answer(answered[number]) == answer(answered[number + half]), number
    for number, result in answered.items():
        text, finish, tokens = answer(result)
        assert finish in ("stop", "length") and 1 <= tokens <= request(number)["max_tokens"]
        assert finish == "stop" or tokens == request(number)["max_tokens"]
    assert memory[-1] - memory[1] < RSS_GROWTH_LIMIT, memory
