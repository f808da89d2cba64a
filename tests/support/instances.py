"""Test instances: the public SPEC §4.4 fixtures and random (target, draft) pairs with zeros;
and the exact mass of drafts without replacement by enumeration, which several bounds tests
compare against."""

import numpy as np

FIXTURE_A = (np.array([0.4, 0.3, 0.2, 0.1]), np.array([0.1, 0.2, 0.3, 0.4]))
FIXTURE_B = (np.array([0.5, 0.25, 0.15, 0.07, 0.03]), np.array([0.3, 0.3, 0.2, 0.1, 0.1]))
FIXTURE_OPTIMUM = {
    # (fixture, scheme, n): the α* rows of SPEC.md §4.4 (spechub = greedy with n = 2); the optimal
    # verifier (the LP) reaches each
    ("A", "with_replacement", 2): 0.790000,
    ("A", "with_replacement", 3): 0.871000,
    ("A", "without_replacement", 2): 0.834524,
    ("A", "without_replacement", 3): 1.000000,
    ("A", "greedy", 2): 0.766667,
    ("A", "greedy", 3): 0.933333,
    ("A", "spechub", 2): 0.766667,
    ("A", "with_replacement", 1): 0.600000,
    ("B", "with_replacement", 2): 1.0,
    ("B", "with_replacement", 3): 1.0,
    ("B", "without_replacement", 2): 1.0,
    ("B", "without_replacement", 3): 1.0,
    ("B", "greedy", 2): 1.0,
    ("B", "greedy", 3): 1.0,
    ("B", "with_replacement", 1): 0.800000,
}


def random_pair(rng: np.random.Generator, vocab: int, concentration: float = 0.7, zeros: bool = True):
    """A (target, draft) pair from Dirichlet(concentration), with some exact zeros in each."""
    target = rng.dirichlet(np.full(vocab, concentration))
    draft = rng.dirichlet(np.full(vocab, concentration))
    if zeros and vocab > 3:
        target[rng.integers(vocab)] = 0.0
        draft[rng.integers(vocab)] = 0.0
    return target / target.sum(), draft / draft.sum()


def without_replacement_prefix_mass(draft, num_drafts):
    """Q(H_k) for every prefix by enumerating ordered draws depth first, each step
    renormalised by the sum of the unused masses (not 1 − used, which cancels badly next
    to a dominant token). A draw sequence lies in H_k iff its largest token is < k."""
    mass = np.zeros(len(draft) + 1)

    def extend(prob, unused, largest, depth):
        if depth == num_drafts:
            mass[largest + 1 :] += prob
            return
        unused_mass = sum(draft[token] for token in unused)
        for token in unused:
            rest = [other for other in unused if other != token]
            extend(prob * draft[token] / unused_mass, rest, max(largest, token), depth + 1)

    extend(1.0, [int(token) for token in np.flatnonzero(draft > 0)], -1, 0)
    return mass
