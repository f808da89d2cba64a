"""Serve test helpers: ``specbound serve`` as a subprocess on a free loopback port (127.0.0.1
only) serving a tiny pair of ``tiny_pair``; the fixtures that start them are in ``conftest``."""

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

TESTS = Path(__file__).resolve().parents[1]
API_KEY = "test-key"
MODEL = "tiny-test-pair"
LIMIT_BODY_BYTES = 65536  # the limits server's --max-body-bytes
LIMIT_CACHE_TOKENS = 1000  # the limits server's --max-cache-tokens
CACHE_TOKENS = "4096"  # the other servers'
START_SECONDS = 120


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ServerProcess:
    """One ``specbound serve`` subprocess: of the tiny pair ``support.chat_pair.<factory>`` on one
    thread, or with ``factory`` None of the models ``options`` name (by default the embedded
    pair) on ``threads``."""

    def __init__(self, factory: str | None, *options: str, api_key: str | None = None, threads: int = 1):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
        pair = ["--pair-factory", f"support.chat_pair:{factory}"] if factory else ["--quiet"]
        command = [sys.executable, "-c", "import sys; from specbound.cli import main; sys.exit(main())", "serve", *pair,
                   "--host", "127.0.0.1", "--port", str(self.port), "--threads", str(threads), "--log-level", "warning",
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
