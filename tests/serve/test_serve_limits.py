"""What one request can cost, and who gets in: bodies over the limit are refused with 413
before they are read whole; a body nested 100,000 levels deep or holding a lone surrogate
gets 400, not 500; free batch slots are filled at once; a request beyond the cache's bound
gets 429 with Retry-After and is served once the others end; ``Bearer`` in any case;
``GET /v1/models/{id}``."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from support.serving import API_KEY, LIMIT_BODY_BYTES, LIMIT_CACHE_TOKENS, MODEL

DEEP = 100_000


def check_error(response: httpx.Response, status: int, param=None, code=None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert (error["param"], error["code"]) == (param, code)
    return error


def post(server, path: str, content: bytes, **options) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/{path}", content=content, timeout=30,
                      headers=server.headers | {"Content-Type": "application/json"}, **options)


@pytest.mark.parametrize("size", [LIMIT_BODY_BYTES + 1, 30 * 2**20])
def test_a_body_over_the_limit_is_refused_with_413(limits_server, size):
    body = b'{"model": "tiny-test-pair", "prompt": "' + b"r" * (size - 40) + b'"}'
    check_error(post(limits_server, "completions", body), 413, code="request_too_large")


def test_a_body_that_grows_over_the_limit_without_a_length_is_refused_with_413(limits_server):
    def chunks():  # sent chunked: no Content-Length to judge it by
        yield b'{"model": "tiny-test-pair", "prompt": "'
        for _ in range(64):
            yield b"r" * 4096

    check_error(post(limits_server, "completions", chunks()), 413, code="request_too_large")


@pytest.mark.parametrize("path, body, param", [
    ("completions", b'{"model": "tiny-test-pair", "prompt": ' + b"[" * DEEP + b"]" * DEEP + b"}", None),
    ("completions", b'{"model": "tiny-test-pair", "prompt": "red", "user": {"a": ' + b'{"a": ' * 40 + b"1" +
     b"}" * 42, "user"),
    ("chat/completions", json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "\ud800"}]}).encode(),
     "messages[0].content"),
    ("completions", b'{"model": "tiny-test-pair", "prompt": "red \\udfff cat"}', "prompt"),
])
def test_a_deep_body_or_a_lone_surrogate_is_refused_with_400(server, path, body, param):
    check_error(post(server, path, body), 400, param)


def test_eight_requests_at_once_fill_four_slots_and_four_places(limits_server):
    """--max-batch 4 --max-queue 4: eight requests sent at once are all served."""
    async def run():
        async with httpx.AsyncClient(base_url=limits_server.url, timeout=60) as http:
            body = {"model": MODEL, "prompt": "red cat", "max_tokens": 24}
            return await asyncio.wait_for(asyncio.gather(*(http.post("/v1/completions", json=body | {"seed": seed})
                                                           for seed in range(8))), 60)

    assert [response.status_code for response in asyncio.run(run())] == [200] * 8


def test_a_request_beyond_the_cache_bound_gets_429_and_is_served_once_the_others_end(limits_server):
    """--max-cache-tokens 1000: four requests of four sampling settings reserve 4 x 250 cache
    entries (1 prompt token, 245 new, a chain of 3 below the root); a fifth is refused with
    429 naming max_tokens, with Retry-After; once they end it is served, and the cache's
    reservation is back to 0."""
    async def run():
        async with httpx.AsyncClient(base_url=limits_server.url, timeout=60) as http:
            async def long(temperature: float) -> httpx.Response:
                body = {"model": MODEL, "prompt": "red", "max_tokens": 245, "temperature": temperature, "seed": 1}
                return await http.post("/v1/completions", json=body)

            busy = [asyncio.create_task(long(temperature)) for temperature in (0.31, 0.32, 0.33, 0.34)]
            while (health := (await http.get("/health")).json())["running"] < 4:
                await asyncio.sleep(0.01)
            fifth = {"model": MODEL, "prompt": "red", "max_tokens": 2, "temperature": 0.35}
            refused = await http.post("/v1/completions", json=fifth)
            finished = await asyncio.gather(*busy)
            later = await http.post("/v1/completions", json=fifth)
            return health, refused, finished, later, (await http.get("/health")).json()

    health, refused, finished, later, after = asyncio.run(run())
    assert (health["cache_tokens"], health["max_cache_tokens"], health["settings"]) == (1000, LIMIT_CACHE_TOKENS, 4)
    error = check_error(refused, 429, "max_tokens", "rate_limit_exceeded")
    assert "1,000 of its 1,000 cache entries (--max-cache-tokens)" in error["message"], error["message"]
    assert int(refused.headers["Retry-After"]) >= 1
    assert [response.status_code for response in finished + [later]] == [200] * 5
    assert after["cache_tokens"] == after["settings"] == after["running"] == 0


@pytest.mark.parametrize("header", [f"bearer {API_KEY}", f"BEARER  {API_KEY}", f"bEaReR {API_KEY}"])
def test_the_bearer_scheme_is_matched_in_any_case(server, header):
    assert httpx.get(f"{server.url}/v1/models", headers={"Authorization": header}, timeout=30).status_code == 200


def test_a_model_is_retrieved_by_its_id(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=30)
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("gpt-4")
    assert missing.value.body["code"] == "model_not_found"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0).models.retrieve(MODEL)
