"""The tail cut: drop a row pair's least likely tokens with a proven bound on the move of
Σ min(p, q) and of every α* (used by the studies before their exact computations).

Letters: p = target, q = draft (SPEC.md §0). The cut drops the tokens of smallest
max(p, q), renormalised, as many as keep

    B = δp + δq·Σ_{i<n} 1/(1 − S_i)

within a budget — δp, δq the dropped masses, S_i the mass of q's i largest tokens; one cut
per number of drafts n. Why B bounds the move: p ↦ p' is a TV move of δp; draft i falls in
the dropped set with probability at most δq/(1 − S_i) given the earlier draws (without
replacement their mass leaves the denominator), and given it does not, the cut law draws
the same — so the n-draft law moves by at most δq·Σ 1/(1 − S_i), and Σ min(p, q) and every
α* by at most B (the studies' tests check B for every verifier as well). The n largest
draft tokens and the largest target token are never dropped (the greedy scheme's fixed
drafts and the support size stay). A budget of 0 drops only tokens where p = q = 0: exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specbound.probability import top_tokens


@dataclass(frozen=True)
class TailCut:
    """One row pair after the cut for one n: the kept tokens' renormalised laws, the
    dropped masses δp, δq and the bound B on the move."""

    target: np.ndarray  # [kept]
    draft: np.ndarray  # [kept]
    dropped_target: float
    dropped_draft: float
    bound: float


def tail_factors(draft: np.ndarray, counts) -> dict[int, float]:
    """n -> Σ_{i<n} 1/(1 − S_i) for every n of ``counts``, S_i the mass of the draft's i
    largest tokens, from one selection of the largest ones; 1 − S_i is summed from the
    other tokens (a peaked row can hold q(top) = 1.0 beside 1e-17 tokens, where 1.0 − S_1
    would be 0). # draft [vocab] -> {n: float}"""
    size = min(max(counts) - 1, draft.size - 1)
    if size > 0:
        largest = top_tokens(draft[None, :], size)[0]
        top = draft[largest][::-1]  # ascending
        rest = np.delete(draft, largest).sum()  # mass outside the top n − 1
    else:
        top, rest = np.zeros(0), draft.sum()
    # 1 − S_i = rest + the top tokens from i on: i = size, size − 1, ..., 0
    outside = rest + np.concatenate([[0.0], np.cumsum(top)])
    running = np.cumsum(1.0 / np.maximum(outside[::-1], 1e-300))  # i = 0, 1, ...
    return {count: float(running[min(count, draft.size) - 1]) for count in counts}


def tail_factor(draft: np.ndarray, num_drafts: int) -> float:
    """Σ_{i<n} 1/(1 − S_i) (``tail_factors``). # [vocab] -> float"""
    return tail_factors(draft, [num_drafts])[num_drafts]


def cut_tails(target: np.ndarray, draft: np.ndarray, budget: float, counts) -> dict[int, TailCut]:
    """The cut of one row pair for every n of ``counts``: drop the least likely tokens while
    B = δp + δq·tail_factor(n) ≤ ``budget``; renormalise.

    Tokens are dropped by octaves of max(p, q) (all below 2^k for the largest k that fits
    the budget), which costs O(vocab) instead of a sort; what does not depend on n (the
    octaves, their masses) is computed once for all n. The n largest draft tokens and the
    largest target token are never dropped.
    # [vocab], [vocab] -> {n: TailCut}"""
    likely = np.maximum(target, draft)
    keep = likely > 0
    if budget <= 0:
        kept = _renormalised(target, draft, keep)
        return {count: TailCut(*kept, float(target[~keep].sum()), float(draft[~keep].sum()),
                               float(target[~keep].sum())) for count in counts}
    factors = tail_factors(draft, counts)
    droppable = (likely <= budget) & keep  # a dropped token alone adds p + factor·q ≥ max(p, q)
    droppable[np.argmax(target)] = False
    largest = top_tokens(draft[None, :], min(max(counts), draft.size))[0]
    candidates = np.flatnonzero(droppable)
    octave = np.floor(np.log2(likely[candidates])).astype(np.int64)  # token in [2^o, 2^(o+1))
    octave -= octave.min() if octave.size else 0
    cuts = {}
    for count in counts:
        protected = largest[: min(count, draft.size)]
        free = np.ones(candidates.size, dtype=bool)
        free[np.searchsorted(candidates, protected[droppable[protected]])] = False
        weights = target[candidates[free]] + factors[count] * draft[candidates[free]]
        move = np.cumsum(np.bincount(octave[free], weights=weights))
        dropped_octaves = int(np.searchsorted(move, budget, side="right"))  # octaves 0 .. k−1 fit
        kept = keep.copy()
        kept[candidates[free & (octave < dropped_octaves)]] = False
        dropped_target, dropped_draft = float(target[~kept].sum()), float(draft[~kept].sum())
        cuts[count] = TailCut(*_renormalised(target, draft, kept), dropped_target, dropped_draft,
                              dropped_target + factors[count] * dropped_draft)
    return cuts


def cut_tail(target: np.ndarray, draft: np.ndarray, budget: float, num_drafts: int):
    """``cut_tails`` for one n, as a tuple.
    # [vocab], [vocab] -> [k] target, [k] draft, δp, δq, B"""
    cut = cut_tails(target, draft, budget, [num_drafts])[num_drafts]
    return cut.target, cut.draft, cut.dropped_target, cut.dropped_draft, cut.bound


def _renormalised(target, draft, kept):
    kept_target, kept_draft = target[kept], draft[kept]
    return kept_target / kept_target.sum(), kept_draft / kept_draft.sum()
