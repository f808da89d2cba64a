"""Drafts drawn without replacement: x_1 ~ q, each next ~ q renormalised over the unused
tokens (SPEC.md §4.1); equivalently the first n arrivals of an exponential race.

Q(H) = P(n draws without replacement all land in H), exactly (SPEC.md §4.2):
- n = 1: q(H);
- n = 2: Σ_{x∈H} q(x)(q(H) − q(x))/(1 − q(x)) = q(H)² − q(H^c) Σ_{x∈H} q(x)²/(1 − q(x))
  (no cancellation as H grows to the vocabulary; 1 − q(x) as the mass of the other tokens;
  the largest token's term is q(x)²·(q(H^c)/(1 − q(x))), a share of the rest, which does
  not overflow beside a rest of 1e-310);
- n ≥ 3: the exponential-race integral (``specbound.bounds.race``).
Letters: q = draft (SPEC.md §0).
"""

from __future__ import annotations

import itertools

import numpy as np

from specbound.bounds.race import race_all_in_mass, race_mass_bounds
from specbound.bounds.subset import prefix_scan_optimum, prefix_sums
from specbound.compiled import compiled
from specbound.drafts.base import DraftScheme, register_scheme, support_tokens
from specbound.probability import largest_and_the_rest, sample_from_torch, uniforms_torch


@register_scheme
class WithoutReplacement(DraftScheme):
    name = "without_replacement"
    label = "without replacement"
    description = "n sequential draws from q, each renormalised over unused tokens"
    needs_distinct_support = True

    def _sample(self, draft, num_drafts, rng):
        # Exponential race: E_x / q(x) with E_x ~ Exp(1); arrival order = sequential sampling
        # without replacement. Zero-probability tokens never arrive: NaN sorts after every
        # arrival, also after a tiny q's E/q that overflows to ∞ (q = 1e-310 in float64,
        # 1e-44 in float32), which would otherwise tie with them.
        with np.errstate(divide="ignore", over="ignore"):
            arrival = np.where(draft > 0, rng.standard_exponential(draft.shape) / draft, np.nan)
        return np.argsort(arrival, axis=-1, kind="stable")[:, :num_drafts]

    def _sample_torch(self, draft_probs, num_drafts, generator):
        # Sequentially, as the scheme is defined: each draft by inverse CDF from q with the
        # drafts before it zeroed (a zero-weight token is never drawn, so the drafts are
        # distinct). n running sums over the vocabulary cost less than the race's one
        # exponential draw per token.
        import torch

        uniforms = uniforms_torch((draft_probs.shape[0], num_drafts), generator, draft_probs)
        weights, drawn = draft_probs, []
        for rank in range(num_drafts):
            drawn.append(sample_from_torch(weights, uniforms[:, rank]))
            if rank + 1 < num_drafts:
                weights = weights.scatter(1, drawn[-1][:, None], 0.0)
        return torch.stack(drawn, dim=1)

    def _enumerate(self, draft_row, num_drafts):
        tuples = list(itertools.permutations(support_tokens(draft_row), num_drafts))
        probs = []
        for draft_tuple in tuples:
            prob, unused = 1.0, draft_row > 0
            for token in draft_tuple:
                # the unused mass summed directly: 1 − used loses digits next to a dominant token
                prob *= draft_row[token] / draft_row[unused].sum()
                unused[token] = False
            probs.append(prob)
        return np.array(tuples, dtype=np.int64), np.array(probs)

    def all_in_mass(self, draft_in_order, num_drafts):
        if num_drafts == 1:
            return prefix_sums(draft_in_order)
        if num_drafts == 2:
            draft_in_order = np.ascontiguousarray(draft_in_order, dtype=np.float64)
            mass = np.empty((draft_in_order.shape[0], draft_in_order.shape[1] + 1))
            for row in range(draft_in_order.shape[0]):
                _pair_all_in_mass(draft_in_order[row], mass[row])
            return mass
        return np.stack([race_all_in_mass(row, num_drafts) for row in draft_in_order])

    def _optimum(self, rows, num_drafts):
        if num_drafts <= 2:
            return super()._optimum(rows, num_drafts)
        # the race only where its bounds from the n = 2 closed form leave a prefix a chance
        return prefix_scan_optimum(
            rows,
            lambda ordered, needed: np.stack([race_all_in_mass(row, num_drafts, mask)
                                              for row, mask in zip(ordered, needed)]),
            mass_bounds=lambda ordered, inside: race_mass_bounds(ordered, num_drafts, self.all_in_mass(ordered, 2),
                                                                 inside),
        )


@compiled(error_model="numpy")
def _pair_all_in_mass(draft, mass):
    """Q_2(H_k) = q(H)² − q(H^c) Σ_{x∈H} q(x)²/(1 − q(x)) on every prefix H_k of ``draft``'s
    order, in one pass (the module docstring's n = 2 form): q(H) summed from the head,
    q(H^c) from the tail, 1 − q(x) as the mass of the other tokens; the largest token's term
    is q(x)²·(q(H^c)/(1 − q(x))), added once the prefix holds it (none when the others are 0).
    # [vocab] -> writes [vocab + 1]"""
    size = draft.size
    total, largest, others_of_largest = largest_and_the_rest(draft)
    outside = np.empty(size + 1)  # q(H_k^c), from the tail
    outside[size] = 0.0
    for k in range(size - 1, -1, -1):
        outside[k] = outside[k + 1] + draft[k]
    inside = squares = 0.0
    for k in range(size + 1):
        top_term = 0.0
        if k > largest and others_of_largest > 0:
            top_term = draft[largest] ** 2 * (outside[k] / others_of_largest)
        mass[k] = inside**2 - outside[k] * squares - top_term
        if k < size:
            inside += draft[k]
            if k != largest:
                squares += draft[k] ** 2 / (total - draft[k])
