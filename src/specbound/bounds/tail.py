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

from specbound.bounds.subset import restricted_order, scan_order
from specbound.probability import top_tokens


@dataclass(frozen=True)
class TailCut:
    """One row pair after the cut for one n: the kept tokens' renormalised laws, the
    dropped masses δp, δq, the bound B on the move and the kept tokens' ids."""

    target: np.ndarray  # [kept]
    draft: np.ndarray  # [kept]
    dropped_target: float
    dropped_draft: float
    bound: float
    tokens: np.ndarray  # [kept] ascending


def tail_factors(draft: np.ndarray, counts, largest=None) -> dict[int, float]:
    """n -> Σ_{i<n} 1/(1 − S_i) for every n of ``counts``, S_i the mass of the draft's i
    largest tokens, from one selection of the largest ones (``largest``: the draft's most
    probable tokens, most probable first, at least max(counts) − 1 of them, when the caller
    has them); 1 − S_i is summed from the other tokens (a peaked row can hold q(top) = 1.0
    beside 1e-17 tokens, where 1.0 − S_1 would be 0). # draft [vocab] -> {n: float}"""
    size = min(max(counts) - 1, draft.size - 1)
    if size > 0:
        largest = top_tokens(draft[None, :], size)[0] if largest is None else largest[:size]
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
    the budget; the octave is the float's exponent field), which costs O(vocab) instead of a
    sort. What does not depend on n is computed once for all n: the octaves' masses, and the
    tokens the largest cut keeps (a larger tail factor drops fewer octaves, so each cut keeps
    a subset of the next larger's). The n largest draft tokens and the largest target token
    are never dropped.
    # [vocab], [vocab] -> {n: TailCut}"""
    likely = np.maximum(target, draft).astype(np.float64, copy=False)
    if budget <= 0:
        keep = likely > 0
        kept = _renormalised(target, draft, keep)
        return {count: TailCut(*kept, float(target[~keep].sum()), float(draft[~keep].sum()),
                               float(target[~keep].sum()), np.flatnonzero(keep)) for count in counts}
    largest = top_tokens(draft[None, :], min(max(counts), draft.size))[0]
    factors = tail_factors(draft, counts, largest)
    protected = np.concatenate([[np.argmax(target)], largest])
    octave = (likely.view(np.uint64) >> np.uint64(52)).astype(np.int64)  # 0: zeros and subnormals
    droppable = (likely <= budget) & (likely > 0)  # a dropped token alone adds p + factor·q ≥ max(p, q)
    free = droppable.copy()
    free[protected] = False
    free_octave = octave[free]
    target_mass = np.bincount(free_octave, weights=target[free], minlength=2048)
    draft_mass = np.bincount(free_octave, weights=draft[free], minlength=2048)
    drop_from, extras = {}, {}  # n -> octaves below it are dropped; the draft tokens free at n only
    for count in counts:
        extras[count] = np.array([token for token in largest[count:] if droppable[token] and token != protected[0]],
                                 dtype=np.int64)
        weights = target_mass + factors[count] * draft_mass
        np.add.at(weights, octave[extras[count]], target[extras[count]] + factors[count] * draft[extras[count]])
        drop_from[count] = int(np.searchsorted(np.cumsum(weights), budget, side="right"))
    # the widest cut's tokens: every cut keeps a subset of them
    never = np.iinfo(np.int64).max
    rank = np.where(droppable, octave, never)  # a token is kept by the cuts dropping octaves up to its rank
    rank[protected] = never
    rank[likely <= 0] = -1  # p = q = 0: dropped by every cut
    widest = np.flatnonzero(rank >= min(drop_from.values()))
    widest_rank, widest_target, widest_draft = rank[widest], target[widest], draft[widest]
    position = np.full(draft.size, -1)
    position[widest] = np.arange(widest.size)
    cuts = {}
    for count in counts:
        kept = widest_rank >= drop_from[count]
        extra = extras[count]
        kept[position[extra]] = octave[extra] >= drop_from[count]
        dropped_extra = extra[octave[extra] < drop_from[count]]
        kept_target, kept_draft = widest_target[kept], widest_draft[kept]
        dropped_target = float(target_mass[: drop_from[count]].sum() + target[dropped_extra].sum())
        dropped_draft = float(draft_mass[: drop_from[count]].sum() + draft[dropped_extra].sum())
        cuts[count] = TailCut(kept_target / kept_target.sum(), kept_draft / kept_draft.sum(), dropped_target,
                              dropped_draft, dropped_target + factors[count] * dropped_draft, widest[kept])
    return cuts


def scan_guesses(cuts: dict[int, TailCut]) -> dict[int, np.ndarray | None]:
    """n -> a guess of the scan order of n's cut (``subset.scan_order``), all from one sort:
    the scan order of the cut that keeps the most tokens, restricted to each cut whose
    tokens are among its own (None for another). The cuts renormalise the same p and q by
    constants, which keeps the order of p/q except where two ratios round differently
    (within a few ulps of each other), so the guess is checked where it is used.
    # {n: TailCut [kept]} -> {n: [1, kept] int or None}"""
    widest = max(cuts.values(), key=lambda cut: cut.tokens.size)
    order = scan_order(widest.target[None], widest.draft[None])
    member = np.zeros(widest.tokens[-1] + 1 if widest.tokens.size else 0, dtype=bool)
    guesses = {}
    for count, cut in cuts.items():
        if np.array_equal(cut.tokens, widest.tokens):
            guesses[count] = order
            continue
        inside = cut.tokens[cut.tokens < member.size]
        member[:] = False
        member[inside] = True
        kept = member[widest.tokens]
        nested = inside.size == cut.tokens.size == kept.sum()
        guesses[count] = restricted_order(order[0], kept)[None] if nested else None
    return guesses


def cut_tail(target: np.ndarray, draft: np.ndarray, budget: float, num_drafts: int):
    """``cut_tails`` for one n, as a tuple.
    # [vocab], [vocab] -> [k] target, [k] draft, δp, δq, B"""
    cut = cut_tails(target, draft, budget, [num_drafts])[num_drafts]
    return cut.target, cut.draft, cut.dropped_target, cut.dropped_draft, cut.bound


def _renormalised(target, draft, kept):
    kept_target, kept_draft = target[kept], draft[kept]
    return kept_target / kept_target.sum(), kept_draft / kept_draft.sum()
