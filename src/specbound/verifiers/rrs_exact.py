"""Exact acceptance of recursive rejection sampling *without replacement* (SPEC.md §4.3).

In formula-sized helpers below, p = target and q = draft (SPEC.md §0).

RRS without replacement has no product formula: the draft law after rejecting the set S
is q·1[∉S]/(1 − q(S)), so the acceptance depends on which tokens were rejected. Two
facts keep it computable:

1. A rejected token x has pⁱ(x) < qⁱ(x), so every later residual is zero at x, and the
   residual after any rejections is a threshold of the first one: with
   p² = norm((p − q)+), r = p²/q and G(t) = Σ_y min(p²(y), t·q(y)),
   the residual entering a level is (p² − t·q)+ / (1 − G(t)) for a threshold t that
   starts at 0 and moves to t' = t + (1 − G(t))·s after a level whose draft law is
   s·q off the removed set (s = 1/(1 − q(S))).
2. That level then accepts with (G(t') − G(t)) / (1 − G(t)), and a token x ∉ S is drawn
   and rejected there with probability q(x)·(s − (r(x) − t)+/(1 − G(t)))+; those
   probabilities sum to 1 − (G(t') − G(t))/(1 − G(t)).

So after one sort, each level is a few look-ups in G.

Cost: n ≤ 2 is O(V log V). n = 3 sums over pairs (x1, x2); ``three_draft_bounds``
groups both by draft probability into bins of values, exact where a bin holds one value
and bracketed by monotone and interval bounds where it holds a range, costing
O(V log V + B1·B2) for B1 × B2 bins: one exact pass where both sides have at most
``FIRST_BIN_COUNT`` distinct values (at most 512², a few coarse passes' pairs), else a
certified bracket refined until it is within a tolerance (a bf16 model's softmax: a few
thousand distinct values; llama.cpp's float32 rows: up to ~10^5, closed by 256 bins a side
and, where that is not enough, a few hundred finer x1 bins over ~500 x2 bins). n ≥ 4 uses
the plain recursion, for small vocabularies.

The row's passes, its two sorts (a radix sort on the floats' bits, ``probability.ascending_order``) and
the bracket passes are compiled loops (``specbound.compiled``); sums over the vocabulary are
compensated (``_added``).

Work limits (``three_draft_seconds`` and ``recursion_seconds`` estimate a call, from the
per-operation costs in ``specbound.work_limits``): a row's sorts and curve cost a constant
per token, a bracket pass over B1 × B2 bins and V tokens one per pair of bins and one per
token, holding O(V + B2) memory. A row of more values than ``FIRST_BIN_COUNT`` starts at
``COARSE_BIN_COUNT`` bins a side and refines only the x1 bins that carry the bracket's
width (``_Bins``, ``_widest``): each is cut at the x1 bins of twice its count and bracketed
again over x2 bins of its own, doubled at its first, third, … refinement and wherever it
was not cut.
Refinement stops where the next pass would take the n = 3 computation past
``BRACKET_SECONDS_LIMIT``; the acceptance is then the midpoint of the certified bracket
reached, and a ``BracketWarning`` gives the bracket. The n ≥ 4 recursion (estimated per level
call and per token of the vocabulary; its last two levels are compiled,
``_two_draft_acceptance``), with no bracket to fall back on, is refused (``checks.WorkLimitError``) beyond ``RECURSION_SECONDS_LIMIT``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np

from specbound.checks import WorkLimitError, within_limit
from specbound.compiled import compiled
from specbound.probability import ascending_order, mass_of_the_others, top_tokens
from specbound.work_limits import (
    RRS_SECONDS_PER_BIN_PAIR,
    RRS_SECONDS_PER_LEVEL_TOKEN,
    RRS_SECONDS_PER_PASS_TOKEN,
    RRS_SECONDS_PER_ROW_TOKEN,
)

DEFAULT_TOLERANCE = 1e-10
RECURSION_SECONDS_LIMIT = 20.0
BRACKET_SECONDS_LIMIT = 20.0
SMALLEST_REST = 1e-300  # below, 1/(1 − q(S)) and its sums could overflow: _split_at_first_draft
FIRST_BIN_COUNT = 512  # one exact pass for rows of at most this many values on both sides (above, a pass of
# a bin per value costs more than the coarse one and its refinements)
COARSE_BIN_COUNT = 256  # the first pass's bins a side for rows of more (llama.cpp's float32 rows: ~10^5)
REFINED_WIDTH_SHARE = 0.1  # a refined bin's expected width, of its width before (real rows: 1/13 to 1/29)
REFINEMENT_AIM = 0.9  # of the width allowed, what a refinement aims at
WEIGHING_MARGIN = 1e-12  # below 1 − q(x1), above its rounding: _three_level_arrays


def min_sum_curve(target_row: np.ndarray, draft_row: np.ndarray):
    """G(t) = Σ_y min(p(y), t·q(y)) for any t ≥ 0 (vectorised in t), after one sort.

    G is piecewise linear with breakpoints at the ratios p/q: with j the number of ratios
    ≤ t, G(t) = Σ_{first j} p + t·Σ_{the others} q (``_min_sum_values``); it is Σ_{q>0} p
    beyond the largest ratio. Tokens with q = 0 or p = 0 contribute nothing. The draft mass
    beyond a breakpoint is summed from the tokens beyond it (a difference of running sums
    leaves 1e-17 there, which a ratio of 1e10 turns into an error of 1e-7), and a token
    whose ratio overflows (q below p/1.8e308) contributes t·q(y) at every finite t and p(y)
    at t = ∞.  # target_row, draft_row [vocab]
    """
    curve = _min_sum_arrays(np.ascontiguousarray(target_row, dtype=np.float64),
                            np.ascontiguousarray(draft_row, dtype=np.float64))[0]

    def at(threshold):
        thresholds = np.ascontiguousarray(np.asarray(threshold, dtype=np.float64).ravel())
        values = np.empty_like(thresholds)
        _min_sum_values(curve, thresholds, _new_pieces(1), values)
        return values.reshape(np.shape(threshold))[()]

    return at


@compiled
def _min_sum_arrays(target, draft):
    """The curve G of ``min_sum_curve`` (``_sorted_curve``) from the tokens of p, q > 0.
    # [vocab] x2 -> (curve, [m], [m])"""
    count = 0
    for token in range(target.size):
        if target[token] > 0 and draft[token] > 0:
            count += 1
    targets, drafts = np.empty(count), np.empty(count)
    count = 0
    for token in range(target.size):
        if target[token] > 0 and draft[token] > 0:
            targets[count], drafts[count] = target[token], draft[token]
            count += 1
    return _sorted_curve(targets, drafts)


@compiled(error_model="numpy")
def _sorted_curve(targets, drafts):
    """The curve G of ``min_sum_curve`` as (breakpoints [m] ascending, sums [m + 1, 2],
    steep [2]) from p and q of the tokens of p, q > 0 (which it reorders): with j
    breakpoints p/q ≤ t, G(t) = sums[j, 0] + t·sums[j, 1] + min(steep[0], t·steep[1]),
    sums[j, 0] the target mass of the first j breakpoints (a running sum), sums[j, 1] the
    draft mass of the others (summed from the last), steep the target and draft mass of
    the tokens whose ratio overflows; and p and q at each breakpoint.
    # [k] x2 -> (curve, [m], [m])"""
    ratios, steep = np.empty(targets.size), np.zeros(2)
    count = 0
    for token in range(targets.size):
        ratio = targets[token] / drafts[token]
        if ratio == np.inf:
            steep[0] += targets[token]
            steep[1] += drafts[token]
        else:
            ratios[count], targets[count], drafts[count] = ratio, targets[token], drafts[token]
            count += 1
    order = ascending_order(ratios[:count])
    breakpoints, targets, drafts = ratios[order], targets[order], drafts[order]
    sums = np.zeros((count + 1, 2))
    for place in range(count):
        sums[place + 1, 0] = sums[place, 0] + targets[place]
    for place in range(count - 1, -1, -1):
        sums[place, 1] = sums[place + 1, 1] + drafts[place]
    return (breakpoints, sums, steep), targets, drafts


@compiled
def _min_sum_values(curve, thresholds, pieces, values):
    """Writes G(thresholds[i]) into values[i] from ``_min_sum_arrays``' curve. A piece
    (a row of ``pieces``: from breakpoint, to breakpoint, G = below + t·above there, and the
    number of breakpoints below it) is the linear piece of G a threshold last fell on:
    ``pieces`` [k, 5] holds one per threshold, carried from call to call (thresholds that
    move little between calls), or one row shared by them all (thresholds in sequence). A
    threshold on its piece needs no search; the piece of another is searched for from
    there (``_find_piece``).  # thresholds [k], pieces [k or 1, 5], values [k]"""
    breakpoints, sums, steep = curve
    shared = pieces.shape[0] == 1
    for place in range(thresholds.size):
        piece = 0 if shared else place
        threshold = thresholds[place]
        if not pieces[piece, 0] <= threshold < pieces[piece, 1]:
            _find_piece(breakpoints, sums, threshold, pieces, piece)
        value = pieces[piece, 2]
        if pieces[piece, 3] > 0:  # a finite threshold below the largest breakpoint
            value += threshold * pieces[piece, 3]
        if steep[1] > 0:
            value += min(steep[0], threshold * steep[1])
        values[place] = value


@compiled
def _new_pieces(count):
    """``count`` pieces of ``_min_sum_values`` that hold no threshold: the first threshold
    of each is searched for from the lowest breakpoint.  # -> [count, 5]"""
    pieces = np.zeros((count, 5))
    pieces[:, 0] = np.inf
    pieces[:, 1] = -np.inf
    return pieces


def rrs_without_replacement_acceptance(
    target_row, draft_row, num_drafts: int, tolerance: float = DEFAULT_TOLERANCE
) -> float:
    """α of RRS without replacement for one row; see the module docstring for the method.

    Exact for n ≤ 2 and for n ≥ 4; for n = 3 within ``tolerance`` (the midpoint of a
    certified bracket, exact when the bracket closes). A row whose mass off its n − 1
    largest draft tokens is below ``SMALLEST_REST`` is split at its first draft first
    (``_split_at_first_draft``).
    """
    target_row = np.ascontiguousarray(target_row, dtype=np.float64)
    draft_row = np.ascontiguousarray(draft_row, dtype=np.float64)
    if _splits_at_first_draft(draft_row, num_drafts):
        return _split_at_first_draft(target_row, draft_row, num_drafts, tolerance)
    if num_drafts == 3:
        low, high = three_draft_bounds(target_row, draft_row, tolerance)
        if high - low > 2 * tolerance:
            warnings.warn(BracketWarning(low, high), stacklevel=2)
        return 0.5 * (low + high)
    return _recursive_acceptance(target_row, draft_row, num_drafts)


class BracketWarning(UserWarning):
    """An n = 3 acceptance returned as the midpoint of a certified bracket wider than the
    tolerance: refining it further was beyond ``BRACKET_SECONDS_LIMIT``."""

    def __init__(self, low: float, high: float):
        self.low, self.high = low, high
        super().__init__(
            f"the exact value needs more than the work limit of {BRACKET_SECONDS_LIMIT:g} s here; the "
            f"midpoint of the certified bracket [{low:.12f}, {high:.12f}] (width {high - low:.2g})")


def three_draft_seconds(target_row, draft_row) -> float:
    """Estimated seconds of the n = 3 acceptance of one row, at most
    ``BRACKET_SECONDS_LIMIT`` (where refinement stops): one exact pass where both sides fit
    ``FIRST_BIN_COUNT`` bins, else the coarse pass and one refinement (what real float32
    rows take: ``benchmarks/studies/bench_study_real_rows.py`` times it)."""
    first = len(np.unique(draft_row[draft_row > target_row]))
    second = len(np.unique(draft_row[draft_row > 0]))
    seconds = RRS_SECONDS_PER_ROW_TOKEN * len(draft_row)
    if max(first, second) <= FIRST_BIN_COUNT:
        seconds += bracket_seconds(first, len(draft_row), second)
    else:
        coarse = (min(COARSE_BIN_COUNT, first), min(COARSE_BIN_COUNT, second))
        seconds += bracket_seconds(coarse[0], len(draft_row), coarse[1])
        seconds += bracket_seconds(min(2 * coarse[0], first), len(draft_row), min(2 * coarse[1], second))
    return min(BRACKET_SECONDS_LIMIT, seconds)


def recursion_seconds(rejectable: int, vocab_size: int, num_drafts: int) -> float:
    """Estimated seconds of ``_recursive_acceptance``: one level call per node of the tree
    of rejected tokens above the last two levels, Σ_{k ≤ n−3} rejectable^k calls."""
    levels = num_drafts - 2
    if rejectable <= 1:
        calls = float(levels)
    elif levels * math.log(rejectable) > 700:  # beyond every limit, and beyond float range
        return math.inf
    else:
        calls = (float(rejectable) ** levels - 1) / (rejectable - 1)
    return calls * RRS_SECONDS_PER_LEVEL_TOKEN * (1 + vocab_size)


@compiled
def _rest_off_the_largest(draft_row, count):
    """Σ q over every token but the ``count`` most probable ones (ties to the lower id),
    summed from those tokens themselves.  # [vocab] -> float"""
    count = min(count, draft_row.size)
    largest = np.empty(count, dtype=np.int64)  # most probable first
    for place in range(count):
        largest[place] = -1
    for token in range(draft_row.size):
        place = count
        while place > 0 and (largest[place - 1] < 0 or draft_row[token] > draft_row[largest[place - 1]]):
            place -= 1
        if place < count:
            for later in range(count - 1, place, -1):
                largest[later] = largest[later - 1]
            largest[place] = token
    rest = 0.0
    for token in range(draft_row.size):
        counted = True
        for place in range(count):
            counted = counted and largest[place] != token
        if counted:
            rest += draft_row[token]
    return rest


def _split_at_first_draft(target_row, draft_row, num_drafts, tolerance) -> float:
    """α = Σ min(p, q) + Σ_{x1} (q − p)+(x1)·α_{n−1}(p², q without x1, renormalised), the
    recursion at the first draft, over the n − 1 largest draft tokens x1 only.

    For the rows it is used on, the mass r off those tokens is below ``SMALLEST_REST``
    (subnormal probabilities, q(top) = 1 − 1e-310): once they are drafted and rejected the
    next drafts come from that mass, and the scales 1/(1 − q(S)) of the fast methods
    would overflow. Every other first draft has probability at most r, so leaving its
    branch out changes α by less than 1e-300. Each branch renormalises its draft row,
    whose scales are representable again.  # target_row, draft_row [vocab]"""
    accepted_first = float(np.minimum(target_row, draft_row).sum())
    leftover = np.maximum(target_row - draft_row, 0.0)
    if leftover.sum() <= 0:  # p ≤ q everywhere: the rows agree up to rounding
        return accepted_first
    residual = leftover / leftover.sum()
    acceptance = accepted_first
    for token in top_tokens(draft_row[None, :], num_drafts - 1)[0]:
        rejected = draft_row[token] - target_row[token]
        if rejected > 0:
            rest = np.where(np.arange(len(draft_row)) == token, 0.0, draft_row)
            rest /= _mass_without(draft_row, draft_row >= 0, np.array([token]))[0]
            acceptance += rejected * rrs_without_replacement_acceptance(residual, rest, num_drafts - 1, tolerance)
    return acceptance


def recursion_refusal(target_row, draft_row, num_drafts: int) -> str | None:
    """Why ``rrs_without_replacement_acceptance`` refuses this row by its work estimate
    (n ≥ 4: the recursion past ``RECURSION_SECONDS_LIMIT``, the ``checks.WorkLimitError``'s
    message), None where it computes it — one count of the rejectable tokens, no recursion.
    A row split at its first draft (``_split_at_first_draft``) is left to the computation:
    None.  # [vocab] x2 -> str or None"""
    target_row = np.ascontiguousarray(target_row, dtype=np.float64)
    draft_row = np.ascontiguousarray(draft_row, dtype=np.float64)
    if num_drafts < 4 or _splits_at_first_draft(draft_row, num_drafts):
        return None
    try:
        _check_recursion(target_row, draft_row, num_drafts)
    except WorkLimitError as error:
        return str(error)
    return None


def _splits_at_first_draft(draft_row, num_drafts) -> bool:
    """Whether the row's mass off its n − 1 largest draft tokens is below ``SMALLEST_REST``,
    so that ``rrs_without_replacement_acceptance`` splits it at its first draft."""
    return num_drafts >= 2 and _rest_off_the_largest(draft_row, num_drafts - 1) < SMALLEST_REST


def _check_recursion(target_row, draft_row, num_drafts) -> None:
    """Refuse (``checks.WorkLimitError``) a recursion estimated past ``RECURSION_SECONDS_LIMIT``, n ≥ 4."""
    if num_drafts >= 4:
        rejectable = np.count_nonzero(draft_row > target_row)
        within_limit(f"num_drafts: exact RRS-without-replacement acceptance for n = {num_drafts} "
                     f"({rejectable:,} rejectable tokens, V = {len(draft_row):,})",
                     recursion_seconds(rejectable, len(draft_row), num_drafts), RECURSION_SECONDS_LIMIT, "s",
                     hint="the recursion grows as V^(n−2); n ≤ 3 is fast at any vocabulary size")


def _recursive_acceptance(target_row, draft_row, num_drafts) -> float:
    """Plain recursion over rejected tokens, the last level through the curve:
    O(V^(n−2)·V log V)."""
    _check_recursion(target_row, draft_row, num_drafts)

    def level(current, removed, remaining):
        if remaining == 2:
            return _two_draft_acceptance(current, np.where(removed, 0.0, draft_row))
        kept_mass = draft_row[~removed].sum()  # 1 − q(S), summed: no cancellation
        scale = 1.0 / kept_mass
        accept_mass = float(np.minimum(current, scale * draft_row).sum())  # G(s), one point: no sort
        leftover = np.maximum(current - scale * draft_row, 0.0)
        if remaining == 1 or accept_mass >= 1.0 or leftover.sum() <= 0:  # empty: equal up to rounding
            return accept_mass
        rejection = np.where(removed, 0.0, np.maximum(scale * draft_row - current, 0.0))
        rejected_tokens = np.flatnonzero(rejection > 0)
        next_target = leftover / leftover.sum()
        tail = []
        for token in rejected_tokens:
            now_removed = removed.copy()
            now_removed[token] = True
            tail.append(level(next_target, now_removed, remaining - 1))
        return accept_mass + float(np.dot(rejection[rejected_tokens], tail))

    return level(target_row, np.zeros(draft_row.shape, dtype=bool), num_drafts)


@compiled(error_model="numpy")
def _two_draft_acceptance(current, draft):
    """The acceptance of the last two levels of RRS without replacement, from the residual
    ``current`` entering them and the draft mass ``draft`` not yet removed (0 at removed
    tokens, not renormalised): with s = 1/q(kept) and the next residual
    p' = norm((current − s·q)+), α = Σ min(current, s·q) + Σ_x (s·q − current)+(x)·G'(1/(q(kept) − q(x))),
    G' the curve of p' (``_sorted_curve``); q(kept) − q(x) is the summed mass of the others
    for the largest x (``probability.mass_of_the_others``). Three passes over the row and
    one sort, for the curve; the look-ups are each searched for from the last (most x have
    tiny q, so nearby thresholds). Sums over the vocabulary are compensated (``_added``).
    # current, draft [vocab] -> float"""
    kept = kept_carry = 0.0
    largest = 0
    for token in range(draft.size):
        kept, kept_carry = _added(kept, kept_carry, draft[token])
        if draft[token] > draft[largest]:
            largest = token
    kept += kept_carry
    scale = 1.0 / kept
    accepted = accepted_carry = leftover = leftover_carry = 0.0
    rejected = residual = 0
    for token in range(draft.size):
        accepted, accepted_carry = _added(accepted, accepted_carry, min(current[token], scale * draft[token]))
        leftover, leftover_carry = _added(leftover, leftover_carry, max(current[token] - scale * draft[token], 0.0))
        if scale * draft[token] - current[token] > 0:
            rejected += 1
        elif current[token] - scale * draft[token] > 0 and draft[token] > 0:
            residual += 1
    accepted += accepted_carry
    leftover += leftover_carry
    if accepted >= 1.0 or leftover <= 0:  # empty: equal up to rounding
        return accepted
    thresholds, rejection = np.empty(rejected), np.empty(rejected)  # 1/(q(kept) − q(x)), (s·q − current)(x)
    targets, drafts = np.empty(residual), np.empty(residual)  # p' and q where both are positive
    others = others_carry = 0.0  # of the largest
    rejected = residual = 0
    largest_place = -1  # where the largest token is among the rejected ones, if it is
    for token in range(draft.size):
        if token != largest:
            others, others_carry = _added(others, others_carry, draft[token])
        if scale * draft[token] - current[token] > 0:
            rejection[rejected] = scale * draft[token] - current[token]
            if token == largest:
                largest_place = rejected
            else:
                thresholds[rejected] = 1.0 / (kept - draft[token])
            rejected += 1
        elif current[token] - scale * draft[token] > 0 and draft[token] > 0:
            targets[residual], drafts[residual] = (current[token] - scale * draft[token]) / leftover, draft[token]
            residual += 1
    if largest_place >= 0:
        thresholds[largest_place] = 1.0 / (others + others_carry)
    reached = np.empty(rejected)
    _min_sum_values(_sorted_curve(targets, drafts)[0], thresholds, _new_pieces(1), reached)
    tail = tail_carry = 0.0
    for place in range(rejected):
        tail, tail_carry = _added(tail, tail_carry, rejection[place] * reached[place])
    return accepted + (tail + tail_carry)


def three_draft_bounds(target_row, draft_row, tolerance: float = DEFAULT_TOLERANCE):
    """Certified (lower, upper) bounds on α of RRS without replacement with n = 3.

    α = A1 + Σ_{x1} (q − p)+(x1)·[A2(x1) + Σ_{x2 ≠ x1} w2(x2|x1)·A3(x1, x2)], with
    s = 1/(1 − q(x1)), A2 = G(s), w2 = q(x2)(s − r(x2))+ and
    A3 = (G(s + (1 − G(s))/(1 − q(x1) − q(x2))) − G(s)) / (1 − G(s)) (module docstring).
    Every term depends on x1 only through q(x1) and A3 on x2 only through q(x2), so both
    are grouped by draft value: ``_bracket`` bounds the sum over bins of x1 values × bins of
    x2 values, exactly where each bin holds one value. The x2 side holds only the tokens
    that can weigh: w2 = 0 where r(x2) ≥ s, and every s is below a bound taken from the
    largest x1 value (``_three_level_arrays``). A row of at most ``FIRST_BIN_COUNT``
    distinct values on both sides gets one exact pass; any other row starts at
    ``COARSE_BIN_COUNT`` bins a side, then brackets again only its widest x1 bins, finer and
    over more x2 bins (``_Bins.refined``, ``_widest``), until the bracket is within
    ``tolerance`` or the work limit is reached.

    Why every bracket is certified: α = 1 − TV + Σ_β share(β) over the x1 bins β, and
    ``_bracket`` bounds each share from its own pairs of bins alone (weights between their
    values at the bin's ends of s, A3 between interval bounds), whatever bins the other x1
    values are in and whatever x2 bins they are paired with. A refinement replaces the
    bounds of the bins it cuts by the bounds of their parts and keeps every other bin's, so
    the bins always hold every x1 value once and the sums of their lower and upper bounds
    bound α.
    """
    levels = _ThreeLevels.of(np.asarray(target_row, dtype=np.float64), np.asarray(draft_row, dtype=np.float64))
    if levels is None:  # p ≤ q everywhere: the first draft is always accepted
        return 1.0, 1.0
    most = (len(levels.first_values), len(levels.distinct))  # a bin per value: exact
    counts = most if max(most) <= FIRST_BIN_COUNT else (min(COARSE_BIN_COUNT, most[0]), min(COARSE_BIN_COUNT, most[1]))
    spent = levels.setup_seconds
    while not levels.affordable([counts], spent):
        if counts == (1, 1):
            raise WorkLimitError(
                f"num_drafts: RRS-without-replacement acceptance for n = 3 needs about "
                f"{levels.seconds([(1, 1)]) + spent:,.3g} s even for its coarsest bracket (V = {len(draft_row):,}), "
                f"above the limit of {BRACKET_SECONDS_LIMIT:g} s")
        counts = (max(1, min(counts[0], COARSE_BIN_COUNT) // 2), max(1, min(counts[1], COARSE_BIN_COUNT) // 2))
    bins = _Bins.even(levels, counts).evaluated(levels)
    spent += levels.seconds(bins.passes)
    while True:
        bracket = levels.bracket(bins.low, bins.high)
        if bracket[1] - bracket[0] <= 2 * tolerance:
            return bracket
        chosen = _widest(bins.high - bins.low, bins.refinable(most), REFINEMENT_AIM * 2 * tolerance)
        if not chosen.any():  # a bin per value on both sides: exact up to rounding
            return bracket
        finer = bins.select(chosen).refined(levels, most)
        if not levels.affordable(finer.passes, spent):  # beyond the work limit: the certified bracket reached
            return bracket
        spent += levels.seconds(finer.passes)
        bins = bins.select(~chosen).joined(finer.evaluated(levels))


def _widest(widths, refinable, allowed) -> np.ndarray:
    """The bins to refine: the widest refinable ones, as few as are expected to bring the
    total width within ``allowed`` (the others' width plus ``REFINED_WIDTH_SHARE`` of
    theirs; every refinable bin of positive width where that is not enough).
    # widths, refinable [bins] -> [bins] bool"""
    candidates = np.where(refinable, widths, 0.0)
    order = np.argsort(candidates)[::-1]
    refined = np.cumsum(candidates[order])  # the width of order[: i + 1]
    enough = np.flatnonzero(widths.sum() - (1 - REFINED_WIDTH_SHARE) * refined <= allowed)
    count = enough[0] + 1 if len(enough) else len(order)
    chosen = np.zeros(len(widths), dtype=bool)
    chosen[order[:count]] = True
    return chosen & (candidates > 0)


@dataclass(frozen=True)
class _Bins:
    """x1 bins, each with the x2 bins it is bracketed over: bin i holds the x1 values
    ``starts[i]:ends[i]`` of ``_ThreeLevels.first_values`` (ascending, together all of
    them), was cut from ``first_count[i]`` bins (``_ThreeLevels.first_bins``) after
    ``refinements[i]`` refinements, and its pairs run over ``second_count[i]`` x2 bins
    (``_ThreeLevels.second_bins``). α − (1 − TV) is the sum of the x1 bins' shares, and each
    share's bounds ``low``, ``high`` (once ``evaluated``) are certified whatever the other
    bins are (``_bracket``), so a bin can be refined alone, with x2 bins of its own.
    # every field [bins]"""

    starts: np.ndarray
    ends: np.ndarray
    first_count: np.ndarray
    second_count: np.ndarray
    refinements: np.ndarray
    low: np.ndarray | None = None
    high: np.ndarray | None = None

    @classmethod
    def even(cls, levels, counts) -> _Bins:
        """``counts[0]`` x1 bins, each over ``counts[1]`` x2 bins."""
        starts = levels.first_bins(counts[0])
        ends = np.append(starts[1:], len(levels.first_values))
        return cls(starts, ends, np.full(len(starts), counts[0]), np.full(len(starts), counts[1]),
                   np.zeros(len(starts), dtype=np.int64))

    @property
    def passes(self) -> list:
        """(x1 bins, x2 bins) of each ``_bracket`` call of ``evaluated``."""
        counts, sizes = np.unique(self.second_count, return_counts=True)
        return [(int(size), int(count)) for count, size in zip(counts, sizes)]

    def evaluated(self, levels) -> _Bins:
        """These bins with their shares' bounds, one ``_bracket`` call per x2 bin count."""
        low, high = np.empty(len(self.starts)), np.empty(len(self.starts))
        for count in np.unique(self.second_count):
            mine = self.second_count == count
            low[mine], high[mine] = _bracket(levels, self.starts[mine], self.ends[mine], levels.second_bins(count))
        return _Bins(*self._fields()[:5], low, high)

    def refinable(self, most) -> np.ndarray:
        """Bins that are not exact already: more than one x1 value, or fewer x2 bins than values."""
        return (self.ends - self.starts > 1) | (self.second_count < most[1])

    def select(self, rows) -> _Bins:
        return _Bins(*(None if column is None else column[rows] for column in self._fields()))

    def joined(self, other) -> _Bins:
        """These evaluated bins and ``other``'s, by x1 value."""
        order = np.argsort(np.concatenate([self.starts, other.starts]))
        return _Bins(*(np.concatenate([mine, theirs])[order] for mine, theirs in zip(self._fields(), other._fields())))

    def refined(self, levels, most) -> _Bins:
        """Every bin cut at the starts of the x1 bins of twice its ``first_count`` that fall
        inside it, its x2 bins doubled at its odd refinements (the first, third, …) and
        wherever it was not cut, each at most ``most``: x1 first since on llama.cpp's float32 rows that narrows the
        bracket more and costs less than doubling the x2 bins
        (``benchmarks/studies/bench_study_real_rows.py`` times both on real rows)."""
        first_count = np.minimum(2 * self.first_count, most[0])
        owners, starts = [np.arange(len(self.starts))], [self.starts]
        for count in np.unique(first_count):
            cuts = levels.first_bins(count)
            owner = np.maximum(np.searchsorted(self.starts, cuts, side="right") - 1, 0)
            inside = (first_count[owner] == count) & (cuts > self.starts[owner]) & (cuts < self.ends[owner])
            owners.append(owner[inside])
            starts.append(cuts[inside])
        owner, starts = np.concatenate(owners), np.concatenate(starts)
        order = np.argsort(starts)
        owner, starts = owner[order], starts[order]
        same = np.append(owner[1:] == owner[:-1], False)  # the next start cuts the same bin
        ends = np.where(same, np.append(starts[1:], 0), self.ends[owner])
        cut = np.bincount(owner, minlength=len(self.starts)) > 1
        refinements = self.refinements + 1
        second_count = np.where((refinements % 2 == 1) | ~cut, np.minimum(2 * self.second_count, most[1]),
                                self.second_count)
        return _Bins(starts, ends, first_count[owner], second_count[owner], refinements[owner])

    def _fields(self):
        return self.starts, self.ends, self.first_count, self.second_count, self.refinements, self.low, self.high


def bracket_seconds(first_bins: int, tokens: int, second_bins: int) -> float:
    """Estimated seconds of one ``_bracket`` pass of ``first_bins`` × ``second_bins`` bins
    over ``tokens`` draft tokens (module docstring), the row's sorts not included."""
    return RRS_SECONDS_PER_BIN_PAIR * first_bins * second_bins + RRS_SECONDS_PER_PASS_TOKEN * tokens


@compiled(error_model="numpy")
def _bin_starts(reached, bins):
    """Start indices of bins of sorted distinct values, at most ``bins`` of them (two where
    ``bins`` is 1): the largest half one value each, the largest value always alone, the
    smaller values in runs of equal Σ √(mass·gap), gap the step to the next value
    (``reached``: those sums before each value, summed in order by ``_three_level_arrays``;
    value i is in run ⌊reached[i]·runs/total⌋, at most the last, total the sum over them;
    each run's start found by bisection). A bin's part of the bracket is about its mass
    times its range of values (A3 and the weights move about linearly in both draft
    values), and runs of equal Σ √(mass·gap) make those products about equal (at a fixed
    number of bins the sum of mass × range is smallest so): among the many tiny values of a
    real row the bins are wide, near the top narrow. On llama.cpp's float32 rows this
    closes the bracket at 512 bins a side where equal runs of values needed a bin per x1
    value and 4,096 x2 bins. The largest value's own bin keeps ``_bracket`` exact where its
    s = 1/(1 − q) is huge (its x2 = x1 term cancels there).  # reached [k] -> ascending, starting at 0"""
    count = reached.size
    if bins >= count:  # a bin per value
        starts = np.empty(count, dtype=np.int64)
        for place in range(count):
            starts[place] = place
        return starts
    top = max(1, bins // 2)
    runs = max(1, bins - top)
    rest = count - top
    total = reached[rest]
    starts = np.empty(runs + top, dtype=np.int64)
    starts[0], found = 0, 1
    for run in range(1, runs if total > 0 else 0):  # its first value: the first whose run is at least this one
        low, high = starts[found - 1], rest
        while low < high:
            middle = (low + high) // 2
            if np.int64(reached[middle] * (runs / total)) >= run:
                high = middle
            else:
                low = middle + 1
        if low < rest and low > starts[found - 1]:
            starts[found] = low
            found += 1
    for place in range(rest, count):
        starts[found] = place
        found += 1
    return starts[:found]


@dataclass(frozen=True)
class _ThreeLevels:
    """What every ``_bracket`` pass of one row shares (``_three_level_arrays``): the curve G
    (``_min_sum_arrays``) with the draft and residual mass at each breakpoint; the draft
    tokens that can weigh as x2 sorted by value (``values``; ``resting``, their value where
    r = p²/q is 0 and 0 elsewhere; ``distinct``, where each value starts); the first
    rejection's law over x1 grouped by draft value (``first_values`` ascending, their
    weights (q − p)+, s and G(s)); the running sums the bins of each side are cut from
    (``second_reach``, ``first_reach``: ``_bin_starts``); and the sums 1 − q needs
    (``complement``, ``_one_minus``)."""

    total_variation: float
    curve: tuple
    moving_draft: np.ndarray
    moving_residual: np.ndarray
    values: np.ndarray
    resting: np.ndarray
    distinct: np.ndarray
    second_reach: np.ndarray
    first_values: np.ndarray
    first_weights: np.ndarray
    first_reach: np.ndarray
    scale: np.ndarray
    accept_second: np.ndarray
    complement: np.ndarray
    setup_seconds: float
    _bins: dict = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, target_row, draft_row):
        arrays = _three_level_arrays(np.ascontiguousarray(target_row, dtype=np.float64),
                                     np.ascontiguousarray(draft_row, dtype=np.float64))
        if arrays[0] <= 0:  # p ≤ q everywhere
            return None
        return cls(*arrays, RRS_SECONDS_PER_ROW_TOKEN * len(draft_row))

    def first_bins(self, bins: int) -> np.ndarray:
        """Start indices (into ``first_values``) of at most ``bins`` bins of x1 values."""
        if ("first", bins) not in self._bins:
            self._bins["first", bins] = _bin_starts(self.first_reach, bins)
        return self._bins["first", bins]

    def second_bins(self, bins: int) -> np.ndarray:
        """Start indices (into ``values``) of at most ``bins`` bins of x2 values."""
        if ("second", bins) not in self._bins:
            self._bins["second", bins] = self.distinct[_bin_starts(self.second_reach, bins)]
        return self._bins["second", bins]

    def seconds(self, passes) -> float:
        """Estimated seconds of ``_bracket`` calls of (x1 bins, x2 bins) ``passes``."""
        return sum(bracket_seconds(first, len(self.values), second) for first, second in passes)

    def affordable(self, passes, spent: float) -> bool:
        """Whether ``_bracket`` calls of (x1 bins, x2 bins) ``passes`` fit what is left of
        ``BRACKET_SECONDS_LIMIT`` after ``spent`` seconds."""
        return spent + self.seconds(passes) <= BRACKET_SECONDS_LIMIT

    def bracket(self, low_shares, high_shares):
        """Bounds on α from certified shares of α − (1 − TV) of x1 bins that hold every x1
        value (``_bracket``).  # [bins], [bins] -> (float, float)"""
        accepted_first = 1.0 - self.total_variation
        return accepted_first + float(low_shares.sum()), accepted_first + float(high_shares.sum())


@compiled(error_model="numpy")
def _three_level_arrays(target, draft):
    """The fields of ``_ThreeLevels`` but the last, from two passes over the row, the
    curve's sort (``_min_sum_arrays``) and one sort of the values of the draft tokens that
    can weigh as x2 (``ascending_order``), each token's p and q gathered once in that
    order; a total variation of 0 where p ≤ q everywhere (the first draft is always
    accepted and nothing else is used). A token weighs as x2 where r = p²/q < s for some
    x1: every s = 1/(1 − q(x1)) is below 1/(min(1, Σq) − q(x1) − ``WEIGHING_MARGIN``) for
    the largest x1 value (1 − q(x1) is either itself or the summed mass of the others, each
    at least that up to rounding far below the margin), with no bound where that is not
    positive. 1 − q(top), for a largest value above 1/2, and 1 − q(top) − q(second) are the
    summed masses of the other tokens (``_one_minus``). Sums over the vocabulary are
    compensated (``_added``).  # target, draft [vocab]"""
    total_variation = carry = draft_mass = draft_carry = rejectable_top = 0.0
    positive = residual = top = second_top = 0  # the draft's two largest tokens
    for token in range(draft.size):
        total_variation, carry = _added(total_variation, carry, max(draft[token] - target[token], 0.0))
        draft_mass, draft_carry = _added(draft_mass, draft_carry, draft[token])
        if draft[token] > draft[top]:
            top, second_top = token, top
        elif token != top and (draft[token] > draft[second_top] or second_top == top):
            second_top = token
        if draft[token] > 0:
            positive += 1
            if target[token] > draft[token]:
                residual += 1
            elif draft[token] > target[token]:  # rejectable
                rejectable_top = max(rejectable_top, draft[token])
    total_variation += carry
    # no x1 has s = 1/(1 − q(x1)) above this, so a token of r = p²/q at least this weighs nothing as x2
    least_rest = min(1.0, draft_mass + draft_carry) - rejectable_top - WEIGHING_MARGIN
    ratio_bound = 1.0 / least_rest if least_rest > 0 else np.inf
    keys, pairs = np.empty(positive), np.empty((positive, 2))  # q, and (q, p), of the draft tokens that can weigh
    targets, drafts = np.empty(residual), np.empty(residual)  # p² = (p − q)+/TV and q where p > q
    positive = residual = 0
    rest = rest_carry = 0.0  # 1 − q(top) − q(second)
    for token in range(draft.size):
        if token != top and token != second_top:
            rest, rest_carry = _added(rest, rest_carry, draft[token])
        if draft[token] > 0:
            if target[token] > draft[token]:  # a breakpoint of the curve of p², weighing as x2 below ratio_bound
                targets[residual], drafts[residual] = (target[token] - draft[token]) / total_variation, draft[token]
                residual += 1
                if not targets[residual - 1] / draft[token] < ratio_bound:
                    continue
            keys[positive] = pairs[positive, 0] = draft[token]
            pairs[positive, 1] = target[token]
            positive += 1
    curve, moving_residual, moving_draft = _sorted_curve(targets, drafts)
    keys, pairs = keys[:positive], pairs[:positive]
    order = ascending_order(keys)
    values, resting = np.empty(positive), np.zeros(positive)
    distinct, second_reach = np.empty(positive, dtype=np.int64), np.zeros(positive)
    first_values, first_weights, first_reach = np.empty(positive), np.zeros(positive), np.zeros(positive)
    distinct_count = first_count = tied = 0
    for place in range(positive):
        value, mass = pairs[order[place], 0], pairs[order[place], 1]
        values[place] = value
        if max(mass - value, 0.0) / total_variation / value == 0:  # r = p²/q, as the curve's ratios
            resting[place] = value
        if place == 0 or value != values[place - 1]:
            if distinct_count:  # the last value's step: its mass value × count times the gap
                last = values[place - 1]
                step = np.sqrt((last * tied) * (value - last))
                second_reach[distinct_count] = second_reach[distinct_count - 1] + step
            distinct[distinct_count] = place
            distinct_count += 1
            tied = 0
        tied += 1
        if value > mass:  # rejectable: (q − p)+ > 0
            if first_count == 0 or value != first_values[first_count - 1]:
                if first_count:
                    last = first_values[first_count - 1]
                    first_reach[first_count] = first_reach[first_count - 1] + np.sqrt(
                        first_weights[first_count - 1] * (value - last))
                first_values[first_count] = value
                first_count += 1
            first_weights[first_count - 1] += value - mass
    distinct, second_reach = distinct[:distinct_count].copy(), second_reach[:distinct_count].copy()
    first_values, first_weights = first_values[:first_count].copy(), first_weights[:first_count].copy()
    first_reach = first_reach[:first_count].copy()
    complement = np.array([draft[top], draft[second_top] if second_top != top else 0.0, np.nan, rest + rest_carry])
    if complement[0] > 0.5:
        complement[2] = complement[3] + complement[1]  # 1 − q(top)
    scale, accept_second = np.empty(first_count), np.empty(first_count)
    for group in range(first_count):
        scale[group] = 1.0 / _one_minus(first_values[group], complement[0], complement[2])
    _min_sum_values(curve, scale, _new_pieces(1), accept_second)
    return (total_variation, curve, moving_draft, moving_residual, values, resting, distinct, second_reach,
            first_values, first_weights, first_reach, scale, accept_second, complement)


@compiled
def _one_minus(value, top, top_rest):
    """1 − v for a draft value, exact where it matters: for the largest value ``top``, when
    it is above 1/2, ``top_rest``, the summed mass of the other tokens
    (``probability.mass_of_the_others``; NaN where the largest is at most 1/2); every other
    value is at most 1/2 and 1 − v exact to rounding."""
    if value == top and top_rest == top_rest:
        return top_rest
    return 1.0 - value


@compiled
def _one_minus_pair(value, other, top, second, top_rest, pair_rest):
    """1 − v − w for draft values v, w, exact where it matters: for the two largest values
    1 − q(top) − q(second) is ``pair_rest``, the summed mass of the rest (0.99999968 and
    3.2e-7 beside a token of 1e-17 leave 1e-17, which the difference gets wrong by 1e-5
    relative). Any other pair of values leaves at least a third of the mass, and
    (1 − v) − w, or (1 − w) − v where w is the largest value, is exact to rounding
    (``_one_minus``)."""
    if (value == top and other == second) or (value == second and other == top):
        return pair_rest
    if other == top:
        return _one_minus(other, top, top_rest) - value
    return _one_minus(value, top, top_rest) - other


def _mass_without(draft_row, kept, tokens):
    """Σ_{y kept, y ≠ x} q(y) for each token x of ``tokens`` (kept[x] True), exact next to
    a dominant x (``probability.mass_of_the_others``). # kept [vocab] bool, tokens [k] -> [k]"""
    return mass_of_the_others(np.where(kept, draft_row, 0.0))[0, tokens]


def _bracket(levels: _ThreeLevels, first_starts, first_ends, second_starts):
    """Certified (lower, upper) shares of α − (1 − TV) of x1 bins (values
    ``first_starts[i]:first_ends[i]`` of ``levels.first_values``, ascending, not
    overlapping) over bins of x2 values (``second_starts``, into ``levels.values``).

    α − (1 − TV) = Σ_β Σ_{x1 ∈ β} W(x1)·[A2(x1) + Σ_b Σ_{x2 ∈ b, x2 ≠ x1} w2(x2|x1)·A3],
    W = (q − p)+; the share of an x1 bin β is its term. The A2 sum is exact. The weights of a
    pair of bins are Σ_{x1 ∈ β} W(x1)·(L_b(x1) − [x1 ∈ b]·q(x1)·s), L_b(x1) = Σ_{x2 ∈ b}
    q(x2)(s − r(x2))+ (x1 itself included: r(x1) = 0); L_b increases with s, so over an x1
    bin with s in [s_lo, s_hi] they lie between W_β·L_b(s_lo) − own and W_β·L_b(s_hi) − own
    (L_b computed exactly, q·r summed as the residual mass itself: r may overflow; own, the
    x2 = x1 terms, summed exactly), and A3 over a pair of bins between
    ``_third_acceptance_bounds``. Every pair's bounds hold on their own, so a bin's share
    is certified whatever bins the other x1 values are in. Bins of one value each make both
    bounds the exact sum. The largest draft value must have a bin of its own on both sides
    (``_bin_starts``): there s can be 10^7 and more, and its x2 = x1 term cancels exactly
    only against its own bin. One compiled pass (``_bracket_shares``). # -> [bins], [bins]"""
    return _bracket_shares(levels.curve, levels.moving_draft, levels.moving_residual, levels.values,
                           levels.resting, levels.first_values, levels.first_weights, levels.scale,
                           levels.accept_second, levels.complement,
                           np.ascontiguousarray(first_starts, dtype=np.int64),
                           np.ascontiguousarray(first_ends, dtype=np.int64),
                           np.ascontiguousarray(second_starts, dtype=np.int64))


@compiled(error_model="numpy")
def _bracket_shares(curve, moving_draft, moving_residual, values, resting, first_values, first_weights, scale,
                    accept_second, complement, first_starts, first_ends, second_starts):
    """``_bracket``'s bounds, the x1 bins taken in ascending order of s: L_b at each bin's
    s_lo and s_hi is s·(draft mass) − (residual mass) of the x2 tokens of b with r < s,
    running sums per x2 bin to which a token of r = 0 (p² = 0, no residual mass) belongs
    from the start and one of 0 < r < s is added as the scales pass its r (the curve's
    breakpoints are these tokens in order of r). The x2 = x1 terms, each x1 group's
    W·(s·q(x1)), are formed as in L_b (s times the bin's draft mass), so a bin of x1 alone
    cancels exactly. A pair whose upper weight is 0 adds 0 to both bounds. Each x1 bin's
    thresholds of G are looked up together (``_min_sum_values``), each x2 bin's on the
    piece of G it fell on at the x1 bin before.
    # moving_* [breakpoints], values, resting [tokens], first_*, scale, accept_second [groups],
    # first_starts, first_ends [bins], second_starts [second bins] -> [bins], [bins]"""
    top, second_top, top_rest, pair_rest = complement[0], complement[1], complement[2], complement[3]
    bins, second_bins = first_starts.size, second_starts.size
    second_low, second_high = np.empty(second_bins), np.empty(second_bins)
    draft_below, residual_below = np.zeros(second_bins), np.zeros(second_bins)
    for x2_bin in range(second_bins):
        start = second_starts[x2_bin]
        end = second_starts[x2_bin + 1] if x2_bin + 1 < second_bins else values.size
        second_low[x2_bin], second_high[x2_bin] = values[start], values[end - 1]
        for place in range(start, end):
            draft_below[x2_bin] += resting[place]
    # the tokens of 0 < r < the largest s, in order of r, and their x2 bins
    breakpoints = curve[0]
    passed = _count_below(breakpoints, 0.0, True)
    moving_bin = np.empty(_count_below(breakpoints, scale[first_ends[-1] - 1], False), dtype=np.int64)
    for place in range(passed, moving_bin.size):  # its x2 bin: the last starting at or below its value
        low, high = 0, second_bins
        while low < high:
            middle = (low + high) // 2
            if second_low[middle] <= moving_draft[place]:
                low = middle + 1
            else:
                high = middle
        moving_bin[place] = low - 1
    own, own_bin = np.zeros(second_bins), 0
    weight_low, weight_high = np.empty(second_bins), np.empty(second_bins)  # L_b at s_lo, s_hi, then the weights
    wide, narrow = np.empty(second_bins), np.empty(second_bins)  # 1 − q1 − q2 at the bins' low and high ends
    thresholds_low, thresholds_high = np.ones(second_bins), np.ones(second_bins)
    reached_low, reached_high = np.empty(second_bins), np.empty(second_bins)
    pieces_low, pieces_high = _new_pieces(second_bins), _new_pieces(second_bins)
    low, high = np.empty(bins), np.empty(bins)
    for x1_bin in range(bins):
        start, end = first_starts[x1_bin], first_ends[x1_bin]
        weight = accepted = 0.0
        for group in range(start, end):
            weight += first_weights[group]
            accepted += first_weights[group] * accept_second[group]
            while own_bin + 1 < second_bins and second_low[own_bin + 1] <= first_values[group]:
                own_bin += 1
            own[own_bin] += first_weights[group] * (scale[group] * first_values[group])
        scale_low, scale_high = scale[start], scale[end - 1]
        accept_low, accept_high = accept_second[start], accept_second[end - 1]
        while passed < moving_bin.size and breakpoints[passed] < scale_low:
            draft_below[moving_bin[passed]] += moving_draft[passed]
            residual_below[moving_bin[passed]] += moving_residual[passed]
            passed += 1
        for x2_bin in range(second_bins):
            weight_low[x2_bin] = max(scale_low * draft_below[x2_bin] - residual_below[x2_bin], 0.0)
        while passed < moving_bin.size and breakpoints[passed] < scale_high:
            draft_below[moving_bin[passed]] += moving_draft[passed]
            residual_below[moving_bin[passed]] += moving_residual[passed]
            passed += 1
        first_low, first_high = first_values[start], first_values[end - 1]
        plain = first_high < second_top  # below the two largest values 1 − q1 − q2 is (1 − q1) − q2
        for x2_bin in range(second_bins):
            weight_high[x2_bin] = max(scale_high * draft_below[x2_bin] - residual_below[x2_bin], 0.0)
            weight_low[x2_bin] = max(weight * weight_low[x2_bin] - own[x2_bin], 0.0)
            weight_high[x2_bin] = weight * weight_high[x2_bin] - own[x2_bin]
            if weight_high[x2_bin] <= 0:  # adds nothing: its thresholds stay where they were
                continue
            if plain and second_high[x2_bin] < second_top:
                wide[x2_bin] = (1.0 - first_low) - second_low[x2_bin]
                narrow[x2_bin] = (1.0 - first_high) - second_high[x2_bin]
            else:
                wide[x2_bin] = _one_minus_pair(first_low, second_low[x2_bin], top, second_top, top_rest, pair_rest)
                narrow[x2_bin] = _one_minus_pair(first_high, second_high[x2_bin], top, second_top, top_rest, pair_rest)
            thresholds_low[x2_bin], thresholds_high[x2_bin] = _third_thresholds(
                wide[x2_bin], narrow[x2_bin], scale_low, scale_high, accept_low, accept_high)
        _min_sum_values(curve, thresholds_low, pieces_low, reached_low)
        _min_sum_values(curve, thresholds_high, pieces_high, reached_high)
        low_sum = high_sum = 0.0
        for x2_bin in range(second_bins):
            if weight_high[x2_bin] > 0:
                lower, upper = _third_acceptance_bounds(wide[x2_bin], narrow[x2_bin], accept_low, accept_high,
                                                        reached_low[x2_bin], reached_high[x2_bin])
                low_sum += weight_low[x2_bin] * lower
                high_sum += weight_high[x2_bin] * upper
        low[x1_bin], high[x1_bin] = accepted + low_sum, accepted + high_sum
        for x2_bin in range(second_bins):
            own[x2_bin] = 0.0
    return low, high


@compiled(error_model="numpy")
def _third_thresholds(wide, narrow, scale_low, scale_high, accept_low, accept_high):
    """The thresholds of G that bound A3 over a pair of bins (``_third_acceptance_bounds``):
    s_lo + (1 − G(s_hi))/(1 − q1_lo − q2_lo) and s_hi + (1 − G(s_lo))/(1 − q1_hi − q2_hi),
    ``wide`` and ``narrow`` those 1 − q1 − q2; s itself where a bound needs no G.
    # -> (lower threshold, upper threshold)"""
    rest_low, rest_high = 1.0 - accept_high, 1.0 - accept_low
    return (scale_low + rest_low / wide if wide > 0 else scale_low,
            scale_high + rest_high / narrow if narrow > 0 and rest_low > 0 else scale_high)


@compiled(error_model="numpy")
def _third_acceptance_bounds(wide, narrow, accept_low, accept_high, reached_low, reached_high):
    """Bounds on A3 = (G(t) − G(s))/(1 − G(s)), t = s + (1 − G(s))/(1 − q(x1) − q(x2)), over
    a pair of an x1 bin (q(x1) in [q1_lo, q1_hi], s in [s_lo, s_hi], G(s) in [``accept_low``,
    ``accept_high``]) and an x2 bin (q(x2) in [q2_lo, q2_hi]), by intervals: G increases, so
    G(s) and 1 − G(s) lie between their values at the ends of s, t between
    s_lo + (1 − G(s_hi))/(1 − q1_lo − q2_lo) and s_hi + (1 − G(s_lo))/(1 − q1_hi − q2_hi)
    (``_third_thresholds``; ``wide``, ``narrow`` those 1 − q1 − q2, ``reached_low``,
    ``reached_high`` G there), and A3 ∈ [0, 1]. A pair of one value each gets the exact A3
    at both. A3 is 1 where q(x1) + q(x2) ≥ 1 (the third draft is the last token:
    G(∞) = 1); where the second level never rejects (1 − G(s) = 0) its weights L are 0 and
    A3 is set to 0.  # -> (lower, upper)"""
    rest_low, rest_high = 1.0 - accept_high, 1.0 - accept_low  # 1 − G(s) at s_hi and at s_lo
    if rest_high <= 0:
        return 0.0, 0.0
    lower = min(max((reached_low - accept_high) / rest_high, 0.0), 1.0) if wide > 0 else 1.0
    upper = min(max((reached_high - accept_low) / rest_low, 0.0), 1.0) if narrow > 0 and rest_low > 0 else 1.0
    return lower, upper


@compiled
def _count_below(ascending, value, or_equal):
    """The number of entries of ``ascending`` below ``value`` (or equal to it, where
    ``or_equal``), by bisection.  # [k] -> int"""
    low, high = 0, ascending.size
    while low < high:
        middle = (low + high) // 2
        if ascending[middle] < value or (or_equal and ascending[middle] == value):
            low = middle + 1
        else:
            high = middle
    return low


@compiled
def _find_piece(breakpoints, sums, threshold, pieces, piece):
    """Sets ``pieces[piece]`` to the piece of G that ``threshold`` falls on: its rank (the
    number of breakpoints ≤ threshold) is found by a search that gallops from the piece's
    last rank (steps 1, 2, 4, … towards it, then bisects), O(log distance)."""
    size = breakpoints.size
    hint = np.int64(pieces[piece, 4])
    if hint > 0 and breakpoints[hint - 1] > threshold:  # the rank is below hint
        low, high, step = 0, hint - 1, 1
        while high - step > 0:
            if breakpoints[high - step - 1] <= threshold:
                low = high - step
                break
            high -= step
            step *= 2
    else:
        low, high, step = hint, size, 1
        while low + step <= size:
            if breakpoints[low + step - 1] > threshold:
                high = low + step - 1
                break
            low += step
            step *= 2
    while low < high:
        middle = (low + high) // 2
        if breakpoints[middle] <= threshold:
            low = middle + 1
        else:
            high = middle
    pieces[piece, 0] = breakpoints[low - 1] if low > 0 else -np.inf
    pieces[piece, 1] = breakpoints[low] if low < size else np.inf
    pieces[piece, 2], pieces[piece, 3], pieces[piece, 4] = sums[low, 0], sums[low, 1], low


@compiled
def _added(total, carry, value):
    """total + value, the rounding error of each addition kept in ``carry``
    (Neumaier's compensated sum: total + carry at the end is the sum to about one rounding,
    whatever the number of terms).  # -> (total, carry)"""
    summed = total + value
    if abs(total) >= abs(value):
        carry += (total - summed) + value
    else:
        carry += (value - summed) + total
    return summed, carry
