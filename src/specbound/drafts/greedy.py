"""Greedy drafts [HU] and SpecHub pairs [SPECHUB] (SPEC.md §4.1), with their common optimum.

- **greedy**: the n − 1 most probable tokens T of q deterministically, then one token
  drawn from q restricted to the rest, q′(x) = q(x)·1[x ∉ T]/(1 − q(T));
- **SpecHub pairs** (n = 2): with the hub a = argmax q, first ~ q; the second is a, or
  ~ q(·|≠a) when the first is a. Its draft *set* {a, z}, z ~ q′ with T = {a}, has the
  greedy law for n = 2.

Their draft sets are T plus one x ~ q′ outside T, so Q(H) = [T ⊆ H]·q′(H ∖ T) and the
subset formula has the closed form (``greedy_optimum``)
    α*_greedy = p(T) + Σ_{x∉T} min(p(x), q′(x)),
which the greedy verifier and SpecHub attain [HU, SPECHUB]. Ties go to the lower token id (``top_tokens``).
Letters: p = target, q = draft (SPEC.md §0).
"""

from __future__ import annotations

import numpy as np

from specbound.bounds import OptimalAcceptance
from specbound.compiled import compiled
from specbound.drafts.base import DraftScheme, register_scheme, support_tokens
from specbound.probability import pairwise_sum, sample_from, sample_from_torch, top_tokens, uniforms_torch, zeroed


def restricted_draft(draft: np.ndarray, top: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The top set as a mask and q′ = q·1[∉T]/(1 − q(T)), 1 − q(T) summed from the rest.
    # draft [batch, vocab], top [batch, n−1] -> in_top [batch, vocab] bool, q′ [batch, vocab]"""
    in_top = np.zeros(draft.shape, dtype=bool)
    np.put_along_axis(in_top, top, True, axis=-1)
    rest = np.where(in_top, 0.0, draft)
    return in_top, rest / rest.sum(axis=1, keepdims=True)


def greedy_optimum(target: np.ndarray, draft: np.ndarray, top: np.ndarray) -> OptimalAcceptance:
    """α* = p(T) + Σ_{x∉T} min(p(x), q′(x)) for the draft set T ∪ {x ~ q′} [HU] and its
    certificate (``greedy_closed_form``).  # target, draft [batch, vocab], top [batch, n−1] -> OptimalAcceptance"""
    subset = np.empty(draft.shape, dtype=bool)
    acceptance = greedy_closed_form(np.ascontiguousarray(target, dtype=np.float64),
                                    np.ascontiguousarray(draft, dtype=np.float64),
                                    np.ascontiguousarray(top, dtype=np.int64), subset)
    return OptimalAcceptance(acceptance, subset)


@compiled(error_model="numpy")
def greedy_closed_form(target, draft, top, subset):
    """Per row, α* = 1 − (Σ_{x∉T} (q′(x) − p(x))+ − p(T))+ with q′ = q·1[∉T]/Σ_{y∉T} q(y)
    (the rest summed, not 1 − q(T)), and the certificate H* = T ∪ {x ∉ T : p(x) < q′(x)}
    written into ``subset`` (∅ where that gives no loss), since the subset formula gives
    1 + p(T) − Σ_{x∉T} (q′ − p)+ there. One elementwise pass and three sums, each in
    numpy's order (``probability.pairwise_sum``): the values of the numpy expression of
    these formulas, bit for bit.
    # target, draft [batch, vocab], top [batch, n−1] int64, subset (out) [batch, vocab] bool -> [batch]"""
    batch, vocab_size = draft.shape
    acceptance = np.empty(batch)
    rest, shortfall, top_target = np.empty(vocab_size), np.empty(vocab_size), np.zeros(vocab_size)
    for row in range(batch):
        target_row, subset_row = target[row], subset[row]
        for token in range(vocab_size):  # not rest[:] = draft[row], whose shape check compiles
            rest[token] = draft[row, token]  # numba's error formatting (seconds, on a first call)
        for token in top[row]:
            rest[token] = 0.0
        rest_mass = pairwise_sum(rest, 0, vocab_size)
        for token in range(vocab_size):
            gap = rest[token] / rest_mass - target_row[token]
            shortfall[token] = gap if gap >= 0.0 or gap != gap else 0.0  # np.maximum(gap, 0.0)
            subset_row[token] = gap > 0.0
        for token in top[row]:
            shortfall[token] = 0.0
            top_target[token] = target_row[token]
            subset_row[token] = True
        loss = pairwise_sum(shortfall, 0, vocab_size) - pairwise_sum(top_target, 0, vocab_size)
        for token in top[row]:
            top_target[token] = 0.0
        if not loss > 0.0:
            subset_row[:] = False
        acceptance[row] = 1.0 - (loss if loss >= 0.0 or loss != loss else 0.0)
    return acceptance


@register_scheme
class GreedyDrafts(DraftScheme):
    name = "greedy"
    label = "greedy"
    description = "the n-1 most probable tokens of q, then one draw from q over the rest [HU]"
    needs_distinct_support = True

    def _sample(self, draft, num_drafts, rng):
        top = top_tokens(draft, num_drafts - 1)
        last = sample_from(zeroed(draft, top), rng.random(draft.shape[0]))
        return np.concatenate([top, last[:, None]], axis=1)

    def _sample_torch(self, draft_probs, num_drafts, generator):
        import torch

        top = top_tokens(draft_probs, num_drafts - 1)
        uniforms = uniforms_torch(draft_probs.shape[0], generator, draft_probs)
        last = sample_from_torch(draft_probs.scatter(1, top, 0.0), uniforms)[:, None]
        return torch.cat([top, last], dim=1)

    def _enumerate(self, draft_row, num_drafts):
        top = top_tokens(draft_row[None, :], num_drafts - 1)[0]
        lasts = [token for token in support_tokens(draft_row) if token not in set(top.tolist())]
        rest_mass = draft_row[lasts].sum()  # = 1 − q(T), without cancellation
        tuples = [tuple(top.tolist()) + (token,) for token in lasts]
        probs = [draft_row[token] / rest_mass for token in lasts]
        return np.array(tuples, dtype=np.int64).reshape(len(tuples), num_drafts), np.array(probs)

    def _optimum(self, rows, num_drafts):
        return greedy_optimum(rows.target, rows.draft, rows.top(num_drafts - 1))


@register_scheme
class SpecHubPairs(DraftScheme):
    name = "spechub"
    label = "SpecHub pairs"
    description = "first ~ q; second = hub argmax q, or ~ q(.|not hub) if first is the hub [SPECHUB]"
    needs_distinct_support = True
    fixed_num_drafts = 2

    def _sample(self, draft, num_drafts, rng):
        hub = top_tokens(draft, 1)
        first = sample_from(draft, rng.random(draft.shape[0]))
        other = sample_from(zeroed(draft, hub), rng.random(draft.shape[0]))
        second = np.where(first == hub[:, 0], other, hub[:, 0])
        return np.stack([first, second], axis=1)

    def _sample_torch(self, draft_probs, num_drafts, generator):
        import torch

        hub = top_tokens(draft_probs, 1)
        uniforms = uniforms_torch((draft_probs.shape[0], 2), generator, draft_probs)
        first = sample_from_torch(draft_probs, uniforms[:, 0])[:, None]
        other = sample_from_torch(draft_probs.scatter(1, hub, 0.0), uniforms[:, 1])[:, None]
        second = torch.where(first == hub, other, hub)
        return torch.cat([first, second], dim=1)

    def _enumerate(self, draft_row, num_drafts):
        hub = int(top_tokens(draft_row[None, :], 1)[0, 0])
        others = [token for token in support_tokens(draft_row) if token != hub]
        others_mass = draft_row[others].sum()  # = 1 − q(hub), without cancellation
        tuples, probs = [], []
        for token in others:
            tuples += [(hub, token), (token, hub)]
            probs += [draft_row[hub] * draft_row[token] / others_mass, draft_row[token]]
        return np.array(tuples, dtype=np.int64), np.array(probs)

    def _optimum(self, rows, num_drafts):
        return greedy_optimum(rows.target, rows.draft, rows.top(1))
