"""Drafts drawn with replacement: x_1..x_n i.i.d. ~ q (SPEC.md §4.1).

Q(H) = q(H)^n, so α* = 1 + min_H [p(H) − q(H)^n]; n = 1 gives Σ min(p, q) [HU].
Letters: q = draft (SPEC.md §0).
"""

from __future__ import annotations

import itertools

import numpy as np

from specbound.compiled import compiled
from specbound.drafts.base import DraftScheme, register_scheme, support_tokens
from specbound.probability import sample_from, sample_from_torch, uniforms_torch


@register_scheme
class WithReplacement(DraftScheme):
    name = "with_replacement"
    label = "with replacement"
    description = "n i.i.d. draws from q"
    needs_distinct_support = False

    def _sample(self, draft, num_drafts, rng):
        uniforms = rng.random((draft.shape[0], num_drafts))
        return np.stack([sample_from(draft, uniforms[:, i]) for i in range(num_drafts)], axis=1)

    def _sample_torch(self, draft_probs, num_drafts, generator):
        # inverse CDF from one running sum, as the numpy path draws: the same law, and a running
        # sum and a search cost far less than torch.multinomial on a vocabulary-sized row
        return sample_from_torch(draft_probs, uniforms_torch((draft_probs.shape[0], num_drafts), generator, draft_probs))

    def _enumerate(self, draft_row, num_drafts):
        tuples = list(itertools.product(support_tokens(draft_row), repeat=num_drafts))
        probs = [float(np.prod(draft_row[list(t)])) for t in tuples]
        return np.array(tuples, dtype=np.int64), np.array(probs)

    def all_in_mass(self, draft_in_order, num_drafts):
        return all_in_power(np.ascontiguousarray(draft_in_order, dtype=np.float64), num_drafts)


@compiled
def all_in_power(draft_in_order, num_drafts):
    """Q(H_k) = q(H_k)^n on every prefix H_k of each row's order, k = 0..V, in one pass:
    q(H_k) summed in order (``subset.prefix_sums``' running sum), raised by n − 1 repeated
    products (float ** int is a slow pow()).  # [rows, vocab] float64, int -> [rows, vocab + 1]"""
    rows, vocab_size = draft_in_order.shape
    mass = np.empty((rows, vocab_size + 1))
    for row in range(rows):
        mass[row, 0] = inside = 0.0
        for token in range(vocab_size):
            inside += draft_in_order[row, token]
            power = inside
            for _ in range(num_drafts - 1):
                power *= inside
            mass[row, token + 1] = power
    return mass
