"""What running a study on Ray costs on top of the decoding itself (``specbound.studies.distributed``).

Measures, on the cluster at ``--address`` (default: a new local Ray instance):
- **worker start**: seconds from asking for the workers to every worker holding the pair,
  beside what any new Python process pays for the same (specbound's imports, then the
  pair's load, timed in a fresh process started here); the difference is Ray's own share;
- **per batch and per unit**: each batch of an acceptance study sent to one worker at a
  time, the driver's round trip (submit → records back) minus the seconds the worker spent
  decoding it (``runner.run_batch``): scheduling, shipping the units and the records.
With ``--tiny`` the pair is the tiny random-weight pair (``specbound.models.tiny``);
otherwise ``--target``/``--draft`` are loaded by every worker, so each worker needs them
(installed model wheels, or the converted models in its ``$SPECBOUND_CACHE``).
Run: ``python -m benchmarks.studies.bench_ray_overhead --tiny --workers 1`` here, or on a cluster's
head node ``python -m benchmarks.studies.bench_ray_overhead --address auto --limit 8`` (one worker per
node, all its cores).

"""

from __future__ import annotations

import argparse
import functools
import os
import pickle
import statistics
import subprocess
import sys
import time

from specbound.datasets import load_prompts
from specbound.models import DTYPES
from specbound.models.pair import load_pair
from specbound.studies.acceptance import AcceptanceStudy
from specbound.studies.distributed import RayWorkers, import_ray
from specbound.studies.runner import batches

PROBE = """
import pickle, sys, time
started = time.perf_counter()
import specbound.studies.distributed
imported = time.perf_counter()
pickle.load(sys.stdin.buffer)()
print(imported - started, time.perf_counter() - imported)
"""


def fresh_process_start(pair_spec) -> tuple[float, float]:
    """Seconds a new Python process spends on specbound's imports, then on building the pair."""
    result = subprocess.run([sys.executable, "-c", PROBE], input=pickle.dumps(pair_spec), capture_output=True,
                            check=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    imports, load = map(float, result.stdout.split())
    return imports, load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default="local")
    parser.add_argument("--workers", type=int, help="default: one per node")
    parser.add_argument("--cpus-per-worker", type=int, help="default: the smallest node's CPUs")
    parser.add_argument("--tiny", action="store_true", help="the tiny random-weight pair instead of --target/--draft")
    parser.add_argument("--target", default="default-target")
    parser.add_argument("--draft", default="default-draft")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--limit", type=int, default=16, help="prompts (units) sent")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    args = parser.parse_args()

    ray = import_ray()
    options = {}
    if args.tiny:
        from specbound.models.tiny import tiny_pair, tiny_prompts

        pair_spec, prompts = tiny_pair, tiny_prompts(args.limit)
    else:
        pair_spec = functools.partial(load_pair, args.target, args.draft, DTYPES[args.dtype], progress=False)
        prompts = load_prompts("humaneval", args.limit)
    if args.address == "local":
        options["include_dashboard"] = False
    started = time.perf_counter()
    ray.init(address=args.address, log_to_driver=False, **options)
    print(f"ray.init: {time.perf_counter() - started:.2f} s")

    imports, load = fresh_process_start(pair_spec)
    started = time.perf_counter()
    with RayWorkers(pair_spec, num_workers=args.workers, cpus_per_worker=args.cpus_per_worker) as workers:
        start = time.perf_counter() - started
        print(f"{workers.num_workers} workers of {workers.cpus_per_worker} CPUs holding the pair: {start:.2f} s; "
              f"a fresh process: imports {imports:.2f} s, the pair's load {load:.2f} s; "
              f"Ray's own share {start - imports - load:.2f} s")
        study = AcceptanceStudy(temperatures=(0.7,), num_drafts=(2,), max_new_tokens=args.max_new_tokens, workers=1)
        worker, overheads, sizes = workers.workers[0], [], []
        for batch in batches(study, study.units(prompts), args.batch_size):
            sent = time.perf_counter()
            _, seconds_per_unit = ray.get(worker.run.remote(study, batch, 0))
            overheads.append(time.perf_counter() - sent - seconds_per_unit * len(batch))
            sizes.append(len(batch))
        steady = overheads[1:] or overheads  # the first call also warms the worker up
        print(f"{len(overheads)} batches of {args.batch_size}: Ray adds {1000 * statistics.median(steady):.1f} ms "
              f"per batch (median; first {1000 * overheads[0]:.1f} ms), "
              f"{1000 * sum(overheads) / sum(sizes):.1f} ms per unit on average")
    ray.shutdown()


if __name__ == "__main__":
    main()
