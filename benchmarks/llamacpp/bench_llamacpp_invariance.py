"""How far llama.cpp's forward is from batch-invariant, on the default target, and what a
forward of k rows costs there.

For prompts of a built-in set, the prompt but its last 16 tokens is prefilled; then the
row of the next token is scored alone (one entry) and inside forwards of k entries (the
next k tokens as a chain, the row read is the first): the total variation between the two
next-token laws at temperature T, max and mean over prompts, per k. Also the engine's cost
of one forward of k tree rows after a 200-token context (``engine.cost_probe.measure_costs``:
the cost book's measurement). Writes one record (``benchmarks.record``).

    python -m benchmarks.llamacpp.bench_llamacpp_invariance --prompts humaneval --limit 8 --threads 2
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from benchmarks import record
from specbound.datasets import load_prompts
from specbound.engine import Processing
from specbound.engine.backends import Entries
from specbound.engine.backends.llamacpp import LlamaCppLM
from specbound.engine.cost_probe import measure_costs
from specbound.models.pair import load_pair

ROWS = (2, 4, 8, 16)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="default-target")
    parser.add_argument("--draft", default="default-draft")
    parser.add_argument("--prompts", default="humaneval")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--threads", type=int, default=2)
    record.add_output(parser, "llamacpp/invariance.json")
    args = parser.parse_args()
    pair = load_pair(args.target, args.draft, backend="llama.cpp", progress=False, threads=args.threads)
    processing = Processing(args.temperature, vocab_size=pair.vocab_size)
    lm = LlamaCppLM(pair.target)
    distances = {rows: [] for rows in ROWS}
    for prompt in load_prompts(args.prompts, limit=args.limit):
        ids = pair.encode(prompt.text)
        prefix, following = ids[:-16], ids[-16:]

        def first_row(count: int) -> torch.Tensor:
            lm.reset(1, cells=len(ids))
            lm.prefill(0, prefix)
            logits = lm.score([Entries.chain(following[:count])], outputs=[[0]]).logits(0, 0)
            return processing.probs(logits).double()[0]

        alone = first_row(1)
        for rows in ROWS:
            distances[rows].append(float(0.5 * (first_row(rows) - alone).abs().sum()))
    costs = {model: measure_costs(getattr(pair, model)).seconds for model in ("target", "draft")}
    result = {
        "what": "TV(row alone, same row first of a k-row forward) and one forward's seconds by rows, llama.cpp",
        "prompts": args.prompts, "limit": args.limit, "temperature": args.temperature, "threads": args.threads,
        "tv_max": {rows: max(values) for rows, values in distances.items()},
        "tv_mean": {rows: sum(values) / len(values) for rows, values in distances.items()},
        "forward_seconds": costs, "target": pair.description["target_file"], "draft": pair.description["draft_file"],
    }
    record.write(args.output, result)
    print(json.dumps({key: result[key] for key in ("tv_max", "tv_mean", "forward_seconds")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
