"""Bad input and overload: every bad request is refused with OpenAI's error object naming
the field, nothing it sends stops the loop or another request; a full queue answers 429
with Retry-After; SIGTERM drains the requests in flight, ends properly the streams it cannot
finish, and exits 0 (last: it stops the small server)."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time

import httpx
import pytest

from support.serving import API_KEY, MODEL
from support.chat_pair import CONTEXT

LONG = " ".join(["red"] * CONTEXT)
COMPLETION = {"model": MODEL, "prompt": "red cat", "max_tokens": 4}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "red"}], "max_tokens": 4}


def with_(body: dict, **changes) -> dict:
    return {**body, **changes}


BAD_REQUESTS = [
    # (path, body (bytes: sent as is), status, param, code)
    ("completions", b'{"model": "tiny-test-pair", "prompt": ', 400, None, None),
    ("completions", b"[1, 2]", 400, None, None),
    ("chat/completions", b"\xff\xfe", 400, None, None),
    ("completions", with_(COMPLETION, temperature="hot"), 400, "temperature", None),
    ("completions", with_(COMPLETION, temperature=2.5), 400, "temperature", None),
    ("completions", with_(COMPLETION, max_tokens="4"), 400, "max_tokens", None),
    ("completions", with_(COMPLETION, max_tokens=0), 400, "max_tokens", None),
    ("completions", with_(COMPLETION, seed=-1), 400, "seed", None),
    ("completions", with_(COMPLETION, stream="yes"), 400, "stream", None),
    ("completions", with_(COMPLETION, top_p=0), 400, "top_p", None),
    ("completions", with_(COMPLETION, stop=["a", "b", "c", "d", "e"]), 400, "stop", None),
    ("completions", with_(COMPLETION, prompt=[1, 99]), 400, "prompt", None),
    ("completions", with_(COMPLETION, prompt=""), 400, "prompt", None),
    ("completions", with_(COMPLETION, prompt=None), 400, "prompt", None),
    ("completions", with_(COMPLETION, logprobs=2), 400, "logprobs", None),
    ("completions", with_(COMPLETION, frobnicate=1), 400, "frobnicate", None),
    ("completions", {"prompt": "red"}, 400, "model", None),
    ("chat/completions", with_(CHAT, messages=[{"role": "user", "content": 3}]), 400, "messages[0].content", None),
    ("chat/completions", with_(CHAT, messages=[{"role": "robot", "content": "red"}]), 400, "messages[0].role", None),
    ("chat/completions", with_(CHAT, messages=[]), 400, "messages", None),
    ("chat/completions", with_(CHAT, n=2), 400, "n", None),
    ("completions", with_(COMPLETION, n=3), 400, "n", None),
    ("completions", with_(COMPLETION, model="gpt-4"), 404, "model", "model_not_found"),
    ("chat/completions", with_(CHAT, model="nope"), 404, "model", "model_not_found"),
    ("completions", with_(COMPLETION, max_tokens=CONTEXT), 400, "max_tokens", "context_length_exceeded"),
    ("chat/completions", with_(CHAT, max_tokens=CONTEXT), 400, "max_tokens", "context_length_exceeded"),
    ("completions", with_(COMPLETION, prompt=LONG), 400, "prompt", "context_length_exceeded"),
    ("chat/completions", with_(CHAT, messages=[{"role": "user", "content": LONG}]), 400, "messages",
     "context_length_exceeded"),
]


@pytest.mark.parametrize("path, body, status, param, code", BAD_REQUESTS)
def test_a_bad_request_is_refused_naming_the_field(server, path, body, status, param, code):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = httpx.post(f"{server.url}/v1/{path}", content=content, timeout=30,
                          headers=server.headers | {"Content-Type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["type"] == "invalid_request_error"
    assert (error["param"], error["code"]) == (param, code)


def test_bad_requests_leave_the_loop_and_other_requests_running(server):
    """Bad requests sent while good ones stream: every good one completes."""
    async def run():
        async with httpx.AsyncClient(base_url=server.url, headers=server.headers, timeout=60) as http:
            good = [http.post("/v1/completions", json=with_(COMPLETION, max_tokens=30, seed=seed)) for seed in range(6)]
            bad = [http.post("/v1/" + path, content=body if isinstance(body, bytes) else json.dumps(body).encode(),
                             headers={"Content-Type": "application/json"}) for path, body, *_ in BAD_REQUESTS]
            return await asyncio.wait_for(asyncio.gather(*good, *bad), 60)

    responses = asyncio.run(run())
    assert [response.status_code for response in responses[:6]] == [200] * 6
    assert all(response.status_code in (400, 404) for response in responses[6:])
    assert server.health()["running"] == 0


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}])
def test_a_missing_or_wrong_key_is_refused(server, headers):
    for method, path, body in (("GET", "/v1/models", None), ("POST", "/v1/completions", COMPLETION),
                               ("POST", "/v1/chat/completions", CHAT)):
        response = httpx.request(method, f"{server.url}{path}", json=body, headers=headers, timeout=30)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"


def test_a_full_queue_answers_429_with_retry_after(small_server):
    """One batch slot, one queue place: of 8 requests sent at once (each 200 tokens, about a
    second of decoding), two are answered, the others refused at once, each with a clean error."""
    async def run():
        async with httpx.AsyncClient(base_url=small_server.url, timeout=60) as http:
            body = {"model": MODEL, "prompt": "cat", "max_tokens": 200}
            return await asyncio.wait_for(asyncio.gather(*(http.post("/v1/completions", json=body | {"seed": seed})
                                                           for seed in range(8))), 60)

    responses = asyncio.run(run())
    statuses = sorted(response.status_code for response in responses)
    assert statuses == [200] * 2 + [429] * 6
    for response in responses:
        if response.status_code == 429:
            assert int(response.headers["Retry-After"]) >= 1
            assert response.json()["error"]["code"] == "rate_limit_exceeded"
        else:
            assert response.json()["usage"]["completion_tokens"] == 200


def test_sigterm_drains_the_requests_in_flight_and_exits_0(small_server):
    """Last: it stops the small server. A stream under way when SIGTERM comes is finished
    whole; new connections are refused; the process exits with status 0."""
    with httpx.Client(base_url=small_server.url, timeout=60) as http:
        with http.stream("POST", "/v1/completions", json={"model": MODEL, "prompt": "red", "max_tokens": 200,
                                                         "seed": 4, "stream": True}) as response:
            lines = response.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            small_server.process.send_signal(signal.SIGTERM)
            rest = list(lines)
        chunks = [json.loads(line[6:]) for line in [first] + rest if line.startswith("data: {")]
        assert [line for line in rest if line][-1] == "data: [DONE]"
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert chunks[-1]["usage"]["completion_tokens"] == 200
    deadline = time.monotonic() + 10
    refused = False
    while time.monotonic() < deadline and not refused:
        try:
            httpx.get(f"{small_server.url}/health", timeout=1)
            time.sleep(0.05)
        except httpx.TransportError:
            refused = True
    assert refused
    assert small_server.process.wait(30) == 0


def test_sigterm_ends_what_the_drain_cannot_finish_properly_and_exits_0(short_drain_server):
    """A drain of 0.2 s against three streams of 250 tokens each (one running, two waiting:
    over a second of decoding): the server exits 0 soon after; a stream it could not finish
    still ends as a stream should — its last chunk an error object, then ``data: [DONE]``, the
    body complete (no transport error)."""
    endings, started = {}, threading.Barrier(2)

    def stream(seed: int) -> None:
        body = {"model": MODEL, "prompt": "red", "max_tokens": 250, "seed": seed, "stream": True}
        try:
            with httpx.stream("POST", f"{short_drain_server.url}/v1/completions", json=body, timeout=60) as response:
                lines = response.iter_lines()
                if seed == 0:
                    next(line for line in lines if line.startswith("data: "))
                    started.wait(10)
                events = [line for line in lines if line.startswith("data: ")]
                endings[seed] = (response.status_code, events[-2:])
        except httpx.TransportError as error:  # the connection closed mid-stream
            endings[seed] = (None, [repr(error)])

    threads = [threading.Thread(target=stream, args=(seed,)) for seed in range(3)]
    for thread in threads:
        thread.start()
        time.sleep(0.05)  # the first one first
    started.wait(10)
    deadline = time.monotonic() + 10
    while short_drain_server.health()["queued"] < 2 and time.monotonic() < deadline:  # all three in
        time.sleep(0.01)
    signalled = time.monotonic()
    short_drain_server.process.send_signal(signal.SIGTERM)
    assert short_drain_server.process.wait(30) == 0
    exited = time.monotonic() - signalled
    for thread in threads:
        thread.join(30)
    assert sorted(endings) == [0, 1, 2] and exited < 15
    cut = 0
    for status, (last, done) in endings.values():
        assert status == 200 and done == "data: [DONE]", endings
        chunk = json.loads(last.removeprefix("data: "))
        if "error" in chunk:
            cut += 1
            assert chunk["error"]["type"] == "server_error" and "shut down" in chunk["error"]["message"]
        else:
            assert chunk["choices"][0]["finish_reason"] == "length"
    assert cut >= 1, "a drain of 0.2 s cannot finish 750 tokens"
