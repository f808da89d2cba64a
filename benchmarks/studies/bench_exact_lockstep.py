"""Two versions of the acceptance study's exact part side by side, a position at a time.

On a machine whose speed drifts by tens of percent within minutes (a shared 2-core VM), runs
of minutes each compare the drift as much as the code, even in ABBA order. Here two
processes, one per source tree (``PYTHONPATH``), each with the study workers' allocator
(``_worker_setup``) and warmed on two positions, take the same kept rows a position at a
time in lockstep: A then B on one position, B then A on the next. Each times the unit's exact
part on its position (``unit_exact_part``: the tail cuts and every method at n = 2, 3, 4, 6)
in CPU time of its own process, so both sides meet the same spells, position by position.
A position is timed as the study's pool computes it: where ``unit_exact_part`` defers a method
a row can refuse by estimate (``defer``), deferred — its values come only in a
second round when no row of the unit refuses it, which real units do not reach (RRS without
replacement at n ≥ 4); a version before that computes it at every row that passes.

Rows come from ``bench_study_real_rows --save-rows FILE.npz`` (one generation of the default
pair, as a study unit gets its rows):

    git worktree add /tmp/before <commit>
    python -m benchmarks.studies.bench_exact_lockstep --before /tmp/before/src --after src \\
        --rows p0.npz p1.npz p2.npz p3.npz --output FILE.json

Prints each file's seconds on both sides and their ratio, then the totals and the seconds per
128-token unit on one process (the study runs two workers: ``bench_study_real_rows --workers 2``).
The timing processes run this file as a script on their tree alone (``--serve``), so it imports
``benchmarks.record`` only in the parent.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

COUNTS = [2, 3, 4, 6]
UNIT_TOKENS = 128


def serve() -> None:
    """One side: read 'FILE INDEX' lines, answer each with the CPU seconds of that position's exact part."""
    import inspect

    from specbound.studies.acceptance import DEFAULT_TAIL_BUDGET, acceptance_methods, unit_exact_part
    try:
        from specbound.studies.exact_part import _worker_setup
    except ImportError:  # a tree from before the exact part had a module of its own
        from specbound.studies.acceptance import _worker_setup

    # A worker ends with its parent where the tree's setup takes one (the trees compared may predate it).
    _worker_setup(*([os.getppid()] if inspect.signature(_worker_setup).parameters else []))
    methods = list(acceptance_methods())
    deferring = {"defer": True} if "defer" in inspect.signature(unit_exact_part).parameters else {}
    loaded = {}
    print("ready", flush=True)
    for line in sys.stdin:
        path, index = line.split()
        if path not in loaded:
            rows = np.load(path)
            loaded[path] = (rows["target_rows"], rows["draft_rows"])
            if len(loaded) == 1:  # warm: the loops' machine code loaded, the allocator's pool grown
                unit_exact_part(methods, COUNTS, DEFAULT_TAIL_BUDGET, *(side[:2] for side in loaded[path]))
        target, draft = loaded[path]
        position = slice(int(index), int(index) + 1)
        started = time.process_time()
        unit_exact_part(methods, COUNTS, DEFAULT_TAIL_BUDGET, target[position], draft[position], **deferring)
        print(time.process_time() - started, flush=True)


class Side:
    def __init__(self, name: str, source: Path):
        self.name = name
        environment = dict(os.environ, PYTHONPATH=str(source.resolve()))
        self.process = subprocess.Popen([sys.executable, __file__, "--serve"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, env=environment)
        if self.process.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{name}: the timing process did not start")

    def seconds(self, path: Path, index: int) -> float:
        self.process.stdin.write(f"{path} {index}\n")
        self.process.stdin.flush()
        return float(self.process.stdout.readline())

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--before", type=Path, help="the source folder (…/src) of the version before")
    parser.add_argument("--after", type=Path, help="the source folder of the version after")
    parser.add_argument("--rows", type=Path, nargs="+", help="files of bench_study_real_rows --save-rows")
    parser.add_argument("--output", type=Path, help="write the figures here (a benchmarks.record envelope)")
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    for option in ("before", "after", "rows"):
        if getattr(args, option) is None:
            parser.error(f"--{option}: required")
    for source in (args.before, args.after):
        if not (source / "specbound").is_dir():
            parser.error(f"--before/--after: no specbound package in {source}")
    for path in args.rows:
        if not path.is_file():
            parser.error(f"--rows: no file {path}")
    from benchmarks import record

    sides = [Side("before", args.before), Side("after", args.after)]
    files, totals, positions = {}, {"before": 0.0, "after": 0.0}, 0
    try:
        for path in args.rows:
            count = np.load(path)["target_rows"].shape[0]
            seconds = {"before": 0.0, "after": 0.0}
            for index in range(count):
                for side in sides if index % 2 == 0 else sides[::-1]:
                    seconds[side.name] += side.seconds(path.resolve(), index)
            files[str(path)] = {"positions": count, **seconds, "ratio": seconds["after"] / seconds["before"]}
            positions += count
            for name in totals:
                totals[name] += seconds[name]
            print(f"{path}: {count} positions, before {seconds['before']:.2f} s, after {seconds['after']:.2f} s, "
                  f"after/before {seconds['after'] / seconds['before']:.3f}", flush=True)
    finally:
        for side in sides:
            side.close()
    per_unit = {name: value / positions * UNIT_TOKENS for name, value in totals.items()}
    print(f"{positions} positions: before {totals['before']:.2f} s, after {totals['after']:.2f} s, after/before "
          f"{totals['after'] / totals['before']:.3f}; per 128-token unit on one process {per_unit['before']:.2f} → "
          f"{per_unit['after']:.2f} s")
    if args.output:
        record.write(args.output, {"before": args.before, "after": args.after, "files": files, "positions": positions,
                                   "seconds": totals, "per_128_token_unit_one_process": per_unit,
                                   "ratio": totals["after"] / totals["before"]})


if __name__ == "__main__":
    main()
