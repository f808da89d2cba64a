"""The llama.cpp forwards a study unit is made of, on this machine: the floor under a unit.

A unit of the acceptance study at Hu et al.'s settings runs three kinds of forward of the
embedded Q4_K_M pair: the target's prefill of the prompt, the target's batched decoding
steps (one token a row), and one draft forward over prompt + generation (the scoring
forward). Their cost is llama.cpp's kernels on these files; nothing the study does outside
them can make a unit cheaper than they are. Measured here, each the minimum over repeats:

- prefill rate (tokens/s) of each model, one sequence of 256 tokens;
- one decoding step of B rows (B = 16, 32) at 250 cached tokens a row, llama.cpp's KV cells
  unified (one store for every sequence, as ``engine.backends.llamacpp`` makes its contexts: trees
  share their prefix's cells) and one stream per row (each row's attention sees only its
  own cells);
- the same with 1 and 2 threads: whether a study could overlap its exact part (numpy/numba
  on worker processes) with generation on a 2-core machine (it can only where one thread
  does more than half the work of two).

Writes a record (``benchmarks.record``) with the llama.cpp build: its library, its extra
buffer types and whether they were used (``engine.backends.llamacpp_amx``).

    python -m benchmarks.studies.bench_study_forwards --output benchmarks/results/studies/forwards_avx2.json
"""

from __future__ import annotations

import argparse
import time

from benchmarks import record
from specbound.engine.backends import llamacpp
from specbound.engine.backends.llamacpp_amx import cpu_extra_buffer_types, use_extra_buffers
from specbound.models.loading import gguf_file

CACHED = 250  # tokens per row before the timed steps: an MMLU prompt and part of its answer
STEPS = 8
PREFILL = 256


class Context:
    """A context of ``rows`` sequences (``LlamaCppModel.new_context``) fed by hand-built
    batches, one sequence id a token."""

    def __init__(self, model: llamacpp.LlamaCppModel, rows: int, unified: bool):
        self.api = llamacpp._llama()
        self.context = model.new_context(rows * 512, rows, 512, unified=unified)
        self.batch = self.api.llama_batch_init(512, 0, rows)

    def decode(self, items) -> float:
        """One llama_decode of (token, position, sequence, wants logits); its seconds."""
        for i, (token, position, sequence, output) in enumerate(items):
            self.batch.token[i], self.batch.pos[i], self.batch.logits[i] = token, position, output
            self.batch.n_seq_id[i] = 1
            self.batch.seq_id[i][0] = sequence
        self.batch.n_tokens = len(items)
        started = time.perf_counter()
        if self.api.llama_decode(self.context, self.batch) != 0:
            raise RuntimeError("llama_decode failed")
        return time.perf_counter() - started

    def close(self) -> None:
        self.api.llama_batch_free(self.batch)
        self.api.llama_free(self.context)


def token(i: int) -> int:
    return (100 + 7919 * i) % 150_000


def prefill_rate(model, repeats: int = 2) -> float:
    """Tokens per second of one PREFILL-token prefill (the best of ``repeats``, each on an
    emptied cache)."""
    context = Context(model, 1, unified=True)
    try:
        seconds = []
        for _ in range(repeats):
            context.api.llama_memory_clear(context.api.llama_get_memory(context.context), True)
            seconds.append(context.decode([(token(i), i, 0, i == PREFILL - 1) for i in range(PREFILL)]))
        return PREFILL / min(seconds)
    finally:
        context.close()


def step_seconds(model, rows: int, unified: bool) -> float:
    """Minimum over STEPS of one decoding step of ``rows`` rows after CACHED tokens each."""
    context = Context(model, rows, unified)
    try:
        for row in range(rows):
            context.decode([(token(row + i), i, row, i == CACHED - 1) for i in range(CACHED)])
        return min(context.decode([(token(step * rows + row), CACHED + step, row, True) for row in range(rows)])
                   for step in range(STEPS))
    finally:
        context.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    record.add_output(parser, "studies/forwards.json")
    args = parser.parse_args()
    result = {"cached_tokens_per_row": CACHED, "prefill_tokens": PREFILL,
              "llama_cpp": {"library": llamacpp._llama().__file__,
                            "extra_buffer_types": cpu_extra_buffer_types(), "extra_buffers": use_extra_buffers()},
              "models": {}}
    for name in ("default-target", "default-draft"):
        path, _ = gguf_file(name, progress=False)
        models = {threads: llamacpp.LlamaCppModel(path, threads) for threads in (2, 1)}  # weights mapped, not copied
        figures = {}
        for threads, model in models.items():
            figures[f"prefill_tokens_per_second_threads{threads}"] = prefill_rate(model)
            print(name, threads, "threads: prefill", round(figures[f"prefill_tokens_per_second_threads{threads}"]),
                  "tokens/s", flush=True)
        for rows in (16, 32):
            for unified in (True, False):
                key = f"step_seconds_rows{rows}_{'unified' if unified else 'streams'}"
                figures[key] = step_seconds(models[2], rows, unified)
                print(name, key, round(figures[key], 4), flush=True)
        figures["step_seconds_rows16_unified_threads1"] = step_seconds(models[1], 16, True)
        print(name, "rows16 unified, 1 thread", round(figures["step_seconds_rows16_unified_threads1"], 4), flush=True)
        result["models"][name] = figures
        del models
    record.write(args.output, result)


if __name__ == "__main__":
    main()
