"""Plain decoding's time outside the target's forward, per token, on the llama.cpp backend.

Decodes 128 tokens of the default target alone (autoregressive, T = 0.7) twice and prints the
wall time per token beside the target's own model seconds per token (``LlamaCppLM.model_seconds``,
the llama_decode calls and their logits copy); the difference is what our step adds around
llama.cpp's forward (processing, sampling, bookkeeping). Needs the embedded pair.

    python -m benchmarks.llamacpp.bench_step_overhead
"""

from __future__ import annotations

import time

import torch

from specbound.api import Speculator
from specbound.engine import Sampling

PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring and tests."


def main() -> None:
    speculator = Speculator(draft=None, progress=False, backend="llama.cpp")
    decoder, method = speculator.decoder_for(Sampling(0.7), "autoregressive", {})
    prompt = speculator.pair.encode(PROMPT)
    decoder.generate(prompt, method, 16, torch.Generator().manual_seed(0))  # warm-up
    for _ in range(2):
        started = time.perf_counter()
        generation = decoder.generate(prompt, method, 128, torch.Generator().manual_seed(1))
        wall, model = time.perf_counter() - started, decoder.target.model_seconds
        tokens = len(generation.tokens)
        print(f"{tokens} tokens: {wall / tokens * 1e3:.1f} ms per token, of which the target's forward "
              f"{model / tokens * 1e3:.1f} ms; outside it {(wall - model) / tokens * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
