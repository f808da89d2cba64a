"""Benchmark of the exact optimal acceptance α* (specbound.bounds, SPEC §4.2).

Measures, side by side on this machine:
- the fast prefix scan at Qwen's vocabulary (V = 151,936), n = 4 drafts, on realistic
  peaked rows: median milliseconds per row, one row per call, and per row inside a
  batch of 64 (targets: ≤ 15 ms with replacement, ≤ 300 ms without replacement).
  Wall-clock and process CPU time are both reported: on a shared machine the wall time
  includes waiting for a core, the CPU time does not (numpy runs on one thread here);
- the LP (scipy HiGHS) against the prefix scan at V = 8, n = 3: time ratio per row, and
  the largest disagreement between the two.

Rows: target logits σ·z, draft logits σ·(ρ z + √(1 − ρ²) z′) with z, z′ ~ N(0, I),
ρ = 0.9 (target and draft correlated) and σ drawn per row from [3.4, 4.6], which puts
20-60% of the mass on the top token. Run: ``python -m benchmarks.bounds.bench_bounds`` (add
``--output FILE`` to save the numbers as a ``benchmarks.record`` envelope).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
from tqdm import tqdm

from benchmarks import record
from specbound.drafts import optimal_acceptance, optimal_acceptance_lp

QWEN_VOCAB = 151_936
TARGETS_MS = {"with_replacement": 15.0, "without_replacement": 300.0, "greedy": None}


def peaked_rows(rng: np.random.Generator, batch: int, vocab: int, correlation: float = 0.9):
    """(target, draft) rows [batch, vocab] from softmax of scaled correlated Gaussian logits."""
    scale = rng.uniform(3.4, 4.6, size=(batch, 1))
    shared = rng.standard_normal((batch, vocab))
    own = rng.standard_normal((batch, vocab))
    target_logits = scale * shared
    draft_logits = scale * (correlation * shared + np.sqrt(1 - correlation**2) * own)
    return softmax(target_logits), softmax(draft_logits)


def softmax(logits: np.ndarray) -> np.ndarray:
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    return weights / weights.sum(axis=1, keepdims=True)


def seconds(call) -> tuple[float, float]:
    """(wall-clock, process CPU) seconds of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    call()
    return time.perf_counter() - wall, time.process_time() - cpu


def bench_large_vocabulary(rng, scheme, num_drafts, single_rows, batch):
    target, draft = peaked_rows(rng, max(single_rows, batch), QWEN_VOCAB)
    optimal_acceptance(target[:1], draft[:1], num_drafts, scheme)  # warm-up
    per_row = [
        seconds(lambda i=i: optimal_acceptance(target[i], draft[i], num_drafts, scheme))
        for i in tqdm(range(single_rows), desc=f"{scheme} single rows", file=sys.stderr)
    ]
    batched_wall, batched_cpu = seconds(
        lambda: optimal_acceptance(target[:batch], draft[:batch], num_drafts, scheme)
    )
    acceptance = optimal_acceptance(target[:4], draft[:4], num_drafts, scheme).acceptance
    return {
        "scheme": scheme,
        "vocab": QWEN_VOCAB,
        "num_drafts": num_drafts,
        "median_wall_ms_per_row": 1e3 * statistics.median(wall for wall, _ in per_row),
        "median_cpu_ms_per_row": 1e3 * statistics.median(cpu for _, cpu in per_row),
        "batch": batch,
        "wall_ms_per_row_in_batch": 1e3 * batched_wall / batch,
        "cpu_ms_per_row_in_batch": 1e3 * batched_cpu / batch,
        "target_ms": TARGETS_MS[scheme],
        "top_target_mass": [float(x) for x in target[:4].max(axis=1)],
        "alpha_star_first_rows": [float(x) for x in acceptance],
    }


def bench_lp_ratio(rng, scheme, num_drafts, rows):
    target, draft = peaked_rows(rng, rows, 8)
    lp_times, scan_times, disagreement = [], [], 0.0
    for i in range(rows):
        lp_times.append(seconds(lambda: optimal_acceptance_lp(target[i], draft[i], num_drafts, scheme))[1])
        scan_times.append(seconds(lambda: optimal_acceptance(target[i], draft[i], num_drafts, scheme))[1])
        lp = optimal_acceptance_lp(target[i], draft[i], num_drafts, scheme)[0]
        fast = optimal_acceptance(target[i], draft[i], num_drafts, scheme).acceptance[0]
        disagreement = max(disagreement, abs(lp - fast))
    lp_ms, scan_ms = 1e3 * statistics.median(lp_times), 1e3 * statistics.median(scan_times)
    return {
        "scheme": scheme,
        "vocab": 8,
        "num_drafts": num_drafts,
        "lp_ms_per_row": lp_ms,
        "scan_ms_per_row": scan_ms,
        "lp_over_scan": lp_ms / scan_ms,
        "max_abs_difference": disagreement,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-drafts", type=int, default=4)
    parser.add_argument("--single-rows", type=int, default=15, help="rows timed one per call")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lp-rows", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    record.add_output(parser, None, "also write the numbers here")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)

    large = [
        bench_large_vocabulary(rng, scheme, args.num_drafts, args.single_rows, args.batch)
        for scheme in ["with_replacement", "without_replacement", "greedy"]
    ]
    small = [
        bench_lp_ratio(rng, scheme, 3, args.lp_rows)
        for scheme in ["with_replacement", "without_replacement", "greedy"]
    ]

    print(f"\nα* prefix scan, V = {QWEN_VOCAB:,}, n = {args.num_drafts}, peaked rows (ms per row)")
    print(
        f"{'scheme':<22}{'median wall':>12}{'median CPU':>12}"
        f"{f'wall @ {args.batch}':>12}{f'CPU @ {args.batch}':>12}{'target':>8}"
    )
    for row in large:
        target = "-" if row["target_ms"] is None else f"{row['target_ms']:.0f}"
        print(
            f"{row['scheme']:<22}{row['median_wall_ms_per_row']:>12.1f}"
            f"{row['median_cpu_ms_per_row']:>12.1f}{row['wall_ms_per_row_in_batch']:>12.1f}"
            f"{row['cpu_ms_per_row_in_batch']:>12.1f}{target:>8}"
        )
    print("\nLP (HiGHS) vs prefix scan, V = 8, n = 3 (CPU ms per row)")
    print(f"{'scheme':<22}{'LP ms/row':>11}{'scan ms/row':>13}{'LP / scan':>11}{'max |Δα|':>11}")
    for row in small:
        print(
            f"{row['scheme']:<22}{row['lp_ms_per_row']:>11.3f}{row['scan_ms_per_row']:>13.3f}"
            f"{row['lp_over_scan']:>11.1f}{row['max_abs_difference']:>11.1e}"
        )
    if args.output:
        record.write(args.output, {"large_vocabulary": large, "lp_vs_scan": small})
    return 0


if __name__ == "__main__":
    sys.exit(main())
