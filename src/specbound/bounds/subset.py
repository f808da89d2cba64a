"""Subset selection: α* = 1 + min_H [p(H) − Q(H)] and its certificate H* (SPEC.md §4.2, [HU]).

Convention (SPEC.md §0): p is the target distribution, q the draft distribution, D the
joint law of the n draft tokens x̄ = (x1..xn) under a draft scheme (SPEC.md §4.1), and
Q(H) = P_{x̄~D}(all n drafts ∈ H).

Dualising the coupling LP (``specbound.bounds.coupling``) and using its total
unimodularity gives [HU]'s subset-selection formula. Two ways to evaluate it live here,
both generic in the draft law (each draft scheme says how to compute its Q):
- ``bruteforce_optimum``: all 2^V subsets, from an enumerated joint law (tiny V only);
- ``prefix_scan_optimum``: by q-convexity [HU] the minimum is attained on a prefix of the
  tokens sorted by p/q ascending (``scan_order``), so only the V + 1 prefixes are checked,
  given Q on every prefix: O(V log V), batched, at real vocabulary sizes; with bounds on Q,
  Q is computed only on the prefixes the bounds leave a chance to minimise.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from specbound.compiled import compiled
from specbound.probability import LAST_KEY_BITS, ascending_order

MAX_BRUTEFORCE_VOCAB = 16
MAX_BRUTEFORCE_ENTRIES = 20_000_000  # 2^V subsets x K draft tuples
SCAN_ROW_BLOCK = 4  # rows scanned together: larger blocks fall out of cache at V ~ 150k
PRUNING_MARGIN = 1e-12  # above the rounding of the gaps and their bounds (running sums of ≤ 1)


class OptimalAcceptance:
    """α* per row and a subset H* attaining the minimum of p(H) − Q(H).

    H* is the certificate: every lossless verifier under this draft scheme loses at least
    Q(H*) − p(H*) acceptance, because drafts fall entirely inside H* more often (Q) than
    the target can emit a token of H* (p). When several subsets attain the minimum, each
    function says which one it returns.

    Given as a mask, or as ``prefixes`` (each row's scan order and the length of its
    minimising prefix, ``prefix_scan_optimum``), from which the mask is built when first
    read (a study reads α* alone).
    # acceptance [batch], optimal_subset [batch, vocab] bool, prefixes ([batch, vocab] int, [batch] int)
    """

    def __init__(self, acceptance: np.ndarray, optimal_subset: np.ndarray | None = None, prefixes=None):
        self.acceptance = acceptance  # [batch]
        self._subset, self._prefixes = optimal_subset, prefixes

    @property
    def optimal_subset(self) -> np.ndarray:
        """H* per row.  # [batch, vocab] bool"""
        if self._subset is None:
            order, lengths = self._prefixes
            subset = np.zeros(order.shape, dtype=bool)
            for row, length in enumerate(lengths):
                subset[row, order[row, :length]] = True
            self._subset = subset
        return self._subset


def bruteforce_optimum(target_row: np.ndarray, draft_tuples, tuple_probs) -> tuple[float, np.ndarray]:
    """α* = 1 + min over all 2^V subsets H of [p(H) − Q(H)], Q from an enumerated joint law.

    Exponential in V: for tests and tiny vocabularies (V ≤ ``MAX_BRUTEFORCE_VOCAB``).
    Among minimisers, H* is the one whose bitmask Σ_{y∈H} 2^y is smallest.
    # target_row [vocab], draft_tuples [K, n], tuple_probs [K] -> α*, H* [vocab] bool
    """
    vocab_size = target_row.shape[0]
    if vocab_size > MAX_BRUTEFORCE_VOCAB:
        raise ValueError(
            f"target_probs: brute force enumerates 2^V subsets; V = {vocab_size} exceeds "
            f"{MAX_BRUTEFORCE_VOCAB}"
        )
    subsets = np.arange(2**vocab_size, dtype=np.int64)  # bit y set <=> token y ∈ H
    members = (subsets[:, None] >> np.arange(vocab_size)) & 1  # [2^V, vocab]
    if subsets.size * len(draft_tuples) > MAX_BRUTEFORCE_ENTRIES:
        raise ValueError(
            f"num_drafts: 2^{vocab_size} subsets x {len(draft_tuples)} draft tuples exceeds "
            f"{MAX_BRUTEFORCE_ENTRIES:,} entries"
        )
    tuple_bits = np.bitwise_or.reduce(np.int64(1) << np.asarray(draft_tuples), axis=1)  # [K]
    all_inside = (tuple_bits[None, :] & ~subsets[:, None]) == 0  # [2^V, K]
    gap = members @ target_row - all_inside @ tuple_probs  # p(H) − Q(H), [2^V]
    best = int(np.argmin(gap))
    return 1.0 + gap[best], members[best].astype(bool)


def scan_order(target_probs: np.ndarray, draft_probs: np.ndarray, guess: np.ndarray | None = None) -> np.ndarray:
    """Tokens sorted by p/q ascending: p = 0 < q first (ratio 0), q = 0 last (ratio ∞).

    Tokens with p = q = 0 (ratio NaN) go last too; they change neither p(H) nor Q(H).
    Equal ratios keep token-id order: the order is that of (p/q, token id), sorted by the
    ratio's bits (monotone for non-negative floats, NaN above ∞) in ``sort_by_ratio``. A row
    where p/q overflows (q subnormal) is sorted by the exact ratio instead
    (``_exact_scan_order``): an overflowed ratio is no ∞, it comes before the tokens of
    q = 0. Rows are taken in float64.

    ``guess``: an order that is likely this one (a wider row's scan order restricted to
    these tokens, ``restricted_order``), taken for every row where it is a permutation
    whose (ratio bits, token id) rise strictly — the one order sorted that way, in O(vocab)
    — and sorted as above where it is not. The result is the same with or without it.
    # [batch, vocab] x2, guess [batch, vocab] int or None -> [batch, vocab] int
    """
    target_probs = np.ascontiguousarray(target_probs, dtype=np.float64)
    draft_probs = np.ascontiguousarray(draft_probs, dtype=np.float64)
    taken = _sorts_the_ratios(target_probs, draft_probs, guess)
    if taken.size and taken.all():
        return np.ascontiguousarray(guess, dtype=np.int64)
    order = np.empty(target_probs.shape, dtype=np.int64)
    if taken.any():
        order[taken] = guess[taken]
    overflowed = sort_by_ratio(target_probs, draft_probs, ~taken, order)
    if overflowed.any():
        order[overflowed] = _exact_scan_order(target_probs[overflowed], draft_probs[overflowed])
    return order


def _sorts_the_ratios(target_probs: np.ndarray, draft_probs: np.ndarray, guess: np.ndarray | None) -> np.ndarray:
    """Per row: is ``guess`` an order along which (ratio bits, token id) rise strictly
    (``follows_the_ratios``)? Then it is the scan order. False for every row where it has
    another shape or is not integer. # [batch, vocab] x2, [batch, vocab] int -> [batch] bool"""
    if guess is None or guess.shape != target_probs.shape or not np.issubdtype(guess.dtype, np.integer):
        return np.zeros(target_probs.shape[0], dtype=bool)
    return follows_the_ratios(target_probs, draft_probs, np.ascontiguousarray(guess, dtype=np.int64))


@compiled(error_model="numpy")
def follows_the_ratios(target, draft, order):
    """Per row: do (p/q, token id) rise strictly along ``order`` (NaN above every ratio,
    equal to NaN), every id inside the row, and no ratio overflow? Strictly rising pairs are
    distinct tokens, all V of them: the order is the permutation that sorts the row by them,
    the scan order. (For non-negative floats the order of the values is that of the bits
    ``sort_by_ratio`` sorts.)
    # [batch, vocab] x2, [batch, vocab] int -> [batch] bool"""
    batch, vocab_size = target.shape
    follows = np.zeros(batch, dtype=np.bool_)
    ratios = np.empty(vocab_size)
    for row in range(batch):
        overflowed = False
        for token in range(vocab_size):
            ratios[token] = target[row, token] / draft[row, token]
            overflowed |= ratios[token] == np.inf and draft[row, token] > 0
        if overflowed:
            continue
        previous_ratio, previous_token = -1.0, -1
        for place in range(vocab_size):
            token = order[row, place]
            if token < 0 or token >= vocab_size:
                break
            ratio = ratios[token]
            if previous_ratio != previous_ratio:  # NaN: only NaN, by id, may follow
                rising = ratio != ratio and token > previous_token
            else:
                tied = ratio == previous_ratio and token > previous_token
                rising = ratio != ratio or ratio > previous_ratio or tied
            if not rising:
                break
            previous_ratio, previous_token = ratio, token
        else:
            follows[row] = True
    return follows


@compiled(error_model="numpy")
def sort_by_ratio(target, draft, rows, order):
    """Writes into ``order`` each selected row's tokens sorted by (p/q, token id), p/q by its
    bits (p/q + 0, −0 made +0; NaN as the largest key); True for a row where p/q overflowed
    (∞ with q > 0), whose order is then left to the exact sort. The sort is
    ``probability.ascending_order``, stable, so equal keys stay in id order.
    # [batch, vocab] x2, [batch] bool, writes [batch, vocab] int -> [batch] bool"""
    batch, vocab_size = target.shape
    overflowed = np.zeros(batch, dtype=np.bool_)
    ratios = np.empty(vocab_size)
    keys = ratios.view(np.uint64)
    for row in range(batch):
        if not rows[row]:
            continue
        for token in range(vocab_size):
            ratio = target[row, token] / draft[row, token] + 0.0
            ratios[token] = ratio
            if ratio != ratio:
                keys[token] = np.uint64(LAST_KEY_BITS)
            elif ratio == np.inf and draft[row, token] > 0:
                overflowed[row] = True
        if overflowed[row]:
            continue
        sorted_tokens = ascending_order(ratios)
        for place in range(vocab_size):
            order[row, place] = sorted_tokens[place]
    return overflowed


def restricted_order(order: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """``order`` (of a row's tokens) restricted to the tokens ``kept``, each renumbered to
    its place among the kept tokens in id order: the scan order of the kept tokens
    renormalised, up to ratios that renormalising rounds differently (``scan_order`` takes it
    as its guess and checks it). # [vocab] int, [vocab] bool -> [kept] int"""
    return kept_in_order(np.ascontiguousarray(order, dtype=np.int64), np.ascontiguousarray(kept, dtype=np.bool_))


@compiled
def kept_in_order(order, kept):
    """The kept tokens of ``order``, each as its place among the kept tokens by id
    (``restricted_order``). # [vocab] int, [vocab] bool -> [kept] int"""
    place = np.empty(kept.size, dtype=np.int64)  # −1: not kept
    count = 0
    for token in range(kept.size):
        place[token] = count if kept[token] else -1
        count += kept[token]
    restricted = np.empty(count + 1, dtype=np.int64)  # a dropped token is written one past, then overwritten
    count = 0
    for token in order:
        restricted[count] = place[token]
        count += place[token] >= 0
    return restricted[:count]


def in_order(values: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Each row's values permuted into the row's ``order`` (``np.take_along_axis``; a single
    row as a flat take, a third of the time). # [batch, vocab] x2 -> [batch, vocab]"""
    if values.shape[0] == 1:
        return values[0].take(order[0])[None]
    return np.take_along_axis(values, order, axis=1)


def _exact_scan_order(target_probs: np.ndarray, draft_probs: np.ndarray) -> np.ndarray:
    """The scan order of ``scan_order`` for ratios beyond float64's range.

    p/q = (m_p / m_q) · 2^(e_p − e_q) with mantissas m ∈ [½, 1) (``np.frexp``, exact for
    subnormals too); scaled into [1, 2), the mantissa quotient and the exponent sort the
    ratios lexicographically, each as exact as one correctly rounded division. Ratio 0
    (p = 0 < q) first, then finite ratios, then q = 0 < p, then p = q = 0; ties in id order.
    # [batch, vocab] x2 -> [batch, vocab] int
    """
    target_mantissa, target_exponent = np.frexp(target_probs)
    draft_mantissa, draft_exponent = np.frexp(draft_probs)
    with np.errstate(divide="ignore", invalid="ignore"):
        quotient = target_mantissa / draft_mantissa  # in (½, 2) where both are positive
    below_one = quotient < 1.0
    quotient = np.where(below_one, 2.0 * quotient, quotient)
    exponent = target_exponent.astype(np.int64) - draft_exponent - below_one
    big = np.iinfo(np.int64).max
    positive_target, positive_draft = target_probs > 0, draft_probs > 0
    exponent = np.where(positive_draft & ~positive_target, -big, exponent)  # ratio 0
    exponent = np.where(~positive_draft & positive_target, big - 1, exponent)  # ratio ∞
    exponent = np.where(~positive_draft & ~positive_target, big, exponent)  # ratio NaN
    quotient = np.where(positive_draft & positive_target, quotient, 0.0)
    ids = np.broadcast_to(np.arange(target_probs.shape[1]), target_probs.shape)
    return np.lexsort((ids, quotient, exponent), axis=-1)


def prefix_sums(values: np.ndarray) -> np.ndarray:
    """[batch, V] -> [batch, V+1]: column k holds the sum of the first k values, added one
    by one from the first (``np.cumsum``'s order and values, bit for bit)."""
    values = np.ascontiguousarray(values, dtype=np.float64)
    sums = np.empty((values.shape[0], values.shape[1] + 1))
    running_sums(values, sums)
    return sums


@compiled
def running_sums(values, sums):
    """Writes 0 and the running sums of each row of ``values`` into ``sums``, the running
    sum held in a register (``np.cumsum`` stores and reloads it at every step).
    # [batch, V], [batch, V + 1] out"""
    for row in range(values.shape[0]):
        running = 0.0
        sums[row, 0] = running
        for column in range(values.shape[1]):
            running += values[row, column]
            sums[row, column + 1] = running


def prefix_scan_optimum(rows, all_in_mass: Callable, mass_bounds: Callable | None = None) -> OptimalAcceptance:
    """α* = 1 + min_k [p(H_k) − Q(H_k)] over the prefixes H_k of the scan order, and
    H* = the shortest minimising prefix. ``rows`` are checked row pairs (``bounds.rows.RowPairs``),
    whose scan order and running sums every scheme reads from the one computation.
    ``all_in_mass`` maps the draft rows permuted into scan order to Q on every prefix
    (``[rows, vocab] -> [rows, vocab + 1]``); it is the draft scheme's own formula. Rows go
    in blocks of ``SCAN_ROW_BLOCK``.

    With ``mass_bounds`` (ordered draft rows and p(H_k) [rows, vocab + 1] -> lower, upper
    bounds on Q, both [rows, vocab + 1]; p lets it spare its finer bounds where coarser ones
    rule a prefix out) only the prefixes that can minimise are computed exactly: every gap
    is at most p(H_k) − lower_k, so a prefix with p(H_k) − upper_k above the smallest of
    those (by more than rounding, ``PRUNING_MARGIN``) is not a minimiser. ``all_in_mass`` then takes the
    mask of the prefixes to compute as a second argument (others may be NaN).
    # rows: RowPairs [batch, vocab] -> OptimalAcceptance ([batch], [batch, vocab])
    """
    acceptance, lengths = [], []
    for start in range(0, rows.target.shape[0], SCAN_ROW_BLOCK):
        block = slice(start, start + SCAN_ROW_BLOCK)
        ordered_draft, inside = rows.draft_in_scan_order[block], rows.target_inside[block]
        inside = np.ascontiguousarray(inside, dtype=np.float64)
        if mass_bounds is None:
            needed = np.ones(inside.shape, dtype=bool)
            mass = all_in_mass(ordered_draft)
        else:
            lower, upper = mass_bounds(ordered_draft, inside)
            needed = can_minimise(inside, np.ascontiguousarray(lower, dtype=np.float64),
                                  np.ascontiguousarray(upper, dtype=np.float64))
            mass = all_in_mass(ordered_draft, needed)
        best, gap = first_minimum(inside, np.ascontiguousarray(mass, dtype=np.float64), needed)
        acceptance.append(1.0 + gap)
        lengths.append(best)
    return OptimalAcceptance(np.concatenate(acceptance), prefixes=(rows.scan_order, np.concatenate(lengths)))


@compiled
def can_minimise(inside, lower, upper):
    """Per row, the prefixes that can minimise the gap p(H_k) − Q(H_k) given lower ≤ Q ≤ upper:
    p(H_k) − upper_k ≤ min_j (p(H_j) − lower_j) + ``PRUNING_MARGIN`` (``prefix_scan_optimum``;
    a NaN among the p − lower makes that minimum NaN, and no prefix then qualifies, as
    numpy's min and comparison have it). # [batch, vocab + 1] x3 -> [batch, vocab + 1] bool"""
    batch, size = inside.shape
    needed = np.empty((batch, size), dtype=np.bool_)
    for row in range(batch):
        ceiling = np.inf
        for k in range(size):
            gap = inside[row, k] - lower[row, k]
            if gap < ceiling or gap != gap:
                ceiling = gap
                if gap != gap:
                    break
        ceiling += PRUNING_MARGIN
        for k in range(size):
            needed[row, k] = inside[row, k] - upper[row, k] <= ceiling
    return needed


@compiled
def first_minimum(inside, mass, needed):
    """Per row, the first prefix minimising p(H_k) − Q(H_k) over the ``needed`` ones (∞
    elsewhere: the first prefix when none is needed) and that gap; a NaN gap is taken as
    the minimum, the first one, as ``np.argmin`` takes it.
    # [batch, vocab + 1] x2, [batch, vocab + 1] bool -> [batch] int, [batch]"""
    batch, size = inside.shape
    best, smallest = np.zeros(batch, dtype=np.int64), np.full(batch, np.inf)
    for row in range(batch):
        for k in range(size):
            if not needed[row, k]:
                continue
            gap = inside[row, k] - mass[row, k]
            if gap != gap:
                best[row], smallest[row] = k, gap
                break
            if gap < smallest[row]:
                best[row], smallest[row] = k, gap
    return best, smallest
