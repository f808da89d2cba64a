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
distinct values, closed by 256 bins a side and, where that is not enough, a few hundred
finer x1 bins over ~500 x2 bins). n ≥ 4 uses the plain recursion, for small vocabularies.

Work limits (measured on this project's 2-core CPU; ``three_draft_seconds`` and
``recursion_seconds`` estimate a call): a row's sorts cost about 1e-6·V s, a bracket pass
over B1 × B2 bins and V tokens about 9e-8·B1·B2 + 8e-8·B1·V/256 s, holding
128·min(B1, 256)·B2 bytes. A row of more values than ``FIRST_BIN_COUNT`` starts at
``COARSE_BIN_COUNT`` bins a side and refines only the x1 bins that carry the bracket's
width (``_Bins``, ``_widest``): each is cut at the x1 bins of twice its count and bracketed
again over x2 bins of its own, doubled at its first, third, … refinement and wherever it
was not cut.
Refinement stops where the next pass would take the n = 3 computation past
``BRACKET_SECONDS_LIMIT`` or a pass past ``BRACKET_BYTES_LIMIT``; the acceptance is then
the midpoint of the certified bracket reached, and a ``BracketWarning`` gives the bracket. The n ≥ 4 recursion (about
1e-4·(V + 1) s per level call), with no bracket to fall back on, is refused
(``checks.WorkLimitError``) beyond ``RECURSION_SECONDS_LIMIT``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

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
REFINED_WIDTH_SHARE = 0.1  # a refined bin's expected width, of its width before (real rows: 1/13 to 1/29)
REFINEMENT_AIM = 0.9  # of the width allowed, what a refinement aims at


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
    target, draft = target_row[both], draft_row[both]
    with np.errstate(over="ignore"):
        ratio = target / draft
    steep = np.isinf(ratio)
    steep_target, steep_draft = target[steep].sum(), draft[steep].sum()
    if steep.any():
        ratio, target, draft = ratio[~steep], target[~steep], draft[~steep]
    order = np.argsort(ratio)
    ratio = ratio[order]
    target_upto = np.cumsum(target[order])
    draft_beyond = np.zeros_like(ratio)
    draft_beyond[:-1] = np.cumsum(draft[order][::-1])[-2::-1]
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
    exact pass; any other row starts at ``COARSE_BIN_COUNT`` bins a side, then brackets
    again only its widest x1 bins, finer and over more x2 bins (``_Bins.refined``,
    ``_widest``), until the bracket is within ``tolerance`` or the work limit is reached.

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
        (``benchmarks/results/study_exact_unit.md``, round 5)."""
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
    ``distinct`` where each value starts, ``first_index`` where one token of each x1 value
    is), the curve G and 1 − q sums."""

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
    first_index: np.ndarray
    setup_seconds: float
    _bins: dict = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, target_row, draft_row):
        first_rejection = np.maximum(draft_row - target_row, 0.0)
        total_variation = first_rejection.sum()
        if total_variation <= 0:
            return None
        residual = np.maximum(target_row - draft_row, 0.0) / total_variation
        curve = min_sum_curve(residual, draft_row)
        positive = np.flatnonzero(draft_row > 0)  # every rejectable token among them: q > p ≥ 0
        positive = positive[np.argsort(draft_row[positive])]
        values = draft_row[positive]
        rejectable = np.flatnonzero(first_rejection[positive] > 0)  # where in `values`
        first_starts = np.flatnonzero(np.concatenate([[True], np.diff(values[rejectable]) != 0]))
        first_values = values[rejectable[first_starts]]
        first_weights = np.add.reduceat(first_rejection[positive[rejectable]], first_starts)
        one_minus = _complement(draft_row)
        scale = 1.0 / one_minus(first_values)
        with np.errstate(over="ignore"):  # a ratio beyond 1.8e308 is above every threshold: inf
            ratio = residual[positive] / values
        distinct = np.flatnonzero(np.concatenate([[True], np.diff(values) != 0]))
        return cls(float(total_variation), curve, one_minus, first_values, first_weights, scale, curve(scale),
                   values, ratio, residual[positive], distinct, rejectable[first_starts],
                   SECONDS_PER_ROW_TOKEN * len(draft_row))

    def first_bins(self, bins: int) -> np.ndarray:
        """Start indices (into ``first_values``) of at most ``bins`` bins of x1 values."""
        if ("first", bins) not in self._bins:
            self._bins["first", bins] = _bin_starts(self.first_values, self.first_weights, bins)
        return self._bins["first", bins]

    def second_bins(self, bins: int) -> np.ndarray:
        """Start indices (into ``values``) of at most ``bins`` bins of x2 values."""
        if ("second", bins) not in self._bins:
            counts = np.diff(np.append(self.distinct, len(self.values)))
            distinct_values = self.values[self.distinct]
            self._bins["second", bins] = self.distinct[_bin_starts(distinct_values, distinct_values * counts, bins)]
        return self._bins["second", bins]

    def seconds(self, passes) -> float:
        """Estimated seconds of ``_bracket`` calls of (x1 bins, x2 bins) ``passes``."""
        return sum(bracket_seconds(first, len(self.values), second) for first, second in passes)

    def affordable(self, passes, spent: float) -> bool:
        """Whether ``_bracket`` calls of (x1 bins, x2 bins) ``passes`` fit what is left of
        ``BRACKET_SECONDS_LIMIT`` after ``spent`` seconds, and each ``BRACKET_BYTES_LIMIT``."""
        return (spent + self.seconds(passes) <= BRACKET_SECONDS_LIMIT
                and all(BYTES_PER_GROUP_BIN * min(first, GROUP_CHUNK) * second <= BRACKET_BYTES_LIMIT
                        for first, second in passes))

    def bracket(self, low_shares, high_shares):
        """Bounds on α from certified shares of α − (1 − TV) of x1 bins that hold every x1
        value (``_bracket``).  # [bins], [bins] -> (float, float)"""
        accepted_first = 1.0 - self.total_variation
        return accepted_first + float(low_shares.sum()), accepted_first + float(high_shares.sum())


def _complement(draft_row):
    """v -> 1 − v and (v [k], w [m]) -> 1 − v − w [k, m] for draft values, exact where it
    matters: for the largest value, when it is above 1/2, 1 − q(top) is the summed mass of
    the other tokens (``probability.mass_of_the_others``), and for the two largest values
    1 − q(top) − q(second) is the summed mass of the rest (0.99999968 and 3.2e-7 beside a
    token of 1e-17 leave 1e-17, which the difference gets wrong by 1e-5 relative). Any other
    pair of values leaves at least a third of the mass, and (1 − v) − w, or (1 − w) − v
    where w is the largest value, is exact to rounding."""
    second, top = np.argpartition(draft_row, -2)[-2:]
    top_value, second_value = draft_row[top], draft_row[second]
    top_complement = mass_of_the_others(draft_row)[0, top] if top_value > 0.5 else None
    pair_complement = zeroed(draft_row[None, :], np.array([[top, second]])).sum()

    def one_minus(values, others=None):
        values = np.asarray(values, dtype=np.float64)
        if others is not None:
            table = one_minus(values)[:, None] - others[None, :]
            largest = others == top_value
            table[:, largest] = one_minus(others[largest])[None, :] - values[:, None]
            for mine, theirs in ((top_value, second_value), (second_value, top_value)):
                table[np.ix_(values == mine, others == theirs)] = pair_complement
            return table
        if top_complement is None:
            return 1.0 - values
        return np.where(values == top_value, top_complement, 1.0 - values)

    return one_minus


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
    only against its own bin. # -> [bins], [bins]"""
    sizes = first_ends - first_starts
    weight = _sums_over(levels.first_weights, first_starts, first_ends)  # W per x1 bin
    accepted = _sums_over(levels.first_weights * levels.accept_second, first_starts, first_ends)
    scale_low, scale_high = levels.scale[first_starts], levels.scale[first_ends - 1]
    first_low, first_high = levels.first_values[first_starts], levels.first_values[first_ends - 1]
    values = levels.values
    second_ends = np.concatenate([second_starts[1:], [len(values)]])
    second_low, second_high = values[second_starts], values[second_ends - 1]
    num_bins = len(second_starts)
    bin_of = np.repeat(np.arange(num_bins), second_ends - second_starts)  # x2 bin per token
    # a token of r = 0 (p² = 0, no residual mass) counts in L_b at every s ≥ 1, one of r ≥ the
    # largest s at none: only the few between (a few % of a real row's) are placed among each
    # chunk's scales
    resting = levels.ratio == 0
    resting_draft = np.bincount(bin_of[resting], weights=values[resting], minlength=num_bins)
    moving = np.flatnonzero((levels.ratio > 0) & (levels.ratio < scale_high[-1]))
    moving_bin, moving_ratio = bin_of[moving], levels.ratio[moving]
    moving_draft, moving_residual = values[moving], levels.residual_mass[moving]
    # the x2 = x1 terms: each x1 group's weight·(q(x1)·s), by its (x1 bin, x2 bin); the product
    # is formed as in L_b (s times the bin's draft mass), so a bin of x1 alone cancels exactly
    group_start = np.concatenate([[0], np.cumsum(sizes)])  # where each bin's x1 groups start among them all
    group_bin = np.repeat(np.arange(len(first_starts)), sizes)
    group = np.arange(group_start[-1]) + np.repeat(first_starts - group_start[:-1], sizes)
    own_bin = bin_of[levels.first_index[group]]
    own_weight = (levels.first_weights * (levels.scale * levels.first_values))[group]
    low, high = accepted.copy(), accepted.copy()
    for start in range(0, len(first_starts), GROUP_CHUNK):
        chunk = slice(start, start + GROUP_CHUNK)
        size = len(scale_low[chunk])
        # L_b at every bin's s_lo and s_hi, ascending as the bins are: a token with r < s
        # counts at s, i.e. where its position among the sorted scales is ≤ the scale's index
        scales = np.empty(2 * size)
        scales[0::2], scales[1::2] = scale_low[chunk], scale_high[chunk]
        key = np.searchsorted(scales, moving_ratio, side="right") * num_bins + moving_bin
        draft_sums, residual_sums = np.zeros((2 * size + 1) * num_bins), np.zeros((2 * size + 1) * num_bins)
        draft_sums[:num_bins] = resting_draft
        np.add.at(draft_sums, key, moving_draft)
        np.add.at(residual_sums, key, moving_residual)
        draft_below = np.cumsum(draft_sums.reshape(2 * size + 1, num_bins)[: 2 * size], axis=0)  # [2·size, bins]
        residual_below = np.cumsum(residual_sums.reshape(2 * size + 1, num_bins)[: 2 * size], axis=0)
        second = np.maximum(scales[:, None] * draft_below - residual_below, 0.0)  # [2·size, bins]
        at_low, at_high = _third_acceptance_bounds(
            levels, first_low[chunk], first_high[chunk], scale_low[chunk], scale_high[chunk], second_low, second_high)
        in_chunk = slice(group_start[start], group_start[start + size])  # the chunk's x1 groups, in order
        own = np.bincount((group_bin[in_chunk] - start) * num_bins + own_bin[in_chunk], weights=own_weight[in_chunk],
                          minlength=size * num_bins).reshape(size, num_bins)
        bin_weight = weight[chunk][:, None]
        low[chunk] += (np.maximum(bin_weight * second[0::2] - own, 0.0) * at_low).sum(axis=1)
        high[chunk] += (np.maximum(bin_weight * second[1::2] - own, 0.0) * at_high).sum(axis=1)
    return low, high


def _sums_over(values, starts, ends) -> np.ndarray:
    """Σ values[start:end] for each (start, end), end > start.  # values [k]; starts, ends [m] -> [m]"""
    bounds = np.empty(2 * len(starts), dtype=np.int64)
    bounds[0::2], bounds[1::2] = starts, ends
    return np.add.reduceat(np.append(values, 0.0), bounds)[0::2]


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
    narrow = levels.one_minus(first_high, second_high)  # smallest 1 − q1 − q2
    wide = levels.one_minus(first_low, second_low)
    with np.errstate(divide="ignore", invalid="ignore"):  # where they are 0, the cases below set A3
        lower = (levels.curve(scale_low[:, None] + rest_low / wide) - accept_high) / rest_high
        upper = (levels.curve(scale_high[:, None] + rest_high / narrow) - accept_low) / rest_low
    np.clip(lower, 0.0, 1.0, out=lower)
    np.clip(upper, 0.0, 1.0, out=upper)
    lower[wide <= 0] = 1.0
    upper[narrow <= 0] = 1.0
    upper[rest_low[:, 0] <= 0] = 1.0
    never = rest_high[:, 0] <= 0
    lower[never] = upper[never] = 0.0
    return lower, upper
