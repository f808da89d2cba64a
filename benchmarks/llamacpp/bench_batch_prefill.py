"""A batch's prefill on the llama.cpp backend: every prompt alone, against ``prefill_rows``.

The decoder admits a batch by committing each prompt (but its last token) to its row. Chat
prompts start alike (the template's system turn and the user turn's header), so
``LlamaCppLM.prefill_rows`` decodes a prefix the prompts share once, as entries belonging to
every row that starts with it, and packs the rows' other tokens into forwards of up to
``batch_tokens`` entries. Timed here, interleaved, on the first ``--limit`` prompts of a
set with the default target:

- ``alone``: each prompt in a context of its own, one row (``reset(1)`` then
  ``prefill_rows({0: prompt})``: the whole prompt decoded, as before the batch shared);
- ``prefill_rows``: the batch at once, as the decoder now admits it.

Writes a record (``benchmarks.record``) with the seconds of each repeat and the prompt and
decoded token counts.

    python -m benchmarks.llamacpp.bench_batch_prefill --dataset mmlu --limit 32
"""

from __future__ import annotations

import argparse
import time

from benchmarks import record
from specbound.datasets import load_prompts
from specbound.engine.backends.llamacpp import LlamaCppLM
from specbound.models.pair import load_pair


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="mmlu")
    parser.add_argument("--limit", type=int, default=32, help="prompts: the batch")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    record.add_output(parser, "llamacpp/batch_prefill.json")
    args = parser.parse_args()

    pair = load_pair("default-target", "default-draft", progress=False, backend="llama.cpp", threads=args.threads)
    prompts = [pair.encode(prompt.text)[:-1] for prompt in load_prompts(args.dataset, limit=args.limit)]
    lm = LlamaCppLM(pair.target)
    cells = sum(len(prompt) for prompt in prompts) + len(prompts)

    def alone() -> float:
        started = time.perf_counter()
        for prompt in prompts:
            lm.reset(1, cells=len(prompt))
            lm.prefill_rows({0: prompt})
        return time.perf_counter() - started

    def batched() -> float:
        lm.reset(len(prompts), cells=cells)
        started = time.perf_counter()
        lm.prefill_rows(dict(enumerate(prompts)))
        return time.perf_counter() - started

    seconds = {"alone": [], "prefill_rows": []}
    for _ in range(args.repeats):
        seconds["alone"].append(alone())
        seconds["prefill_rows"].append(batched())
        print({name: round(values[-1], 2) for name, values in seconds.items()}, flush=True)
    decoded = len({tuple(prompt[: end + 1]) for prompt in prompts for end in range(len(prompt))})
    tokens = sum(len(prompt) for prompt in prompts)
    ratio = min(seconds["alone"]) / min(seconds["prefill_rows"])
    print(f"{len(prompts)} {args.dataset} prompts, {tokens} tokens ({decoded} distinct prefixes decoded by "
          f"prefill_rows): best alone {min(seconds['alone']):.2f} s, prefill_rows {min(seconds['prefill_rows']):.2f} s "
          f"({ratio:.2f}x); per prompt {min(seconds['alone']) / len(prompts):.3f} -> "
          f"{min(seconds['prefill_rows']) / len(prompts):.3f} s")
    record.write(args.output, {"dataset": args.dataset, "prompts": len(prompts), "prompt_tokens": tokens,
                               "decoded_by_prefill_rows": decoded, "seconds": seconds, "ratio_of_best": ratio,
                               "threads": pair.target.threads})


if __name__ == "__main__":
    main()
