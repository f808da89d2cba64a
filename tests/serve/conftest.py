"""Servers for the serve tests: ``specbound serve`` as a subprocess on a free loopback port
(127.0.0.1 only), serving the tiny pair (``tiny_pair``) with a fixed method and seed.

- ``server``: the tiny pair with EOS, ``chain:gamma=3`` at temperature 0.8, batches of 8, an
  API key;
- ``small_server``: the pair without EOS (every request runs to its max_tokens), one
  sequence at a time and one waiting, so that overload, disconnects and the drain on SIGTERM
  are seen; the drain test stops it, last;
- ``short_drain_server``: the same, two waiting, with a drain of 0.2 s, for a drain that runs out;
- ``limits_server``: the pair without EOS, batches of 4, 4 waiting, ``LIMIT_CACHE_TOKENS`` cache
  entries and bodies of at most ``LIMIT_BODY_BYTES``: admission, the cache's bound, sizes, the
  load test.

The others reserve ``CACHE_TOKENS`` cache entries at most (the default, the tiny pair's context
of 256 positions, would refuse some of their concurrent requests).

They start the first time one is used: ``server`` alone, which compiles the engine's loops
into the cache (an empty one in CI), then the other three together, which load them from it
(a tiny server's start: ~8.5 s cold, ~4.6 s warm, on two cores).
"""

from __future__ import annotations

import pytest

from support.serving import API_KEY, CACHE_TOKENS, LIMIT_BODY_BYTES, LIMIT_CACHE_TOKENS, ServerProcess


@pytest.fixture(scope="session")
def servers():
    started = {}
    try:
        started["server"] = ServerProcess("tiny_pair", "--method", "chain:gamma=3", "--temperature", "0.8",
                                          "--max-batch", "8", "--max-queue", "64", "--seed", "0",
                                          "--max-cache-tokens", CACHE_TOKENS, api_key=API_KEY)
        started["server"].wait_ready()  # its compiled loops now cached for the others
        started |= {
            "small": ServerProcess("tiny_pair_without_eos", "--method", "chain:gamma=3", "--temperature", "0.8",
                                   "--max-batch", "1", "--max-queue", "1", "--drain-seconds", "20",
                                   "--max-cache-tokens", CACHE_TOKENS),
            "short_drain": ServerProcess("tiny_pair_without_eos", "--method", "chain:gamma=3", "--max-batch", "1",
                                         "--max-queue", "2", "--drain-seconds", "0.2",
                                         "--max-cache-tokens", CACHE_TOKENS),
            "limits": ServerProcess("tiny_pair_without_eos", "--method", "chain:gamma=3", "--temperature", "0.8",
                                    "--max-batch", "4", "--max-queue", "4",
                                    "--max-cache-tokens", str(LIMIT_CACHE_TOKENS),
                                    "--max-body-bytes", str(LIMIT_BODY_BYTES)),
        }
        for process in started.values():
            process.wait_ready()
        yield started
    finally:
        for process in started.values():  # all drain at once
            process.terminate()
        for process in started.values():
            process.stop()


@pytest.fixture(scope="session")
def server(servers) -> ServerProcess:
    return servers["server"]


@pytest.fixture(scope="session")
def small_server(servers) -> ServerProcess:
    return servers["small"]


@pytest.fixture(scope="session")
def short_drain_server(servers) -> ServerProcess:
    return servers["short_drain"]


@pytest.fixture(scope="session")
def limits_server(servers) -> ServerProcess:
    return servers["limits"]
