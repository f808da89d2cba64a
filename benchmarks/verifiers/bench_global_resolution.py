"""What one Global Resolution verification costs at a real vocabulary, against RRS, K-SEQ and
one argsort of the row, as ratios measured side by side.

Rows: V = 151,936, the target a softmax of standard normal logits times 3 (its top tokens
carry most of the mass), the draft the target to the power 0.8 times log-normal noise
(σ = 0.5), renormalised; n i.i.d. drafts from the draft. For each n of ``--num-drafts`` one
verification (``verify_with_uniforms`` on one row, checks included) of global_resolution, rrs
and kseq and one ``np.argsort`` of the row are timed in turn, ``--repeats`` rounds
interleaved, and each one's median is divided by the argsort's. Writes the medians, the
ratios and the settings to ``--output`` (a ``benchmarks.record`` envelope).

    python -m benchmarks.verifiers.bench_global_resolution --repeats 15
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from benchmarks import record
from specbound.verifiers import get_verifier

VOCAB = 151_936
VERIFIERS = ("global_resolution", "rrs", "kseq")


def rows(rng: np.random.Generator):
    """(target, draft) [1, V]: the module docstring's realistic pair."""
    logits = 3.0 * rng.standard_normal(VOCAB)
    target = np.exp(logits - logits.max())
    target /= target.sum()
    draft = target ** 0.8 * np.exp(0.5 * rng.standard_normal(VOCAB))
    return target[None], (draft / draft.sum())[None]


def timed(work) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def measure(num_drafts: int, repeats: int, rng: np.random.Generator) -> dict:
    target, draft = rows(rng)
    tokens = rng.choice(VOCAB, size=(1, num_drafts), p=draft[0])
    uniforms = rng.random((1, num_drafts + 1))
    cases = {name: (lambda v=get_verifier(name): v.verify_with_uniforms(target, draft, tokens, uniforms))
             for name in VERIFIERS}
    cases["argsort"] = lambda: np.argsort(target[0])
    for work in cases.values():  # compile and warm every path first
        work()
    seconds = {name: [] for name in cases}
    for _ in range(repeats):
        for name, work in cases.items():
            seconds[name].append(timed(work))
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    return {"num_drafts": num_drafts, "median_seconds": medians,
            "per_argsort": {name: medians[name] / medians["argsort"] for name in VERIFIERS}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-drafts", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    record.add_output(parser, "verifiers/global_resolution_cost.json")
    arguments = parser.parse_args()
    rng = np.random.default_rng(arguments.seed)
    results = [measure(n, arguments.repeats, rng) for n in arguments.num_drafts]
    for result in results:
        ratios = "  ".join(f"{name} {ratio:5.2f}×" for name, ratio in result["per_argsort"].items())
        print(f"n = {result['num_drafts']}: argsort {1e3 * result['median_seconds']['argsort']:.1f} ms; "
              f"per argsort: {ratios}")
    record.write(arguments.output, {"vocab": VOCAB, "repeats": arguments.repeats, "seed": arguments.seed,
                                    "results": results})
    print(f"wrote {arguments.output}")


if __name__ == "__main__":
    main()
