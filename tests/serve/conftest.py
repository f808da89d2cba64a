"""Servers for the serve tests: ``specbound serve`` as a subprocess on a free loopback port
(127.0.0.1 only), serving the tiny pair (``tiny_pair``) with a fixed method and seed.

- ``server``: the tiny pair with EOS, ``chain:gamma=3`` at temperature 0.8, batches of 8, an
  API key;
- ``small_server``: the pair without EOS (every request runs to its max_tokens), one
  sequence at a time and one waiting, so that overload, disconnects and the drain on SIGTERM
  are seen; the drain test stops it, last;
- ``short_drain_server``: the same, two waiting, with a drain of 0.2 s, for a drain that runs out.

All start together (each pays ~10 s of imports on two cores) the first time one is used.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

HERE = Path(__file__).resolve().parent
API_KEY = "test-key"
MODEL = "tiny-test-pair"
START_SECONDS = 120


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ServerProcess:
    """One ``specbound serve`` subprocess."""

    def __init__(self, factory: str, *options: str, api_key: str | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), str(HERE.parent / "engine"),
                                                            os.environ.get("PYTHONPATH", "")]))
        command = [sys.executable, "-c", "import sys; from specbound.cli import main; sys.exit(main())", "serve", "--pair-factory", f"tiny_pair:{factory}",
                   "--host", "127.0.0.1", "--port", str(self.port), "--threads", "1", "--log-level", "warning",
                   *options] + (["--api-key", api_key] if api_key else [])
        self.log = tempfile.TemporaryFile("w+")  # noqa: SIM115 — closed in stop()
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, env=env)

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}: {self.output()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the server did not start in {START_SECONDS} s: {self.output()}")

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=5).json()

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-4000:]

    def terminate(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        self.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self.log.close()


@pytest.fixture(scope="session")
def servers():
    started = {
        "server": ServerProcess("tiny_pair", "--method", "chain:gamma=3", "--temperature", "0.8", "--max-batch", "8",
                                "--max-queue", "64", "--seed", "0", api_key=API_KEY),
        "small": ServerProcess("tiny_pair_without_eos", "--method", "chain:gamma=3", "--temperature", "0.8",
                               "--max-batch", "1", "--max-queue", "1", "--drain-seconds", "20"),
        "short_drain": ServerProcess("tiny_pair_without_eos", "--method", "chain:gamma=3", "--max-batch", "1",
                                     "--max-queue", "2", "--drain-seconds", "0.2"),
    }
    try:
        for process in started.values():
            process.wait_ready()
        yield started
    finally:
        for process in started.values():  # both drain at once
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
