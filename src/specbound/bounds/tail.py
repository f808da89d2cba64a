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
from specbound.compiled import compiled
from specbound.probability import top_tokens

LEVEL_SHIFT = 48  # a level is a 16th of an octave: the exponent and the mantissa's 4 leading bits
INFINITY_BITS = 0x7FF0 << LEVEL_SHIFT


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
        ends = np.sort(largest)  # the mass outside the top n − 1: the row without them, joined from slices
        rest = np.concatenate([draft[start:stop] for start, stop in zip([0, *(ends + 1)], [*ends, draft.size])]).sum()
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

    Tokens are dropped by levels of max(p, q), a 16th of an octave each (all below the
    highest level edge that fits the budget; the level is the float's exponent and leading
    mantissa bits, ``level_of``), which costs O(vocab) instead of a sort: one pass sums the
    levels' masses for every n (``level_masses``), one pass per n collects the tokens its
    cut keeps (``kept_tokens``). The n largest draft tokens and the largest target token are
    never dropped.
    # [vocab], [vocab] -> {n: TailCut}"""
    if budget <= 0:
        keep = np.maximum(target, draft) > 0
        kept = _renormalised(target, draft, keep)
        return {count: TailCut(*kept, float(target[~keep].sum()), float(draft[~keep].sum()),
                               float(target[~keep].sum()), np.flatnonzero(keep)) for count in counts}
    largest = top_tokens(draft[None, :], min(max(counts), draft.size))[0]
    factors = tail_factors(draft, counts, largest)
    target = np.ascontiguousarray(target, dtype=np.float64)
    draft = np.ascontiguousarray(draft, dtype=np.float64)
    protected = np.concatenate([[np.argmax(target)], largest]).astype(np.int64)
    budget = float(budget)
    target_mass, draft_mass = level_masses(target, draft, budget, _segment_ends(protected, draft.size))
    cuts = {}
    for count in counts:
        extra = np.array([token for token in largest[count:] if 0 < max(target[token], draft[token]) <= budget
                          and token != protected[0]], dtype=np.int64)  # the draft tokens free at n only
        extra_level = level_of(np.maximum(target[extra], draft[extra]))
        weights = target_mass + factors[count] * draft_mass
        np.add.at(weights, extra_level, target[extra] + factors[count] * draft[extra])
        drop_from = int(np.searchsorted(np.cumsum(weights), budget, side="right"))  # levels below it are dropped
        dropped_extra = extra[extra_level < drop_from]
        dropped_target = float(target_mass[:drop_from].sum() + target[dropped_extra].sum())
        dropped_draft = float(draft_mass[:drop_from].sum() + draft[dropped_extra].sum())
        # the least value of level drop_from (∞ past the finite levels)
        drop_below = float(np.uint64(min(drop_from << LEVEL_SHIFT, INFINITY_BITS)).view(np.float64))
        tokens, kept_target, kept_draft = kept_tokens(target, draft, budget, drop_below,
                                                      _segment_ends(protected[: count + 1], draft.size))
        kept_target /= kept_target.sum()
        kept_draft /= kept_draft.sum()
        cuts[count] = TailCut(kept_target, kept_draft, dropped_target, dropped_draft,
                              dropped_target + factors[count] * dropped_draft, tokens)
    return cuts


def level_of(likely: np.ndarray) -> np.ndarray:
    """The level of max(p, q): its float's bits above the mantissa's ``LEVEL_SHIFT`` lowest,
    the biased exponent and the mantissa's leading bits; levels rise with the value.
    # [tokens] -> [tokens] int"""
    return (likely.view(np.uint64) >> np.uint64(LEVEL_SHIFT)).astype(np.int64)


@compiled
def level_masses(target, draft, budget, ends):
    """Σ p and Σ q over the droppable tokens (0 < max(p, q) ≤ ``budget``: a dropped token
    alone adds p + factor·q ≥ max(p, q) to B) but the protected ones, per level of
    max(p, q) (``level_of``), each summed in id order, up to the budget's level. ``ends``: the
    protected tokens ascending, then V (``_segment_ends``).
    # [vocab] x2, float, [protected + 1] int -> [levels] x2"""
    levels = (np.array([budget]).view(np.uint64)[0] >> np.uint64(LEVEL_SHIFT)) + np.uint64(1)
    target_mass, draft_mass = np.zeros(levels), np.zeros(levels)
    target_bits, draft_bits = target.view(np.uint64), draft.view(np.uint64)
    start = 0
    for stop in ends:
        for token in range(start, stop):
            target_first = target[token] >= draft[token]
            likely = target[token] if target_first else draft[token]
            if 0 < likely <= budget:
                level = (target_bits[token] if target_first else draft_bits[token]) >> np.uint64(LEVEL_SHIFT)
                target_mass[level] += target[token]
                draft_mass[level] += draft[token]
        start = max(start, stop + 1)
    return target_mass, draft_mass


@compiled
def kept_tokens(target, draft, budget, drop_below, ends):
    """The tokens a cut keeps, in id order, with their p and q: those of max(p, q) > 0 but
    the droppable ones (max(p, q) ≤ ``budget``) below ``drop_below`` (the least value of the
    lowest level kept), unless protected (``ends``: the protected tokens ascending, then V).
    Each token is written at the next free place, which moves on only when it is kept (no
    branch); the results are views of vocabulary-sized buffers (copying them out took as long
    as the pass).
    # [vocab] x2, float, float, [protected + 1] int -> [kept] int, [kept] x2"""
    size = target.size
    tokens = np.empty(size, dtype=np.int64)
    kept_target, kept_draft = np.empty(size), np.empty(size)
    kept = start = 0
    for stop in ends:
        for token in range(start, stop):
            likely = max(target[token], draft[token])
            tokens[kept], kept_target[kept], kept_draft[kept] = token, target[token], draft[token]
            kept += likely > 0 and (likely > budget or likely >= drop_below)
        if start <= stop < size:
            tokens[kept], kept_target[kept], kept_draft[kept] = stop, target[stop], draft[stop]
            kept += max(target[stop], draft[stop]) > 0
        start = max(start, stop + 1)
    return tokens[:kept], kept_target[:kept], kept_draft[:kept]


def _segment_ends(protected: np.ndarray, size: int) -> np.ndarray:
    """The protected tokens ascending, then ``size``: the ends of the runs of other tokens.
    # [protected] int -> [protected + 1] int"""
    return np.append(np.sort(protected), size).astype(np.int64)


def scan_guesses(cuts: dict[int, TailCut]) -> dict[int, np.ndarray | None]:
    """n -> a guess of the scan order of n's cut (``subset.scan_order``), all from one sort:
    the scan order of the cut that keeps the most tokens, restricted to each cut whose
    tokens are among its own (None for another). The cuts renormalise the same p and q by
    constants, which keeps the order of p/q except where two ratios round differently
    (within a few ulps of each other), so the guess is checked where it is used.
    # {n: TailCut [kept]} -> {n: [1, kept] int or None}"""
    widest = max(cuts.values(), key=lambda cut: cut.tokens.size)
    order = scan_order(widest.target[None], widest.draft[None])
    guesses = {}
    for count, cut in cuts.items():
        if np.array_equal(cut.tokens, widest.tokens):
            guesses[count] = order
            continue
        kept, nested = members(cut.tokens, widest.tokens)
        guesses[count] = restricted_order(order[0], kept)[None] if nested else None
    return guesses


@compiled
def members(tokens, among):
    """Which of the tokens ``among`` are in ``tokens`` (distinct ids, ascending), and whether
    every one of ``tokens`` is among them: ``tokens`` marked on the ids, then read at
    ``among``. # [k], [m] int -> [m] bool, bool"""
    size = max(tokens[-1] + 1 if tokens.size else 0, among[-1] + 1 if among.size else 0)
    marked = np.zeros(size, dtype=np.bool_)
    for token in tokens:
        marked[token] = True
    found = np.empty(among.size, dtype=np.bool_)
    matched = 0
    for place in range(among.size):
        found[place] = marked[among[place]]
        matched += found[place]
    return found, matched == tokens.size


def cut_tail(target: np.ndarray, draft: np.ndarray, budget: float, num_drafts: int):
    """``cut_tails`` for one n, as a tuple.
    # [vocab], [vocab] -> [k] target, [k] draft, δp, δq, B"""
    cut = cut_tails(target, draft, budget, [num_drafts])[num_drafts]
    return cut.target, cut.draft, cut.dropped_target, cut.dropped_draft, cut.bound


def _renormalised(target, draft, kept):
    kept_target, kept_draft = target[kept], draft[kept]
    return kept_target / kept_target.sum(), kept_draft / kept_draft.sum()
