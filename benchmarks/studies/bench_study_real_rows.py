"""The acceptance study's exact part on real rows: one generation of the default pair on the
llama.cpp backend (autoregressive, T = 0.7), the target rows the engine sampled from and the
draft rows of one draft forward over the text, exactly as a study unit gets them
(``studies.traces``), then each step of the unit's exact part timed alone
(``bench_study_scoring.step_seconds``: the tail cut for all n, then every method at each n).

llama.cpp's rows are float32 softmaxes with almost every value distinct (about 148,000 of
151,936 per row), unlike the bf16-rounded rows ``bench_study_scoring --rows bf16`` stands
for, so the steps cost differently here; this measures the study as it runs on the default
backend. Needs the embedded pair (``pip install -e ".[models]"``), except with ``--rows``:
``--save-rows FILE.npz`` keeps the generated rows, ``--rows FILE.npz`` times the steps on kept
rows without loading a model (the same rows before and after a change).

    python -m benchmarks.studies.bench_study_real_rows --dataset mt_bench --positions 6 --output FILE.json
    python -m benchmarks.studies.bench_study_real_rows --positions 16 --save-rows /tmp/rows.npz
    python -m benchmarks.studies.bench_study_real_rows --rows /tmp/rows.npz --output FILE.json
    python -m benchmarks.studies.bench_study_real_rows --rows /tmp/rows.npz --workers 2 --repeats 3

``--workers N`` times the unit's exact part as a study runs it instead (``AcceptanceStudy.exact``:
N worker processes, each position a task), the best of ``--repeats`` runs after one untimed
run that starts the workers, and gives it per 128-token unit. A record (``benchmarks.record``)
goes to ``--output`` where one is named.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks import record
from benchmarks.studies.bench_study_scoring import step_seconds
from specbound.datasets import load_prompts
from specbound.engine import Processing
from specbound.engine.methods import build_method
from specbound.models.pair import load_pair
from specbound.studies import traces
from specbound.studies.acceptance import DEFAULT_TAIL_BUDGET, AcceptanceStudy, acceptance_methods

UNIT_TOKENS = 128  # Hu et al.'s tokens per prompt: a study unit


def generated_rows(dataset: str, positions: int, threads: int | None, seed: int, prompt_index: int = 0):
    """(target rows, draft rows) [positions, vocab] of one autoregressive generation of the
    default pair on prompt ``prompt_index`` (0: the first) of ``dataset``, as a study unit gets them."""
    pair = load_pair("default-target", "default-draft", progress=False, backend="llama.cpp", threads=threads)
    processing = Processing(temperature=0.7, vocab_size=pair.vocab_size)
    prompt = pair.encode(load_prompts(dataset, limit=prompt_index + 1)[prompt_index].text)
    request = traces.TraceRequest(processing, build_method("autoregressive"), positions)
    trace = traces.generate_traces(pair, request, [prompt], [torch.Generator().manual_seed(seed)])[0]
    draft_rows = traces.next_token_probs(pair.draft, trace.prompt_ids, trace.tokens, processing)
    return trace.target_rows(), np.asarray(draft_rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="mt_bench")
    parser.add_argument("--positions", type=int, default=6, help="tokens generated: the unit's positions")
    parser.add_argument("--num-drafts", type=lambda text: [int(x) for x in text.split(",")], default=[2, 3, 4, 6])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompt-index", type=int, default=0, help="which prompt of --dataset (0: the first)")
    record.add_output(parser, None, "write the figures here")
    parser.add_argument("--save-rows", type=Path, help="keep the generated target and draft rows here (.npz)")
    parser.add_argument("--rows", type=Path, help="time the steps on rows kept by --save-rows; loads no model")
    parser.add_argument("--workers", type=int,
                        help="time the whole exact part on this many workers, as a study runs it")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of --workers (the best is reported)")
    args = parser.parse_args()
    if args.workers is not None and args.workers < 1:
        parser.error(f"--workers: must be at least 1, got {args.workers}")
    if args.repeats < 1:
        parser.error(f"--repeats: must be at least 1, got {args.repeats}")
    if args.prompt_index < 0:
        parser.error(f"--prompt-index: must be at least 0, got {args.prompt_index}")

    if args.rows:
        with np.load(args.rows) as kept:
            target_rows, draft_rows = kept["target_rows"], kept["draft_rows"]
            args.dataset, args.seed = str(kept["dataset"]), int(kept["seed"])
    else:
        target_rows, draft_rows = generated_rows(args.dataset, args.positions, args.threads, args.seed,
                                                 args.prompt_index)
    if args.save_rows:
        np.savez(args.save_rows, target_rows=target_rows, draft_rows=draft_rows, dataset=args.dataset, seed=args.seed)
    if args.workers:
        unit_on_workers(target_rows, draft_rows, args)
        return
    distinct = [int(len(np.unique(row))) for row in target_rows]
    # the first position once untimed: loads (or compiles) the compiled kernels, as each study worker does once
    step_seconds(target_rows[:1], draft_rows[:1], args.num_drafts, list(acceptance_methods()), DEFAULT_TAIL_BUDGET)
    seconds = step_seconds(target_rows, draft_rows, args.num_drafts, list(acceptance_methods()), DEFAULT_TAIL_BUDGET)
    print(f"{record.machine()['cpu_model']}; {len(target_rows)} positions of {args.dataset}; distinct values per target row "
          f"{min(distinct)}–{max(distinct)}")
    for step, wall in sorted(seconds.items(), key=lambda item: -item[1]):
        print(f"{wall:9.2f} s  {step}")
    total = sum(seconds.values())
    print(f"{total:9.2f} s  all steps ({total / len(target_rows):.2f} s per position, one worker)")
    if args.output:
        record.write(args.output, {"dataset": args.dataset, "rows": args.rows, "positions": len(target_rows),
                                   "seed": args.seed, "distinct_values_per_target_row": distinct, "seconds": seconds})


def unit_on_workers(target_rows, draft_rows, args) -> None:
    """The exact part of the rows as a study unit runs it on ``args.workers`` processes: one
    untimed run (starts the workers, loads their compiled loops), then the wall of each of
    ``args.repeats`` runs."""
    study = AcceptanceStudy(num_drafts=args.num_drafts, methods=list(acceptance_methods()),
                            tail_budget=DEFAULT_TAIL_BUDGET, workers=args.workers)
    study.exact(target_rows, draft_rows)
    walls = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        study.exact(target_rows, draft_rows)
        walls.append(time.perf_counter() - started)
    positions = len(target_rows)
    per_unit = min(walls) / positions * UNIT_TOKENS
    print(f"{record.machine()['cpu_model']}; {positions} positions of {args.dataset}, {args.workers} workers: "
          f"{' / '.join(f'{wall:.2f}' for wall in walls)} s; best {per_unit:.2f} s per {UNIT_TOKENS}-token unit")
    if args.output:
        record.write(args.output, {"dataset": args.dataset, "rows": args.rows, "positions": positions, "seed": args.seed,
                                   "workers": args.workers, "walls": walls, "seconds_per_128_token_unit": per_unit})


if __name__ == "__main__":
    main()
