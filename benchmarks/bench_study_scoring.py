"""Benchmark of the studies' per-generation work on the default pair (specbound.studies).

Measures, side by side on this machine, for one HumanEval prompt and a 128-token
continuation (random tokens: the cost does not depend on which tokens):
- scoring the whole sequence with one forward of each model, computed in float32 (what the
  studies do, ``traces.SCORING_DTYPE``; the cast to float32 and back is included) against
  the models' own bfloat16: wall-clock and process CPU seconds, and their ratio;
- every acceptance method's exact computation over the 128 rows (V = 151,936), n = 3:
  seconds per row.
Both wall and CPU time are printed: on a shared machine the wall time includes waiting for
a core. Needs the embedded default pair. Run: ``python benchmarks/bench_study_scoring.py``.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from specbound.datasets import load_prompts
from specbound.engine import Processing
from specbound.studies import traces
from specbound.studies.acceptance import acceptance_methods, method_acceptance
from specbound.models.pair import load_pair

NEW_TOKENS = 128


def timed(function):
    wall, cpu = time.perf_counter(), time.process_time()
    result = function()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    pair = load_pair("default-target", "default-draft")
    prompt_ids = pair.encode(load_prompts("humaneval", 1)[0].text)
    tokens = torch.randint(0, pair.vocab_size, (NEW_TOKENS,), generator=torch.Generator().manual_seed(0)).tolist()
    processing = Processing(0.7, vocab_size=pair.vocab_size)
    print(f"prompt {len(prompt_ids)} tokens + {NEW_TOKENS} generated; torch threads {torch.get_num_threads()}")
    scoring = {}
    for dtype in (torch.float32, torch.bfloat16):
        traces.SCORING_DTYPE = dtype
        for name, model in (("target", pair.target), ("draft", pair.draft)):
            rows, wall, cpu = timed(lambda: traces.next_token_probs(model, prompt_ids, tokens, processing))
            scoring[(name, dtype)] = (wall, cpu)
            print(f"score {name:6s} in {str(dtype):15s}: {wall:7.1f} s wall, {cpu:7.1f} s CPU")
            if name == "target" and dtype == torch.float32:
                target_rows = rows
            if name == "draft" and dtype == torch.float32:
                draft_rows = rows
    for name in ("target", "draft"):
        fast, slow = scoring[(name, torch.float32)], scoring[(name, torch.bfloat16)]
        print(f"{name}: bfloat16 / float32 scoring time: {slow[0] / fast[0]:.2f} (wall), {slow[1] / fast[1]:.2f} (CPU)")
    for method in acceptance_methods():
        values, wall, cpu = timed(lambda: method_acceptance(method, target_rows, draft_rows, 3))
        print(f"{method:28s} n=3: {1000 * wall / NEW_TOKENS:8.1f} ms/row wall, {1000 * cpu / NEW_TOKENS:8.1f} ms/row CPU"
              f"  (mean acceptance {np.mean(values):.4f})")


if __name__ == "__main__":
    main()
