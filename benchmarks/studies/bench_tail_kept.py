"""How many tokens the acceptance study's tail cut keeps (``specbound.bounds.tail.cut_tails``)
on real rows, per number of drafts n: the size every exact computation of a position works
on. Not a timing: the same rows give the same counts on any machine (the rows themselves
come from the machine's llama.cpp kernels, so the record's envelope keeps the machine).

Rows come from ``bench_study_real_rows --save-rows FILE.npz`` (one generation of the
default pair, as a study unit gets its rows); several files pool their positions:

    python -m benchmarks.studies.bench_study_real_rows --dataset mmlu --positions 128 --prompt-index 1 --save-rows p1.npz
    python -m benchmarks.studies.bench_tail_kept --rows p0.npz p1.npz p2.npz p3.npz --output FILE.json

Run it at two commits (``PYTHONPATH=<worktree>/src``) to compare two cuts on the same rows.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from benchmarks import record
from specbound.bounds.tail import cut_tails
from specbound.studies.acceptance import DEFAULT_TAIL_BUDGET


def kept_counts(files: list[Path], counts: list[int], budget: float) -> dict[int, list[int]]:
    """n -> the kept tokens of every position of every file, in order."""
    kept = {count: [] for count in counts}
    for path in files:
        rows = np.load(path)
        for target, draft in zip(rows["target_rows"], rows["draft_rows"]):
            for count, cut in cut_tails(target, draft, budget, counts).items():
                kept[count].append(int(cut.tokens.size))
    return kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=Path, nargs="+", required=True,
                        help="files of bench_study_real_rows --save-rows")
    parser.add_argument("--num-drafts", type=lambda text: [int(x) for x in text.split(",")], default=[2, 3, 4, 6])
    parser.add_argument("--tail-budget", type=float, default=DEFAULT_TAIL_BUDGET)
    record.add_output(parser, None, "write the figures here")
    args = parser.parse_args()
    for path in args.rows:
        if not path.is_file():
            parser.error(f"--rows: no file {path}")
    kept = kept_counts(args.rows, args.num_drafts, args.tail_budget)
    summary = {count: {"mean": float(np.mean(values)), "min": min(values), "max": max(values)}
               for count, values in kept.items()}
    positions = len(kept[args.num_drafts[0]])
    print(f"{positions} positions of {len(args.rows)} files, budget {args.tail_budget:g}; kept tokens per row:")
    for count, figures in summary.items():
        print(f"  n = {count}: mean {figures['mean']:,.0f}, {figures['min']:,}–{figures['max']:,}")
    if args.output:
        record.write(args.output, {"files": args.rows, "tail_budget": args.tail_budget, "positions": positions,
                                   "kept": summary})


if __name__ == "__main__":
    main()
