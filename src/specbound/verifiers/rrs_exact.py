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

So after one O(V log V) sort, each level is a few look-ups in G.

Cost: n ≤ 2 is O(V log V). n = 3 sums over pairs (x1, x2); ``three_draft_bounds``
groups both by draft probability into bins of values, exact where a bin holds one value
and bracketed by monotone and interval bounds where it holds a range, costing
O(V log V + B1·B2) for B1 × B2 bins: one exact pass where both sides have at most
``FIRST_BIN_COUNT`` distinct values (a bf16 model's softmax: a few thousand), else a
certified bracket refined until it is within a tolerance (llama.cpp's float32 rows: ~10^5
distinct values, closed at 256–1,024 bins a side). n ≥ 4 uses the plain recursion, for
small vocabularies.

Work limits (measured on this project's 2-core CPU; ``three_draft_seconds`` and
``recursion_seconds`` estimate a call): a row's sorts cost about 1e-6·V s, a bracket pass
over B1 × B2 bins and V tokens about 9e-8·B1·B2 + 8e-8·B1·V/256 s, holding
128·min(B1, 256)·B2 bytes. A row of more values than ``FIRST_BIN_COUNT`` starts at
``COARSE_BIN_COUNT`` bins a side and refines (``_refined``): x1 bins double every pass, x2
bins every second pass from the first. Refinement stops where the
next pass would take the n = 3 computation past ``BRACKET_SECONDS_LIMIT`` or a pass past
``BRACKET_BYTES_LIMIT``; the acceptance is then the midpoint of the certified bracket
reached, and a ``BracketWarning`` gives the bracket. The n ≥ 4 recursion (about
1e-4·(V + 1) s per level call), with no bracket to fall back on, is refused
(``checks.WorkLimitError``) beyond ``RECURSION_SECONDS_LIMIT``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from specbound.checks import WorkLimitError, within_limit
from specbound.probability import mass_of_the_others, top_tokens, zeroed

DEFAULT_TOLERANCE = 1e-10
RECURSION_SECONDS_LIMIT = 20.0
SECONDS_PER_LEVEL_TOKEN = 1e-4  # one level of the recursion, per token of the vocabulary
BRACKET_SECONDS_LIMIT = 20.0
BRACKET_BYTES_LIMIT = 2**30
SECONDS_PER_GROUP_BIN = 9e-8
SECONDS_PER_CHUNK_TOKEN = 4e-8
BYTES_PER_GROUP_BIN = 128  # the [x1 bins, x2 bins] arrays of one chunk of _bracket
SMALLEST_REST = 1e-300  # below, 1/(1 − q(S)) and its sums could overflow: _split_at_first_draft
SECONDS_PER_ROW_TOKEN = 1e-6  # a row's sorts and curve, before any pass
FIRST_BIN_COUNT = 4096  # one exact pass for rows of at most this many values on both sides
COARSE_BIN_COUNT = 256  # the first pass's bins a side for rows of more (llama.cpp's float32 rows: ~10^5)
GROUP_CHUNK = 256


def min_sum_curve(target_row: np.ndarray, draft_row: np.ndarray):
    """G(t) = Σ_y min(p(y), t·q(y)) for any t ≥ 0 (vectorised in t), after one sort.

    G is piecewise linear with breakpoints at the ratios p/q, so it is evaluated by
    linear interpolation between them (``np.interp``, which is fast on sorted queries);
    it is constant, Σ_{q>0} p, beyond the largest ratio. Tokens with q = 0 or p = 0
    contribute nothing. The draft mass beyond a breakpoint is summed from the tokens
    beyond it (a difference of running sums leaves 1e-17 there, which a ratio of 1e10
    turns into an error of 1e-7), and a token whose ratio overflows (q below p/1.8e308)
    contributes t·q(y) at every finite t and p(y) at t = ∞.  # target_row, draft_row [vocab]
    """
    both = (draft_row > 0) & (target_row > 0)
    with np.errstate(over="ignore"):
        ratio = target_row[both] / draft_row[both]
    steep = np.isinf(ratio)
    steep_target, steep_draft = target_row[both][steep].sum(), draft_row[both][steep].sum()
    order = np.argsort(ratio[~steep])
    ratio = ratio[~steep][order]
    target_upto = np.cumsum(target_row[both][~steep][order])
    draft_beyond = np.zeros_like(ratio)
    draft_beyond[:-1] = np.cumsum(draft_row[both][~steep][order][::-1])[-2::-1]
    breakpoints = np.concatenate([[0.0], ratio])
    values = np.concatenate([[0.0], target_upto + ratio * (draft_beyond + steep_draft)])

    def curve(threshold):
        finite = np.interp(threshold, breakpoints, values)
        if steep_draft == 0:
            return finite
        return finite + np.minimum(steep_target, np.asarray(threshold) * steep_draft)

    return curve


def rrs_without_replacement_acceptance(
    target_row, draft_row, num_drafts: int, tolerance: float = DEFAULT_TOLERANCE
) -> float:
    """α of RRS without replacement for one row; see the module docstring for the method.

    Exact for n ≤ 2 and for n ≥ 4; for n = 3 within ``tolerance`` (the midpoint of a
    certified bracket, exact when the bracket closes). A row whose mass off its n − 1
    largest draft tokens is below ``SMALLEST_REST`` is split at its first draft first
    (``_split_at_first_draft``).
    """
    if num_drafts >= 2 and _rest_off_the_largest(draft_row, num_drafts - 1) < SMALLEST_REST:
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
    rows take: ``benchmarks/results/study_exact_unit.md``)."""
    first = len(np.unique(draft_row[draft_row > target_row]))
    second = len(np.unique(draft_row[draft_row > 0]))
    seconds = SECONDS_PER_ROW_TOKEN * len(draft_row)
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
    return calls * SECONDS_PER_LEVEL_TOKEN * (1 + vocab_size)


def _rest_off_the_largest(draft_row, count) -> float:
    """Σ q over every token but the ``count`` most probable ones."""
    return float(zeroed(draft_row[None, :], top_tokens(draft_row[None, :], count)).sum())


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


def _recursive_acceptance(target_row, draft_row, num_drafts) -> float:
    """Plain recursion over rejected tokens, the last level through the curve:
    O(V^(n−2)·V log V)."""
    rejectable = np.count_nonzero(draft_row > target_row)
    if num_drafts >= 4:
        within_limit(f"num_drafts: exact RRS-without-replacement acceptance for n = {num_drafts} "
                     f"({rejectable:,} rejectable tokens, V = {len(draft_row):,})",
                     recursion_seconds(rejectable, len(draft_row), num_drafts), RECURSION_SECONDS_LIMIT, "s",
                     hint="the recursion grows as V^(n−2); n ≤ 3 is fast at any vocabulary size")

    def level(current, removed, remaining):
        kept_mass = draft_row[~removed].sum()  # 1 − q(S), summed: no cancellation
        scale = 1.0 / kept_mass
        accept_mass = float(np.minimum(current, scale * draft_row).sum())  # G(s), one point: no sort
        leftover = np.maximum(current - scale * draft_row, 0.0)
        if remaining == 1 or accept_mass >= 1.0 or leftover.sum() <= 0:  # empty: equal up to rounding
            return accept_mass
        rejection = np.where(removed, 0.0, np.maximum(scale * draft_row - current, 0.0))
        rejected_tokens = np.flatnonzero(rejection > 0)
        next_target = leftover / leftover.sum()
        if remaining == 2:
            next_kept_mass = _mass_without(draft_row, ~removed, rejected_tokens)
            tail = min_sum_curve(next_target, draft_row)(1.0 / next_kept_mass)
        else:
            tail = []
            for token in rejected_tokens:
                now_removed = removed.copy()
                now_removed[token] = True
                tail.append(level(next_target, now_removed, remaining - 1))
        return accept_mass + float(np.dot(rejection[rejected_tokens], tail))

    return level(target_row, np.zeros(draft_row.shape, dtype=bool), num_drafts)


def three_draft_bounds(target_row, draft_row, tolerance: float = DEFAULT_TOLERANCE):
    """Certified (lower, upper) bounds on α of RRS without replacement with n = 3.

    α = A1 + Σ_{x1} (q − p)+(x1)·[A2(x1) + Σ_{x2 ≠ x1} w2(x2|x1)·A3(x1, x2)], with
    s = 1/(1 − q(x1)), A2 = G(s), w2 = q(x2)(s − r(x2))+ and
    A3 = (G(s + (1 − G(s))/(1 − q(x1) − q(x2))) − G(s)) / (1 − G(s)) (module docstring).
    Every term depends on x1 only through q(x1) and A3 on x2 only through q(x2), so both
    are grouped by draft value: ``_bracket`` bounds the sum over bins of x1 values × bins of
    x2 values, exactly where each bin holds one value. A row of at most
    ``FIRST_BIN_COUNT`` distinct values on both sides (a bf16 model's softmax) gets one
    exact pass; any other row starts at ``COARSE_BIN_COUNT`` bins a side and refines them
    (``_refined``) until the bracket is within ``tolerance`` or the work limit is reached.
    """
    levels = _ThreeLevels.of(np.asarray(target_row, dtype=np.float64), np.asarray(draft_row, dtype=np.float64))
    if levels is None:  # p ≤ q everywhere: the first draft is always accepted
        return 1.0, 1.0
    most = (len(levels.first_values), len(levels.distinct))  # a bin per value: exact
    bins = most if max(most) <= FIRST_BIN_COUNT else (min(COARSE_BIN_COUNT, most[0]), min(COARSE_BIN_COUNT, most[1]))
    spent = levels.setup_seconds
    while not levels.affordable(bins, spent):
        if bins == (1, 1):
            raise WorkLimitError(
                f"num_drafts: RRS-without-replacement acceptance for n = 3 needs about "
                f"{levels.seconds((1, 1)) + spent:,.3g} s even for its coarsest bracket (V = {len(draft_row):,}), "
                f"above the limit of {BRACKET_SECONDS_LIMIT:g} s")
        bins = (max(1, min(bins[0], COARSE_BIN_COUNT) // 2), max(1, min(bins[1], COARSE_BIN_COUNT) // 2))
    refinement = 0
    while True:
        low, high = _bracket(levels, levels.first_bins(bins[0]), levels.second_bins(bins[1]))
        spent += levels.seconds(bins)
        if high - low <= 2 * tolerance or bins == most:
            return low, high
        refinement += 1
        finer = _refined(bins, most, refinement)  # more bins on one side at least: reaches `most`
        if not levels.affordable(finer, spent):  # refining is beyond the work limit: the certified bracket reached
            return low, high
        bins = finer


def _refined(bins, most, refinement: int):
    """The bins of the pass after ``bins`` at its ``refinement``-th refinement (1, 2, …): x1
    bins double every time, x2 bins at odd refinements and wherever x1 already has a bin per
    value, each at most ``most``. x1 first since on llama.cpp's float32 rows doubling the x1
    bins narrows the bracket more and costs less than doubling the x2 bins
    (``benchmarks/results/study_exact_unit.md``, round 5)."""
    first = min(2 * bins[0], most[0])
    second = min(2 * bins[1], most[1]) if refinement % 2 or first == bins[0] else bins[1]
    return first, second


def bracket_seconds(first_bins: int, tokens: int, second_bins: int) -> float:
    """Estimated seconds of one ``_bracket`` pass of ``first_bins`` × ``second_bins`` bins
    over ``tokens`` draft tokens (module docstring), the row's sorts not included."""
    return (SECONDS_PER_GROUP_BIN * first_bins * second_bins
            + SECONDS_PER_CHUNK_TOKEN * 2 * first_bins * tokens / GROUP_CHUNK)


def _bin_starts(values, masses, bins: int) -> np.ndarray:
    """Start indices of bins of sorted distinct ``values`` with their ``masses``, at most
    ``bins`` of them (two where ``bins`` is 1): the largest half one value each, the largest
    value always alone, the smaller values in runs of equal Σ √(mass·gap), gap the step to
    the next value. A bin's part of the bracket is about its mass times its range of values
    (A3 and the weights move about linearly in both draft values), and runs of equal
    Σ √(mass·gap) make those products about equal (at a fixed number of bins the sum of
    mass × range is smallest so): among the many tiny values of a real row the bins are
    wide, near the top narrow. On llama.cpp's float32 rows this closes the bracket at 512
    bins a side where equal runs of values needed a bin per x1 value and 4,096 x2 bins. The
    largest value's own bin keeps ``_bracket`` exact where its s = 1/(1 − q) is huge (its
    x2 = x1 term cancels there).
    # values [k] ascending, masses [k] -> ascending, starting at 0"""
    if bins >= len(values):
        return np.arange(len(values))
    top = max(1, bins // 2)
    runs = max(1, bins - top)
    rest = len(values) - top
    steps = np.sqrt(masses[:rest] * np.diff(values[: rest + 1]))
    reached = np.concatenate([[0.0], np.cumsum(steps)[:-1]])  # Σ before each value
    total = reached[-1] + steps[-1]
    run = np.minimum((reached * (runs / total)).astype(np.int64), runs - 1) if total > 0 else \
        np.zeros(rest, dtype=np.int64)
    starts = np.flatnonzero(np.concatenate([[True], np.diff(run) != 0]))
    return np.concatenate([starts, np.arange(rest, len(values))])


@dataclass(frozen=True)
class _ThreeLevels:
    """What every ``_bracket`` pass of one row shares: the first rejection's law over x1
    grouped by draft value (``first_values`` ascending, their weights (q − p)+, s, G(s)),
    the positive draft tokens sorted by value (``values``, r = p²/q and p² in that order;
    ``distinct`` where each value starts), the curve G and 1 − q sums."""

    total_variation: float
    curve: object
    one_minus: object
    first_values: np.ndarray
    first_weights: np.ndarray
    scale: np.ndarray
    accept_second: np.ndarray
    values: np.ndarray
    ratio: np.ndarray
    residual_mass: np.ndarray
    distinct: np.ndarray
    setup_seconds: float

    @classmethod
    def of(cls, target_row, draft_row):
        first_rejection = np.maximum(draft_row - target_row, 0.0)
        total_variation = first_rejection.sum()
        if total_variation <= 0:
            return None
        residual = np.maximum(target_row - draft_row, 0.0) / total_variation
        curve = min_sum_curve(residual, draft_row)
        rejectable = first_rejection > 0
        first_values, first_weights = _sum_by_value(draft_row[rejectable], first_rejection[rejectable])
        one_minus = _complement(draft_row)
        scale = 1.0 / one_minus(first_values)
        positive = np.flatnonzero(draft_row > 0)
        positive = positive[np.argsort(draft_row[positive], kind="stable")]
        values = draft_row[positive]
        with np.errstate(over="ignore"):  # a ratio beyond 1.8e308 is above every threshold: inf
            ratio = residual[positive] / values
        distinct = np.flatnonzero(np.concatenate([[True], np.diff(values) != 0]))
        return cls(float(total_variation), curve, one_minus, first_values, first_weights, scale, curve(scale),
                   values, ratio, residual[positive], distinct, SECONDS_PER_ROW_TOKEN * len(draft_row))

    def first_bins(self, bins: int) -> np.ndarray:
        """Start indices (into ``first_values``) of at most ``bins`` bins of x1 values."""
        return _bin_starts(self.first_values, self.first_weights, bins)

    def second_bins(self, bins: int) -> np.ndarray:
        """Start indices (into ``values``) of at most ``bins`` bins of x2 values."""
        counts = np.diff(np.append(self.distinct, len(self.values)))
        distinct_values = self.values[self.distinct]
        return self.distinct[_bin_starts(distinct_values, distinct_values * counts, bins)]

    def seconds(self, bins) -> float:
        return bracket_seconds(bins[0], len(self.values), bins[1])

    def affordable(self, bins, spent: float) -> bool:
        """Whether a pass of ``bins`` fits what is left of ``BRACKET_SECONDS_LIMIT`` after
        ``spent`` seconds, and ``BRACKET_BYTES_LIMIT``."""
        return (spent + self.seconds(bins) <= BRACKET_SECONDS_LIMIT
                and BYTES_PER_GROUP_BIN * min(bins[0], GROUP_CHUNK) * bins[1] <= BRACKET_BYTES_LIMIT)


def _complement(draft_row):
    """v -> 1 − v and (v, w) -> 1 − v − w for draft values, exact where it matters: for the
    largest value, when it is above 1/2, 1 − q(top) is the summed mass of the other tokens
    (``probability.mass_of_the_others``), and for the two largest values 1 − q(top) −
    q(second) is the summed mass of the rest (0.99999968 and 3.2e-7 beside a token of 1e-17
    leave 1e-17, which the difference gets wrong by 1e-5 relative). Any other pair of
    values leaves at least a third of the mass, and the difference is exact to rounding."""
    second, top = np.argpartition(draft_row, -2)[-2:]
    top_value, second_value = draft_row[top], draft_row[second]
    top_complement = mass_of_the_others(draft_row)[0, top] if top_value > 0.5 else None
    pair_complement = zeroed(draft_row[None, :], np.array([[top, second]])).sum()

    def one_minus(values, others=None):
        values = np.asarray(values, dtype=np.float64)
        if others is not None:
            larger, smaller = np.maximum(values, others), np.minimum(values, others)
            top_pair = (larger == top_value) & (smaller == second_value)
            return np.where(top_pair, pair_complement, one_minus(larger) - smaller)
        if top_complement is None:
            return 1.0 - values
        return np.where(values == top_value, top_complement, 1.0 - values)

    return one_minus


def _mass_without(draft_row, kept, tokens):
    """Σ_{y kept, y ≠ x} q(y) for each token x of ``tokens`` (kept[x] True), exact next to
    a dominant x (``probability.mass_of_the_others``). # kept [vocab] bool, tokens [k] -> [k]"""
    return mass_of_the_others(np.where(kept, draft_row, 0.0))[0, tokens]


def _sum_by_value(values, weights):
    """Distinct ``values`` (sorted) and the sum of ``weights`` over each."""
    order = np.argsort(values, kind="stable")
    values, weights = values[order], weights[order]
    starts = np.flatnonzero(np.concatenate([[True], np.diff(values) != 0]))
    return values[starts], np.add.reduceat(weights, starts)


def _bracket(levels: _ThreeLevels, first_starts, second_starts):
    """Certified (lower, upper) bounds on α from bins of x1 values (``first_starts``, into
    ``levels.first_values``) × bins of x2 values (``second_starts``, into ``levels.values``).

    α − A1 = Σ_{x1} W(x1)·A2(x1) + Σ_β Σ_b Σ_{x1 ∈ β} Σ_{x2 ∈ b, x2 ≠ x1} W(x1)·w2(x2|x1)·A3,
    W = (q − p)+. The A2 sum is exact. The weights of a pair of bins are
    Σ_{x1 ∈ β} W(x1)·(L_b(x1) − [x1 ∈ b]·q(x1)·s), L_b(x1) = Σ_{x2 ∈ b} q(x2)(s − r(x2))+
    (x1 itself included: r(x1) = 0); L_b increases with s, so over an x1 bin with s in
    [s_lo, s_hi] they lie between W_β·L_b(s_lo) − own and W_β·L_b(s_hi) − own (L_b computed
    exactly, q·r summed as the residual mass itself: r may overflow; own, the x2 = x1 terms,
    summed exactly), and A3 over a pair of bins between ``_third_acceptance_bounds``. Bins
    of one value each make both bounds the exact sum. The largest draft value must have a
    bin of its own on both sides (``_bin_starts``): there s can be 10^7 and more, and its
    x2 = x1 term cancels exactly only against its own bin. # -> (float, float)"""
    first_ends = np.concatenate([first_starts[1:], [len(levels.first_values)]])
    weight = np.add.reduceat(levels.first_weights, first_starts)  # W per x1 bin
    scale_low, scale_high = levels.scale[first_starts], levels.scale[first_ends - 1]
    first_low, first_high = levels.first_values[first_starts], levels.first_values[first_ends - 1]
    values = levels.values
    second_ends = np.concatenate([second_starts[1:], [len(values)]])
    second_low, second_high = values[second_starts], values[second_ends - 1]
    bin_of = np.searchsorted(second_starts, np.arange(len(values)), side="right") - 1  # x2 bin per token
    # the x2 = x1 terms: each x1 group's weight·(q(x1)·s), by its (x1 bin, x2 bin); the product
    # is formed as in L_b (s times the bin's draft mass), so a bin of x1 alone cancels exactly
    group_bin = np.repeat(np.arange(len(first_starts)), first_ends - first_starts)
    own_bin = bin_of[np.searchsorted(values, levels.first_values)]
    own_weight = levels.first_weights * (levels.scale * levels.first_values)
    num_bins = len(second_starts)
    accepted = float(levels.first_weights @ levels.accept_second)
    low = high = accepted
    for start in range(0, len(first_starts), GROUP_CHUNK):
        chunk = slice(start, start + GROUP_CHUNK)
        size = len(scale_low[chunk])
        # L_b at every bin's s_lo and s_hi, ascending as the bins are: a token with r < s
        # counts at s, i.e. where its position among the sorted scales is ≤ the scale's index
        scales = np.empty(2 * size)
        scales[0::2], scales[1::2] = scale_low[chunk], scale_high[chunk]
        position = np.searchsorted(scales, levels.ratio, side="right")
        key = bin_of * (2 * size + 1) + position
        draft_sums = np.bincount(key, weights=values, minlength=num_bins * (2 * size + 1))
        residual_sums = np.bincount(key, weights=levels.residual_mass, minlength=num_bins * (2 * size + 1))
        draft_below = np.cumsum(draft_sums.reshape(num_bins, 2 * size + 1), axis=1)[:, : 2 * size].T
        residual_below = np.cumsum(residual_sums.reshape(num_bins, 2 * size + 1), axis=1)[:, : 2 * size].T
        second = np.maximum(scales[:, None] * draft_below - residual_below, 0.0)  # [2·size, bins]
        at_low, at_high = _third_acceptance_bounds(
            levels, first_low[chunk], first_high[chunk], scale_low[chunk], scale_high[chunk], second_low, second_high)
        in_chunk = slice(first_starts[start], first_ends[start + size - 1])  # the chunk's x1 groups, in order
        own = np.bincount((group_bin[in_chunk] - start) * num_bins + own_bin[in_chunk], weights=own_weight[in_chunk],
                          minlength=size * num_bins).reshape(size, num_bins)
        bin_weight = weight[chunk][:, None]
        low += float((np.maximum(bin_weight * second[0::2] - own, 0.0) * at_low).sum())
        high += float((np.maximum(bin_weight * second[1::2] - own, 0.0) * at_high).sum())
    return 1.0 - levels.total_variation + low, 1.0 - levels.total_variation + high


def _third_acceptance_bounds(levels, first_low, first_high, scale_low, scale_high, second_low, second_high):
    """Bounds on A3 = (G(t) − G(s))/(1 − G(s)), t = s + (1 − G(s))/(1 − q(x1) − q(x2)), over
    each pair of an x1 bin (q(x1) in [first_low, first_high], s in [scale_low, scale_high])
    and an x2 bin (q(x2) in [second_low, second_high]), by intervals: G increases, so
    G(s) and 1 − G(s) lie between their values at the ends of s, t between
    s_lo + (1 − G(s_hi))/(1 − q1_lo − q2_lo) and s_hi + (1 − G(s_lo))/(1 − q1_hi − q2_hi),
    and A3 ∈ [0, 1]. A pair of one value each gets the exact A3 at both. A3 is 1 where
    q(x1) + q(x2) ≥ 1 (the third draft is the last token: G(∞) = 1); where the second level
    never rejects (1 − G(s) = 0) its weights L are 0 and A3 is set to 0.  # -> [G, bins] twice"""
    accept_low, accept_high = levels.curve(scale_low)[:, None], levels.curve(scale_high)[:, None]
    rest_low, rest_high = 1.0 - accept_high, 1.0 - accept_low  # 1 − G(s) at s_hi and at s_lo
    narrow = levels.one_minus(first_high[:, None], second_high[None, :])  # smallest 1 − q1 − q2
    wide = levels.one_minus(first_low[:, None], second_low[None, :])
    least = scale_low[:, None] + rest_low / np.where(wide > 0, wide, 1.0)
    most = scale_high[:, None] + rest_high / np.where(narrow > 0, narrow, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        lower = np.clip((levels.curve(least) - accept_high) / rest_high, 0.0, 1.0)
        upper = np.clip((levels.curve(most) - accept_low) / rest_low, 0.0, 1.0)
    lower = np.where(wide > 0, lower, 1.0)
    upper = np.where((narrow > 0) & (rest_low > 0), upper, 1.0)
    never = rest_high <= 0
    return np.where(never, 0.0, lower), np.where(never, 0.0, upper)
