"""What block and traversal verification cost at a real vocabulary, and how that grows with it.

Block verification of a chain of γ = 8 drafts (``verify_tree`` and ``expected_accepted``)
and traversal verification of a 3×3 tree drawn without replacement (13 nodes, 12 draws:
``ScoredTree`` from trusted rows, ``verify_tree`` and ``stop_probabilities``) are both
O(draws·V), vectorised over the vocabulary. This times each at V = 151,936 and at its
halves (the median of ``--repeats``) and prints the seconds per million (node, token)
entries, which stays about level when the cost is linear in V. Writes the timings and the
settings to ``--output`` (a ``benchmarks.record`` envelope).

    python -m benchmarks.verifiers.bench_multistep_verifiers --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from benchmarks import record
from specbound.verifiers import ScoredTree, get_verifier

GAMMA = 8
TREE_PARENTS = [-1, 0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]  # 3×3: the root, 3 children, 3 each below them


def block_case(vocab: int, rng: np.random.Generator):
    """A chain of γ drafts, each from a draft row half the target's; the work to time."""
    target = rng.dirichlet(np.full(vocab, 0.05), size=GAMMA + 1)
    draft = 0.5 * target[:GAMMA] + 0.5 * rng.dirichlet(np.full(vocab, 0.05), size=GAMMA)
    tree = ScoredTree.chain(0, [int(rng.choice(vocab, p=row)) for row in draft], target, draft)
    block = get_verifier("block")
    uniforms = rng.random(GAMMA + 1)
    return lambda: (block.verify_tree(tree, uniforms), block.expected_accepted(tree))


def traversal_case(vocab: int, rng: np.random.Generator):
    """A 3×3 tree without replacement under uniform draft rows; building it is timed too."""
    children = {node: tuple(rng.choice(vocab, size=3, replace=False).tolist()) for node in range(4)}
    tokens = [0, *(token for node in range(4) for token in children[node])]
    target = rng.dirichlet(np.full(vocab, 0.05), size=len(TREE_PARENTS))
    draft = np.full((len(TREE_PARENTS), vocab), 1.0 / vocab)
    traversal = get_verifier("traversal")
    uniforms = rng.random(len(TREE_PARENTS))

    def run():
        tree = ScoredTree(TREE_PARENTS, tokens, children, "without_replacement", draft, target, check_rows=False)
        return traversal.verify_tree(tree, uniforms), traversal.stop_probabilities(tree)

    return run


CASES = {"block γ=8": (block_case, GAMMA + 1), "traversal 3×3": (traversal_case, len(TREE_PARENTS))}


def median_seconds(work, repeats: int) -> float:
    work()  # warm-up
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        timings.append(time.perf_counter() - started)
    return statistics.median(timings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab-sizes", default="37984,75968,151936")
    parser.add_argument("--repeats", type=int, default=5)
    record.add_output(parser, "verifiers/multistep_verifiers.json")
    args = parser.parse_args()
    rows = []
    for name, (case, nodes) in CASES.items():
        for vocab in (int(size) for size in args.vocab_sizes.split(",")):
            seconds = median_seconds(case(vocab, np.random.default_rng(0)), args.repeats)
            per_million = seconds / (nodes * vocab) * 1e6
            rows.append({"case": name, "vocab": vocab, "nodes": nodes, "seconds": seconds,
                         "seconds_per_million_entries": per_million})
            print(f"{name:14s} V = {vocab:7,d}: {seconds * 1000:7.1f} ms  ({per_million * 1000:.1f} ms per 10⁶ entries)")
    record.write(args.output, {"rows": rows, "settings": vars(args)})


if __name__ == "__main__":
    main()
