"""Drafts drawn without replacement: x_1 ~ q, each next ~ q renormalised over the unused
tokens (SPEC.md §4.1); equivalently the first n arrivals of an exponential race.

Q(H) = P(n draws without replacement all land in H), exactly (SPEC.md §4.2):
- n = 1: q(H);
- n = 2: Σ_{x∈H} q(x)(q(H) − q(x))/(1 − q(x)) = q(H)² − q(H^c) Σ_{x∈H} q(x)²/(1 − q(x))
  (no cancellation as H grows to the vocabulary; 1 − q(x) from ``mass_of_the_others``);
- n ≥ 3: the exponential-race integral (``specbound.bounds.race``).
Letters: q = draft (SPEC.md §0).
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from specbound.bounds.race import race_all_in_mass
from specbound.bounds.subset import prefix_sums
from specbound.drafts.base import DraftScheme, register_scheme, support_tokens
from specbound.probability import mass_of_the_others


@register_scheme
class WithoutReplacement(DraftScheme):
    name = "without_replacement"
    label = "without replacement"
    description = "n sequential draws from q, each renormalised over unused tokens"
    needs_distinct_support = True

    def _sample(self, draft, num_drafts, rng):
        # Exponential race: E_x / q(x) with E_x ~ Exp(1); arrival order = sequential sampling
        # without replacement. Zero-probability tokens never arrive.
        with np.errstate(divide="ignore"):
            arrival = rng.standard_exponential(draft.shape) / draft
        return np.argsort(arrival, axis=-1, kind="stable")[:, :num_drafts]

    def _sample_torch(self, draft_probs, num_drafts, generator):
        arrival = torch.empty_like(draft_probs).exponential_(generator=generator) / draft_probs
        return torch.topk(arrival, num_drafts, dim=-1, largest=False, sorted=True).indices

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
            inside = prefix_sums(draft_in_order)
            outside = np.zeros_like(inside)
            np.cumsum(draft_in_order[:, ::-1], axis=1, out=outside[:, -2::-1])
            squares = draft_in_order**2 / mass_of_the_others(draft_in_order)
            return inside**2 - outside * prefix_sums(squares)
        return np.stack([race_all_in_mass(row, num_drafts) for row in draft_in_order])
