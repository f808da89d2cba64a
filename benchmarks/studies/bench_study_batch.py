"""A study one unit at a time against the same study in batches, side by side.

Runs the acceptance study (``specbound study acceptance``: autoregressive generation, then
one scoring forward per model and the exact acceptances) on the same prompts and seeds
at ``--batch-size 1`` and at each size of ``--batch-sizes``, in rounds: each round extends
every run's results folder by ``--round`` prompts (the study's own resume), one batch size
after the other, so that load drift hits them alike. Reports per batch size

- generation tokens/s: the tokens generated over the seconds the units spent generating
  (each unit's share of its batch: ``timings.jsonl``'s ``generate``);
- study units/hour: units over the whole wall time of the run (scoring and the exact
  computations included, which do not batch);
- whether the records equal those of the one-at-a-time run, unit for unit (tokens and
  every acceptance): a batch must not change what a unit records.

Writes the table and the settings to ``--output`` (a ``benchmarks.record`` envelope) and
prints the table in Markdown.

    python -m benchmarks.studies.bench_study_batch --limit 16 --round 8 --batch-sizes 8 --max-new-tokens 64
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import record
from specbound.datasets import load_prompts
from specbound.models.pair import load_pair
from specbound.studies.acceptance import AcceptanceStudy
from specbound.studies.records import read_results
from specbound.studies.runner import run_study


def unit_records(directory: Path) -> dict:
    """unit key -> (its tokens, its acceptances), from the position records."""
    results = read_results(directory)
    records: dict = {}
    for position in results.positions:
        key = (position["prompt_id"], position["temperature"], position["num_drafts"])
        records.setdefault(key, []).append((position["position"], position["token"],
                                            sorted(position["acceptance"].items())))
    return {key: sorted(values) for key, values in records.items()}


def generation_seconds(directory: Path) -> float:
    return sum(seconds["generate"] for seconds in read_results(directory).timings.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="default-target")
    parser.add_argument("--draft", default="default-draft")
    parser.add_argument("--dataset", default="humaneval")
    parser.add_argument("--limit", type=int, default=16, help="prompts in all")
    parser.add_argument("--round", type=int, default=8, help="prompts added to every run per round")
    parser.add_argument("--batch-sizes", default="8", help="batch sizes compared with 1, comma-separated")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--num-drafts", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    record.add_output(parser, "studies/study_batch.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sizes = [1] + [int(size) for size in args.batch_sizes.split(",") if int(size) != 1]

    pair = load_pair(args.target, args.draft, progress=False)
    prompts = load_prompts(args.dataset, limit=args.limit)
    study = AcceptanceStudy(temperatures=(args.temperature,), num_drafts=(args.num_drafts,),
                            max_new_tokens=args.max_new_tokens, workers=1)
    scratch = Path(tempfile.mkdtemp(prefix="bench-study-batch-"))
    folders = {size: scratch / f"batch-{size}" for size in sizes}
    walls = dict.fromkeys(sizes, 0.0)
    try:
        for end in range(args.round, args.limit + args.round, args.round):
            for size in sizes:
                started = time.perf_counter()
                run_study(study, pair, prompts[:min(end, args.limit)], folders[size], args.dataset, args.seed,
                          progress=False, batch_size=size)
                walls[size] += time.perf_counter() - started
                print(f"round of {min(end, args.limit)} prompts, batch {size}: {walls[size]:.0f} s so far",
                      file=sys.stderr)
        reference = unit_records(folders[1])
        rows = []
        for size in sizes:
            records = unit_records(folders[size])
            tokens = sum(len(values) for values in records.values())
            generating = generation_seconds(folders[size])
            rows.append({"batch_size": size, "units": len(records), "tokens": tokens,
                         "generation_seconds": generating, "wall_seconds": walls[size],
                         "generation_tokens_per_second": tokens / generating,
                         "units_per_hour": 3600 * len(records) / walls[size],
                         "records_equal_batch_1": records == reference})
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    base = rows[0]
    record.write(args.output, {"rows": rows, "settings": vars(args)})
    print(f"{record.machine()['cpu_model']}; {args.limit} {args.dataset} prompts × {args.max_new_tokens} tokens, "
          f"T = {args.temperature}, {args.threads} threads")
    print("| batch | generation tokens/s | × batch 1 | study units/hour | × batch 1 | records = batch 1 |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['batch_size']} | {row['generation_tokens_per_second']:.2f} | "
              f"{row['generation_tokens_per_second'] / base['generation_tokens_per_second']:.2f} | "
              f"{row['units_per_hour']:.0f} | {row['units_per_hour'] / base['units_per_hour']:.2f} | "
              f"{'yes' if row['records_equal_batch_1'] else 'NO'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
