"""Benchmark of the acceptance study's per-unit work (specbound.studies.acceptance).

``exact`` (the default; no model is loaded): the exact computations of one study unit
(``AcceptanceStudy.exact``, one worker) at the report's settings — every position's rows cut by the tail budget (1e-6), then every
method at n = 2, 3, 4, 6 — on synthetic rows of the real vocabulary (V = 151,936). The
rows are shaped like the default pair's: Zipf-like logits (the kept support after the
cut is a few thousand tokens, median), the draft's logits the target's plus noise, and
either rounded to bfloat16 before a float32 softmax at T = 0.7 (``--rows bf16``, few
distinct values, as the engine's rows) or a float64 softmax (``--rows float64``, all
values distinct: the hard case for RRS without replacement at n = 3). Prints the unit's
seconds, then each step's alone (the cut, each (method, n)); ``--output`` writes them as a
record (``benchmarks.record``).

``scoring`` (needs the embedded default pair): scoring one 128-token continuation with one
forward of each model in float32 (``traces.SCORING_DTYPE``) against bfloat16.

Wall and process CPU time are both printed: on a shared machine the wall time includes
waiting for a core. Run: ``python -m benchmarks.studies.bench_study_scoring [exact|scoring] ...``.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import torch

from benchmarks import record
from specbound.engine import Processing
from specbound.bounds.tail import cut_tail, cut_tails
from specbound.studies.acceptance import DEFAULT_TAIL_BUDGET, AcceptanceStudy, acceptance_methods, exact_acceptances

VOCAB_SIZE = 151_936
NEW_TOKENS = 128
TEMPERATURE = 0.7


def timed(function):
    wall, cpu = time.perf_counter(), time.process_time()
    result = function()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def synthetic_rows(positions: int, rows: str, seed: int = 0, vocab_size: int = VOCAB_SIZE):
    """(target rows, draft rows) [positions, vocab] float64, shaped like a language model's
    next-token laws: logit of the token of rank r is −a·ln r (a ~ U(1.4, 2.6), the top token
    raised by an Exp(3) margin) plus N(0, 0.3²), on a random permutation of the vocabulary;
    the draft's logits are the target's plus N(0, σ²), σ ~ U(0.3, 1.2) per position."""
    rng = np.random.default_rng(seed)
    processing = Processing(TEMPERATURE, vocab_size=vocab_size)
    log_rank = np.log(np.arange(1, vocab_size + 1))
    targets, drafts = [], []
    for _ in range(positions):
        by_rank = -rng.uniform(1.4, 2.6) * log_rank
        by_rank[0] += rng.exponential(3.0)
        target_logits = np.empty(vocab_size)
        target_logits[rng.permutation(vocab_size)] = by_rank + 0.3 * rng.standard_normal(vocab_size)
        draft_logits = target_logits + rng.uniform(0.3, 1.2) * rng.standard_normal(vocab_size)
        for logits, out in ((target_logits, targets), (draft_logits, drafts)):
            if rows == "bf16":
                probs = processing.probs(torch.tensor(logits[None] + 20.0).to(torch.bfloat16).float())[0].double()
            else:
                probs = torch.softmax(torch.tensor(logits[None]) / TEMPERATURE, dim=-1)[0]
            probs = probs.numpy()
            out.append(probs / probs.sum())
    return np.array(targets), np.array(drafts)


def step_seconds(target_rows, draft_rows, num_drafts_list, methods, tail_budget):
    """Seconds of each step of the unit's exact part alone: the cut of every row for all n,
    then per n each method over the unit's rows (batched as the study batches them)."""
    cuts, wall, _ = timed(lambda: [cut_tails(target, draft, tail_budget, num_drafts_list)
                                   for target, draft in zip(target_rows, draft_rows)])
    seconds = {"cut_tails, all n": wall}
    for num_drafts in num_drafts_list:
        pairs = [(row[num_drafts].target, row[num_drafts].draft) for row in cuts]
        for method in methods:
            _, wall, _ = timed(lambda: exact_acceptances([method], pairs, num_drafts))
            seconds[f"{method}, n={num_drafts}"] = wall
    return seconds


def bench_exact(args) -> None:
    target_rows, draft_rows = synthetic_rows(args.positions, args.rows, args.seed)
    kept = [len(cut_tail(target, draft, args.tail_budget, 3)[0]) for target, draft in zip(target_rows, draft_rows)]
    print(f"{args.positions} positions of {args.rows} rows, V = {VOCAB_SIZE:,}; kept after the cut at n = 3: "
          f"median {int(np.median(kept)):,}, max {max(kept):,}; single-draft acceptance "
          f"{np.minimum(target_rows, draft_rows).sum(axis=1).mean():.4f}")
    methods = list(acceptance_methods())
    study = AcceptanceStudy(num_drafts=args.num_drafts, methods=methods, tail_budget=args.tail_budget, workers=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, wall, cpu = timed(lambda: study.exact(target_rows, draft_rows))  # the unit, as the study runs it
    seconds = step_seconds(target_rows, draft_rows, args.num_drafts, methods, args.tail_budget)
    for step, value in sorted(seconds.items(), key=lambda item: -item[1]):
        print(f"  {step:40s} {value:8.3f} s  ({1000 * value / args.positions:8.2f} ms/position)")
    per_unit = wall * NEW_TOKENS / args.positions
    print(f"unit exact part: {wall:.2f} s wall, {cpu:.2f} s CPU for {args.positions} positions "
          f"= {per_unit:.2f} s per {NEW_TOKENS}-token unit; warnings: {len(caught)}")
    if args.output:
        record.write(args.output, {
            "rows": args.rows, "positions": args.positions, "seed": args.seed, "num_drafts": args.num_drafts,
            "tail_budget": args.tail_budget, "vocab_size": VOCAB_SIZE, "median_kept_n3": int(np.median(kept)),
            "wall_seconds": wall, "cpu_seconds": cpu, "seconds_per_128_token_unit": per_unit,
            "steps": seconds, "warnings": [str(warning.message) for warning in caught],
        })


def bench_scoring(args) -> None:
    from specbound.datasets import load_prompts
    from specbound.models.pair import load_pair
    from specbound.studies import traces

    pair = load_pair("default-target", "default-draft")
    prompt_ids = pair.encode(load_prompts("humaneval", 1)[0].text)
    tokens = torch.randint(0, pair.vocab_size, (NEW_TOKENS,), generator=torch.Generator().manual_seed(0)).tolist()
    processing = Processing(TEMPERATURE, vocab_size=pair.vocab_size)
    print(f"prompt {len(prompt_ids)} tokens + {NEW_TOKENS} generated; torch threads {torch.get_num_threads()}")
    scoring = {}
    for dtype in (torch.float32, torch.bfloat16):
        traces.SCORING_DTYPE = dtype
        for name, model in (("target", pair.target), ("draft", pair.draft)):
            _, wall, cpu = timed(lambda: traces.next_token_probs(model, prompt_ids, tokens, processing))
            scoring[(name, dtype)] = (wall, cpu)
            print(f"score {name:6s} in {str(dtype):15s}: {wall:7.1f} s wall, {cpu:7.1f} s CPU")
    for name in ("target", "draft"):
        fast, slow = scoring[(name, torch.float32)], scoring[(name, torch.bfloat16)]
        print(f"{name}: bfloat16 / float32 scoring time: {slow[0] / fast[0]:.2f} (wall), {slow[1] / fast[1]:.2f} (CPU)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", nargs="?", choices=("exact", "scoring"), default="exact")
    parser.add_argument("--rows", choices=("bf16", "float64"), default="bf16")
    parser.add_argument("--positions", type=int, default=NEW_TOKENS)
    parser.add_argument("--num-drafts", type=lambda text: [int(x) for x in text.split(",")], default=[2, 3, 4, 6])
    parser.add_argument("--tail-budget", type=float, default=DEFAULT_TAIL_BUDGET)
    parser.add_argument("--seed", type=int, default=0)
    record.add_output(parser, None, "write the exact part's figures here")
    args = parser.parse_args()
    (bench_exact if args.part == "exact" else bench_scoring)(args)


if __name__ == "__main__":
    main()
