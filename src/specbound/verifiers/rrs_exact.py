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
groups both by draft probability, costing O(V log V + D1·D2) for D1, D2 distinct draft
values (a few thousand for a bf16 model's softmax: exact and fast), and brackets the
sum within a tolerance when there are too many distinct values. n ≥ 4 uses the plain
recursion, for small vocabularies.

Work limits (measured on this project's 2-core CPU; ``three_draft_seconds`` and
``recursion_seconds`` estimate a call): a bracket pass over G groups of x1, B bins of x2
and V tokens costs about 9e-8·G·B + 4e-8·G·V/256 s and holds 128·min(G, 256)·B bytes.
The first pass has a bin per value where the row has at most ``FIRST_BIN_COUNT`` distinct
draft values (exact at once: a bf16 model's rows), else ``COARSE_BIN_COUNT`` bins (llama.cpp's
float32 rows, ~10^5 values: the bracket mostly closes there); each further pass has 8× the
bins. Refinement stops where the next pass would take the n = 3 computation past
``BRACKET_SECONDS_LIMIT`` or a pass past ``BRACKET_BYTES_LIMIT``; the acceptance is then the
midpoint of the certified bracket reached, and a ``BracketWarning`` gives the bracket.
Bins give the largest draft values one each (``_bin_starts``), where A3 moves most. The n ≥ 4
recursion (about 1e-4·(V + 1) s per level call), with no bracket to fall back on, is
refused (``checks.WorkLimitError``) beyond ``RECURSION_SECONDS_LIMIT``.
"""

from __future__ import annotations

import math
import warnings

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
BYTES_PER_GROUP_BIN = 128  # the [groups, bins] arrays of one chunk of _bracket
SMALLEST_REST = 1e-300  # below, 1/(1 − q(S)) and its sums could overflow: _split_at_first_draft
FIRST_BIN_COUNT = 4096  # the first pass's bins: one exact pass for rows of at most this many values
COARSE_BIN_COUNT = 1024  # the first pass's bins for rows of more (llama.cpp's float32 rows: ~10^5)
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
    """Estimated seconds of the n = 3 acceptance of one row: its bracket passes, at most
    ``BRACKET_SECONDS_LIMIT`` (where refinement stops)."""
    groups = len(np.unique(draft_row[draft_row > target_row]))
    distinct = len(np.unique(draft_row[draft_row > 0]))
    passes = bracket_seconds(groups, len(draft_row),
                             distinct if distinct <= FIRST_BIN_COUNT else min(COARSE_BIN_COUNT, FIRST_BIN_COUNT))
    if distinct > FIRST_BIN_COUNT:
        passes += bracket_seconds(groups, len(draft_row), distinct)
    return min(BRACKET_SECONDS_LIMIT, passes)


def bracket_seconds(groups: int, tokens: int, bins: int) -> float:
    """Estimated seconds of one ``_bracket`` pass (module docstring)."""
    return SECONDS_PER_GROUP_BIN * groups * bins + SECONDS_PER_CHUNK_TOKEN * groups * tokens / GROUP_CHUNK


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
    Terms depend on x1 only through q(x1), so x1 is grouped by its value (exact); A3
    depends on x2 only through q(x2), so x2 is grouped into bins of draft values: a bin
    holding one value is exact, a bin holding a range is bracketed between A3 at its ends
    (A3 is increasing in q(x2)). Bins are refined until the bracket is within
    ``tolerance`` — with real models' few distinct probabilities it is exact at once.
    """
    target_row = np.asarray(target_row, dtype=np.float64)
    draft_row = np.asarray(draft_row, dtype=np.float64)
    first_rejection = np.maximum(draft_row - target_row, 0.0)
    total_variation = first_rejection.sum()
    if total_variation <= 0:
        return 1.0, 1.0
    residual = np.maximum(target_row - draft_row, 0.0) / total_variation
    curve = min_sum_curve(residual, draft_row)

    # x1: tokens with q > p, grouped by their draft probability c.
    removed, group_weight = _sum_by_value(draft_row[first_rejection > 0], first_rejection[first_rejection > 0])
    one_minus = _complement(draft_row)
    scale = 1.0 / one_minus(removed)  # s per group
    accept_second = curve(scale)  # A2 per group
    rest = 1.0 - accept_second  # P(second draft rejected | x1) = Σ_x2 w2

    # x2: every token with q > 0, sorted by draft probability.
    positive = np.flatnonzero(draft_row > 0)
    positive = positive[np.argsort(draft_row[positive], kind="stable")]
    values = draft_row[positive]
    with np.errstate(over="ignore"):  # a ratio beyond 1.8e308 is above every threshold: inf
        ratio = residual[positive] / values
    distinct = np.flatnonzero(np.concatenate([[True], np.diff(values) != 0]))
    spent = 0.0
    # Rows of more distinct values than one pass can hold start coarser: a pass costs in
    # proportion to its bins, and on real float32 rows 1,024 bins close the bracket where
    # 4,096 did (benchmarks/results/study_exact_unit.md).
    first = FIRST_BIN_COUNT if len(distinct) <= FIRST_BIN_COUNT else min(COARSE_BIN_COUNT, FIRST_BIN_COUNT)
    bins = min(first, len(distinct), _affordable_bins(len(removed), len(values), spent))
    if bins < 1:
        raise WorkLimitError(
            f"num_drafts: RRS-without-replacement acceptance for n = 3 needs about "
            f"{bracket_seconds(len(removed), len(values), 1):,.3g} s even for its coarsest bracket "
            f"({len(removed):,} draft values above the target, V = {len(values):,}), above the limit of "
            f"{BRACKET_SECONDS_LIMIT:g} s")
    while True:
        edges = _bin_starts(distinct, bins)
        low, high = _bracket(values, ratio, residual[positive], edges, removed, scale, accept_second, rest, curve,
                             group_weight, one_minus)
        low, high = 1.0 - total_variation + low, 1.0 - total_variation + high
        spent += bracket_seconds(len(removed), len(values), bins)
        if high - low <= 2 * tolerance or bins == len(distinct):
            return low, high
        finer = min(8 * bins, len(distinct), _affordable_bins(len(removed), len(values), spent))
        if finer <= bins:  # refining is beyond the work limit: the certified bracket reached
            return low, high
        bins = finer


def _bin_starts(distinct, bins: int) -> np.ndarray:
    """Start indices of ``bins`` bins of the tokens sorted by draft value (``distinct``: where
    each distinct value starts): half the bins hold the largest values, one each, the rest
    equal runs of the smaller values. A3 varies most with the largest q(x2): a bin holding
    the top tokens' wide range of values leaves a wide bracket (5e-4 on a float64 row of
    19,281 values at 4,096 equal bins), while among the small values A3 barely moves (the
    same row's bracket closes at 512 bins split this way)."""
    top = min(bins // 2, len(distinct))
    rest = len(distinct) - top
    runs = np.linspace(0, rest, bins - top + 1).astype(int)[:-1] if rest else np.zeros(0, dtype=int)
    return distinct[np.unique(np.concatenate([runs, np.arange(rest, len(distinct))]))]


def _affordable_bins(groups: int, tokens: int, spent: float) -> int:
    """The most bins a ``_bracket`` pass can have within what is left of
    ``BRACKET_SECONDS_LIMIT`` after ``spent`` seconds, and within ``BRACKET_BYTES_LIMIT``."""
    seconds_left = BRACKET_SECONDS_LIMIT - spent - bracket_seconds(groups, tokens, 0)
    by_time = seconds_left / (SECONDS_PER_GROUP_BIN * groups)
    by_memory = BRACKET_BYTES_LIMIT / (BYTES_PER_GROUP_BIN * min(groups, GROUP_CHUNK))
    return int(max(0.0, min(by_time, by_memory)))


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


def _bracket(values, ratio, residual_mass, edges, removed, scale, accept_second, rest, curve, group_weight, one_minus):
    """Σ_g W_g·[A2_g + Σ_b L_b(g)·A3(g, ·)] with A3 at each bin's smallest and largest
    draft value; L_b(g) = Σ_{x2 ∈ b, x2 ≠ x1} q(x2)(s_g − r(x2))+ exactly, with q·r summed
    as the residual mass itself (r may overflow).
    # values, ratio, residual_mass [tokens] sorted by value; edges [bins] start indices; groups [G]"""
    bin_of = np.searchsorted(edges, np.arange(len(values)), side="right") - 1  # [tokens]
    bin_low = values[edges]
    bin_high = values[np.concatenate([edges[1:], [len(values)]]) - 1]
    num_bins = len(edges)
    exact = bool(np.all(bin_low == bin_high))
    low = high = 0.0
    for start in range(0, len(removed), GROUP_CHUNK):
        group = slice(start, start + GROUP_CHUNK)
        chunk_scale = scale[group]  # ascending, since removed is sorted
        size = len(chunk_scale)
        # tokens with r < s_g are those whose position among the sorted s is ≤ g
        position = np.searchsorted(chunk_scale, ratio, side="right")
        key = bin_of * (size + 1) + position
        counts = np.bincount(key, weights=values, minlength=num_bins * (size + 1))
        ratio_mass = np.bincount(key, weights=residual_mass, minlength=num_bins * (size + 1))
        draft_below = np.cumsum(counts.reshape(num_bins, size + 1), axis=1)[:, :size].T  # [G, bins]
        residual_below = np.cumsum(ratio_mass.reshape(num_bins, size + 1), axis=1)[:, :size].T
        second = chunk_scale[:, None] * draft_below - residual_below  # L_b(g) with x1 included
        own_bin = np.searchsorted(edges, np.searchsorted(values, removed[group]), side="right") - 1
        second[np.arange(size), own_bin] -= removed[group] * chunk_scale  # x2 = x1: r(x1) = 0
        second = np.maximum(second, 0.0)
        at_low = _third_acceptance(
            curve, removed[group], chunk_scale, accept_second[group], rest[group], bin_low, one_minus
        )
        at_high = at_low if exact else _third_acceptance(
            curve, removed[group], chunk_scale, accept_second[group], rest[group], bin_high, one_minus
        )
        weight = group_weight[group]
        low += float(weight @ (accept_second[group] + (second * at_low).sum(axis=1)))
        high += float(weight @ (accept_second[group] + (second * at_high).sum(axis=1)))
    return low, high


def _third_acceptance(curve, removed, scale, accept_second, rest, other_draft, one_minus):
    """A3 = (G(s + (1 − G(s))/(1 − q(x1) − q(x2))) − G(s)) / (1 − G(s)) for groups × bins,
    increasing in q(x2) up to its limit 1 as q(x1) + q(x2) → 1 (G(∞) = 1), which it
    keeps beyond (only a bin's end can lie there). Where the second level never rejects
    (1 − G(s) = 0) the weights L are 0 and A3 is set to 0.  # -> [G, bins]"""
    denominator = one_minus(removed[:, None], other_draft[None, :])  # 1 − q(x1) − q(x2)
    inside = denominator > 0
    safe_rest = np.where(rest > 0, rest, 1.0)[:, None]
    threshold = scale[:, None] + np.where(inside, safe_rest / np.where(inside, denominator, 1.0), 0.0)
    value = np.where(inside, np.clip((curve(threshold) - accept_second[:, None]) / safe_rest, 0.0, 1.0), 1.0)
    return np.where(rest[:, None] > 0, value, 0.0)
