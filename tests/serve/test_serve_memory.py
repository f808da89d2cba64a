"""Opt-in (``pytest -m slow``): the server's memory follows what it decodes, not the sampling
settings clients name — on the embedded pair (llama.cpp), where every decoder's caches are
llama.cpp contexts of hundreds of megabytes.

``specbound serve --method chain:gamma=3 --max-batch 4``: after a warm-up (four requests at
once at the server's own setting), 40 requests, each with a sampling setting of its own
(temperature, top-p, top-k), four at a time; ``/health`` is probed every 50 ms all along and
answers every time in under 0.1 s; afterwards nothing is left running or reserved, and the
resident memory is within 10% of the warm server's. The figures are printed (run with
``-s``): what ``docs/serve.md`` cites.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import threading
import time

import httpx
import pytest

from support.serving import ServerProcess

pytestmark = pytest.mark.slow

REQUESTS, CONCURRENCY, MAX_TOKENS = 40, 4, 4
HEALTH_SECONDS, HEALTH_EVERY = 0.1, 0.05
MEMORY_GROWTH = 0.10
PROMPT = "def fibonacci(n):"
MODEL = "default-target"


def setting(number: int) -> dict:
    """A sampling setting no other request of the test names."""
    return {"temperature": round(0.05 + 0.95 * number / (REQUESTS - 1), 4), "top_p": [None, 0.9, 0.95][number % 3],
            "top_k": [None, 40][number % 2]}


@pytest.fixture(scope="module")
def real_server():
    from specbound.models.gguf import ModelPackageMissingError, get_embedded_gguf, locate_parts

    try:
        for name in ("default-target", "default-draft"):
            locate_parts(get_embedded_gguf(name))
    except ModelPackageMissingError as error:
        pytest.skip(f"default pair not installed: {error}")
    server = ServerProcess(None, "--method", "chain:gamma=3", "--max-batch", str(CONCURRENCY), "--seed", "0",
                           threads=2)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def send_all(server, bodies: list[dict]) -> list[int]:
    async def run():
        limit = asyncio.Semaphore(CONCURRENCY)
        async with httpx.AsyncClient(base_url=server.url, timeout=600) as http:
            async def one(body):
                async with limit:
                    response = await http.post("/v1/completions", json=body)
                    return response.status_code

            return await asyncio.gather(*(one(body) for body in bodies))

    return asyncio.run(run())


def test_forty_sampling_settings_leave_memory_flat_and_health_fast(real_server):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": MAX_TOKENS}
    assert send_all(real_server, [body | {"seed": seed} for seed in range(CONCURRENCY)]) == [200] * CONCURRENCY
    warm = real_server.rss_bytes()
    stop, latencies, memory = threading.Event(), [], [warm]

    def probe():
        with httpx.Client(base_url=real_server.url, timeout=5) as http:
            while not stop.is_set():
                started = time.monotonic()
                assert http.get("/health").status_code == 200
                latencies.append(time.monotonic() - started)
                memory.append(real_server.rss_bytes())
                stop.wait(HEALTH_EVERY)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        statuses = send_all(real_server, [body | setting(number) | {"seed": number} for number in range(REQUESTS)])
    finally:
        stop.set()
        prober.join(10)
    health = real_server.health()
    after = real_server.rss_bytes()
    figures = {"rss_warm_gb": round(warm / 1e9, 3), "rss_after_gb": round(after / 1e9, 3),
               "rss_max_gb": round(max(memory) / 1e9, 3), "health_probes": len(latencies),
               "health_p95_ms": round(1000 * statistics.quantiles(latencies, n=20)[-1], 1),
               "health_max_ms": round(1000 * max(latencies), 1), "settings": REQUESTS}
    print(f"\nserve memory: {json.dumps(figures)}")
    assert statuses == [200] * REQUESTS
    assert health["running"] == health["queued"] == health["cache_tokens"] == 0, health
    assert max(latencies) < HEALTH_SECONDS, figures
    assert after <= warm * (1 + MEMORY_GROWTH), figures
