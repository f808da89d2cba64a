"""The tail cut: drop a row pair's least likely tokens with a proven bound on the move of
Σ min(p, q) and of every α* (used by the studies before their exact computations).

Letters: p = target, q = draft (SPEC.md §0). For n drafts, the cut drops the tokens of
smallest weight w = p + F_n·q, F_n = Σ_{i<n} 1/(1 − S_i) (the tail factor), renormalised,
as many as keep

    B = δp + δq·F_n = Σ_dropped w

within a budget — δp, δq the dropped masses, S_i the mass of q's i largest tokens; one cut
per number of drafts n. Why B bounds the move: p ↦ p' is a TV move of δp; draft i falls in
the dropped set with probability at most δq/(1 − S_i) given the earlier draws (without
replacement their mass leaves the denominator), and given it does not, the cut law draws
the same — so the n-draft law moves by at most δq·F_n, and Σ min(p, q) and every α* by at
most B (the studies' tests check B for every verifier as well). B is a sum over the dropped
tokens of their weights, so dropping the lightest first drops the most tokens any cut
within the budget can (up to the levels the weights are grouped in). The n largest draft
tokens and the largest target token are never dropped (the greedy scheme's fixed drafts
and the support size stay). A budget of 0 drops only tokens where p = q = 0: exact.
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
    """The cut of one row pair for every n of ``counts``: drop the lightest tokens
    (w = p + F_n·q, ``token_weight``) while B = Σ_dropped w = δp + δq·F_n ≤ ``budget``;
    renormalise.

    Tokens are dropped by levels of w, a 16th of an octave each (all below the highest
    level edge that fits the budget; the level is the float's exponent and leading mantissa
    bits, ``level_of``), which costs O(vocab) instead of a sort: one pass sums the levels'
    masses for every n (``level_masses``), one marks each token with the cuts that keep it,
    a bit per n (``cut_marks``, up to ``MARKS_PER_PASS`` n a pass), and one per n collects
    the tokens marked for it (``marked_tokens``). The n largest draft tokens and the largest
    target token are never dropped. The cuts of different n need not be nested (a larger
    F_n weighs the draft's tail more, the target's less).
    # [vocab], [vocab] -> {n: TailCut}"""
    if budget <= 0:
        keep = np.maximum(target, draft) > 0
        kept = _renormalised(target, draft, keep)
        return {count: TailCut(*kept, float(target[~keep].sum()), float(draft[~keep].sum()),
                               float(target[~keep].sum()), np.flatnonzero(keep)) for count in counts}
    counts = list(counts)
    largest = top_tokens(draft[None, :], min(max(counts), draft.size))[0]
    factors = tail_factors(draft, counts, largest)
    target = np.ascontiguousarray(target, dtype=np.float64)
    draft = np.ascontiguousarray(draft, dtype=np.float64)
    protected = np.concatenate([[np.argmax(target)], largest]).astype(np.int64)
    budget = float(budget)
    ascending = sorted(set(counts), key=lambda count: factors[count])
    masses = level_masses(target, draft, np.array([factors[count] for count in ascending]), budget,
                          _segment_ends(protected, draft.size))
    dropped, drop_belows = {}, {}  # n -> (δp, δq, B), the least weight kept
    for count in counts:
        factor = factors[count]
        target_mass, draft_mass = masses[:, ascending.index(count)].T
        free = largest[count:][largest[count:] != protected[0]]  # the draft tokens free at n only
        free_weight = token_weight(target[free], draft[free], factor)
        droppable = (free_weight > 0) & (free_weight <= budget)
        extra, extra_level = free[droppable], level_of(free_weight[droppable])
        drop_from = first_level_kept(target_mass, draft_mass, factor, extra_level, free_weight[droppable], budget)
        dropped_extra = extra[extra_level < drop_from]
        dropped_target = float(target_mass[:drop_from].sum() + target[dropped_extra].sum())
        dropped_draft = float(draft_mass[:drop_from].sum() + draft[dropped_extra].sum())
        # the least weight of level drop_from (∞ past the finite levels)
        drop_belows[count] = float(np.uint64(min(drop_from << LEVEL_SHIFT, INFINITY_BITS)).view(np.float64))
        dropped[count] = (dropped_target, dropped_draft, dropped_target + factor * dropped_draft)
    cuts = {}
    for start in range(0, len(counts), MARKS_PER_PASS):
        group = counts[start : start + MARKS_PER_PASS]
        marks = cut_marks(target, draft, np.array([factors[count] for count in group]), budget,
                          np.array([drop_belows[count] for count in group]))
        for bit, count in enumerate(group):  # a protected token is kept where it has mass
            mine = protected[: count + 1]
            marks[mine] = (marks[mine] & ~np.uint8(1 << bit)) | ((np.maximum(target[mine], draft[mine]) > 0) << bit)
        for bit, count in enumerate(group):
            tokens, kept_target, kept_draft = marked_tokens(marks, bit, target, draft)
            kept_target /= kept_target.sum()
            kept_draft /= kept_draft.sum()
            cuts[count] = TailCut(kept_target, kept_draft, *dropped[count], tokens)
    return {count: cuts[count] for count in counts}


@compiled
def token_weight(target, draft, factor):
    """A token's weight w = p + F·q, its share of B, for floats or arrays alike (F is finite:
    ``tail_factors`` caps each 1/(1 − S_i) at 1e300, so a token without draft mass weighs
    its p). # float or [tokens] x2, float -> the same"""
    return target + factor * draft


def level_of(weights: np.ndarray) -> np.ndarray:
    """The level of a weight w ≥ 0: its float's bits above the mantissa's ``LEVEL_SHIFT``
    lowest, the biased exponent and the mantissa's leading bits; levels rise with the value.
    # [tokens] -> [tokens] int"""
    return (weights.view(np.uint64) >> np.uint64(LEVEL_SHIFT)).astype(np.int64)


@compiled
def level_masses(target, draft, factors, budget, ends):
    """For each tail factor F of ``factors`` (ascending): Σ p and Σ q over the droppable
    tokens (0 < w ≤ ``budget``, w = p + F·q: a dropped token alone adds w to B) but the
    protected ones, per level of w (``level_of``), each summed in id order, up to the
    budget's level. ``ends``: the protected tokens ascending, then V (``_segment_ends``).
    A token's weight grows with F, so one too heavy at the first factor is at every
    factor; a level's sums for every F lie side by side (a token's weights often share
    a level).
    # [vocab] x2, [counts], float, [protected + 1] int -> [levels, counts, 2] (Σ p, Σ q)"""
    levels = (np.array([budget]).view(np.uint64)[0] >> np.uint64(LEVEL_SHIFT)) + np.uint64(1)
    masses = np.zeros((levels, factors.size, 2))
    weight = np.empty(1)
    weight_bits = weight.view(np.uint64)
    start = 0
    for stop in ends:
        for token in range(start, stop):
            target_value, draft_value = target[token], draft[token]
            for index in range(factors.size):
                weight[0] = token_weight(target_value, draft_value, factors[index])
                if not weight[0] <= budget:
                    break
                if weight[0] > 0:
                    level = weight_bits[0] >> np.uint64(LEVEL_SHIFT)
                    masses[level, index, 0] += target_value
                    masses[level, index, 1] += draft_value
        start = max(start, stop + 1)
    return masses


@compiled
def first_level_kept(target_mass, draft_mass, factor, extra_level, extra_weight, budget):
    """The lowest level the cut at tail factor F keeps: the first whose running sum of the
    levels' weights passes the budget (the levels below it fit). A level weighs
    Σ p + F·Σ q over its tokens (``level_masses``) plus the weights ``extra_weight`` of the
    free draft tokens in it (``extra_level``), added in their order, the sums running from
    level 0 — those of ``np.cumsum`` and ``np.searchsorted(..., side="right")``, bit for bit.
    # [levels] x2, float, [extra] int, [extra], float -> int"""
    weights = np.empty(target_mass.size)
    for level in range(target_mass.size):
        weights[level] = target_mass[level] + factor * draft_mass[level]
    for index in range(extra_level.size):
        weights[extra_level[index]] += extra_weight[index]
    running = 0.0
    for level in range(weights.size):
        running += weights[level]
        if running > budget:
            return level
    return weights.size


MARKS_PER_PASS = 8  # cuts marked in one pass of ``cut_marks``: a bit each of a uint8


@compiled
def cut_marks(target, draft, factors, budget, drop_belows):
    """A token's mark: bit i set where cut i (tail factor ``factors[i]``) keeps it by its
    weight w = p + F·q — w > 0 and not droppable (w ≤ ``budget``) below ``drop_belows[i]``,
    the least weight of the lowest level kept. Protection is the caller's. One cut at a
    time along the vocabulary, which compiles to vector instructions.
    # [vocab] x2, [cuts ≤ 8], float, [cuts] -> [vocab] uint8"""
    marks = np.zeros(target.size, dtype=np.uint8)
    for cut in range(factors.size):
        factor, drop_below, bit = factors[cut], drop_belows[cut], np.uint8(1 << cut)
        for token in range(target.size):
            weight = token_weight(target[token], draft[token], factor)
            kept = (weight > 0) & ((weight > budget) | (weight >= drop_below))
            marks[token] |= bit * np.uint8(kept)
    return marks


@compiled
def marked_tokens(marks, bit, target, draft):
    """The tokens whose mark has ``bit`` set, in id order, with their p and q: counted, then
    each token written at the next free place, which moves on only when it is marked (no
    branch; one place past the last is spare).
    # [vocab] uint8, int, [vocab] x2 -> [kept] int, [kept] x2"""
    kept = 0
    for token in range(marks.size):
        kept += (marks[token] >> bit) & 1
    tokens = np.empty(kept + 1, dtype=np.int64)
    kept = 0
    for token in range(marks.size):
        tokens[kept] = token
        kept += (marks[token] >> bit) & 1
    tokens = tokens[:kept]
    kept_target, kept_draft = np.empty(kept), np.empty(kept)
    for place in range(kept):
        kept_target[place], kept_draft[place] = target[tokens[place]], draft[tokens[place]]
    return tokens, kept_target, kept_draft


def _segment_ends(protected: np.ndarray, size: int) -> np.ndarray:
    """The protected tokens ascending, then ``size``: the ends of the runs of other tokens.
    # [protected] int -> [protected + 1] int"""
    return np.append(np.sort(protected), size).astype(np.int64)


MARK_TYPES = (np.uint8, np.uint16, np.uint32, np.uint64)  # a bit per cut in ``union_members``


def scan_guesses(cuts: dict[int, TailCut], target: np.ndarray, draft: np.ndarray) -> dict[int, np.ndarray | None]:
    """n -> a guess of the scan order of n's cut (``subset.scan_order``), all from one sort:
    the scan order of the tokens any cut keeps (p and q of the row, ``target`` and
    ``draft``), restricted to each cut's tokens. The cuts renormalise the same p and q by
    constants, which keeps the order of p/q except where two ratios round differently
    (within a few ulps of each other), so the guess is checked where it is used. None
    for every cut (each sorted alone) past 64 cuts.
    # {n: TailCut [kept]}, [vocab] x2 -> {n: [1, kept] int or None}"""
    marks = next((np.zeros(target.size, dtype=kind) for kind in MARK_TYPES if np.iinfo(kind).bits >= len(cuts)), None)
    if marks is None or not cuts:
        return {count: None for count in cuts}
    tokens = [cut.tokens for cut in cuts.values()]
    union, members = union_members(np.concatenate(tokens), np.cumsum([0] + [len(kept) for kept in tokens]), marks)
    order = scan_order(target[union][None], draft[union][None])[0]
    return {count: order[None] if cut.tokens.size == union.size else restricted_order(order, kept)[None]
            for (count, cut), kept in zip(cuts.items(), members)}


@compiled
def union_members(tokens, offsets, marks):
    """The union of several sets of token ids (set i: tokens[offsets[i]:offsets[i + 1]]),
    ascending, and which of its tokens each set holds, from a bit per set on each id
    (``marks``: zeros, an id each, of an unsigned type with a bit per set).
    # [Σ sizes] int, [sets + 1] int, [vocab] uint -> [union] int, [sets, union] bool"""
    sets = offsets.size - 1
    one = marks.dtype.type(1)
    for index in range(sets):
        bit = one << marks.dtype.type(index)
        for place in range(offsets[index], offsets[index + 1]):
            marks[tokens[place]] |= bit
    union = np.empty(marks.size, dtype=np.int64)
    count = 0
    for token in range(marks.size):  # each id written, the place moving on where it is marked
        union[count] = token
        count += marks[token] != 0
    members = np.empty((sets, count), dtype=np.bool_)
    for index in range(sets):
        bit = one << marks.dtype.type(index)
        for place in range(count):
            members[index, place] = (marks[union[place]] & bit) != 0
    return union[:count], members


def cut_tail(target: np.ndarray, draft: np.ndarray, budget: float, num_drafts: int):
    """``cut_tails`` for one n, as a tuple.
    # [vocab], [vocab] -> [k] target, [k] draft, δp, δq, B"""
    cut = cut_tails(target, draft, budget, [num_drafts])[num_drafts]
    return cut.target, cut.draft, cut.dropped_target, cut.dropped_draft, cut.bound


def _renormalised(target, draft, kept):
    kept_target, kept_draft = target[kept], draft[kept]
    return kept_target / kept_target.sum(), kept_draft / kept_draft.sum()
