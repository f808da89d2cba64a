"""Q(H) for drafts drawn without replacement, n ≥ 3, by the exponential race (SPEC.md §4.2).

Sampling without replacement is an exponential race: token x arrives at E_x ~ Exp(q(x)),
independently, and the drafts are the first n arrivals. Q(H) = P(all n drafts ∈ H) is
then an integral over the arrival time of the first token outside H, whose inner term — a
Poisson-binomial tail over the tokens of H — does not depend on H's complement, so one
incremental pass over growing prefixes H_k evaluates a window of prefixes at fixed
quadrature nodes, from the arrival-count law of the tokens before it, which each token
enters once as the windows advance (``race_all_in_mass``, ``_HeadLaw``). The prefix scan
of α* needs the race only where bounds from the n = 2 closed form leave a prefix a chance
to minimise (``race_mass_bounds``, used by ``subset.prefix_scan_optimum``). Letters:
q = draft (SPEC.md §0).
"""

from __future__ import annotations

from functools import cache
from math import factorial, log

import numpy as np
from scipy.special import gammaincc, gammainccinv

from specbound.bounds.subset import PRUNING_MARGIN
from specbound.compiled import compiled
from specbound.probability import largest_and_the_rest

RACE_TRUNCATION = 1e-13  # each neglected piece of the integral is below this
RACE_NODES_PER_OCTAVE = 3  # trapezoid step ln(2)/3 in ln t; a node's successor is at 2t
RACE_SPAN = 16.0  # a window's prefixes have r_first / r_last ≤ 16, so e^{t q(window)} < e^{520}
RACE_GAP = 512  # needed prefixes more than this many tokens apart go to separate windows
RACE_LARGE_COUNT = 80  # a head with n + 80 tokens of e^{tq} − 1 > 1: P(< n arrive) < 1e-18
RACE_ACCURACY = 1e-11  # |error of Q(H)| observed below 1e-12; tests hold it to this bound
BOUND_SLACK = 1e-12  # race_mass_bounds' allowance for rounding
WINDOW_BLOCK = 256  # a window's tokens per block of ``_window_sums`` (its arrays stay in cache)
RACE_TINY = 0.25  # a head token with t·q below this enters a node's law through the head's moments


def race_all_in_mass(draft_row, num_drafts: int, needed=None) -> np.ndarray:
    """Q(H_k) = P(n draws without replacement all land in H_k) for every prefix k = 0..V,
    or only where ``needed`` [V + 1] bool is True (NaN elsewhere).

    Math (SPEC.md §4.2). Sampling without replacement is an exponential race: token x
    arrives at E_x ~ Exp(q(x)), independently, and the drafts are the first n arrivals.
    With r = q(H^c) and G_H(t) = P(fewer than n tokens of H arrived by t),

        Q(H) = 1 − ∫_0^∞ r e^{−rt} G_H(t) dt
             = (1 + r)^{−n} + ∫_0^∞ r e^{−rt} (W(t) − G_H(t)) dt,

    with the control variate W(t) = P(Erlang(n, 1) > t), whose transform is known;
    W − G vanishes like t^n at 0, so the integrand decays at both ends of ln t. The
    integral is a trapezoid rule in ln t with ``RACE_NODES_PER_OCTAVE`` nodes per doubling
    of t (so a(2t) = a(t)(a(t) + 2) costs no exponential), truncated where every neglected
    piece is below ``RACE_TRUNCATION``.

    The prefixes go in windows of consecutive prefixes (``_windows``). In a window starting
    at prefix k0, G = Σ_{c<n} P(c head tokens arrived)·P(fewer than n − c window tokens
    arrived): the head's arrival-count law is kept at every node any window needs (the first
    nodes of one grid, ``_window_nodes``) by sums that each head token adds to once
    (``_HeadLaw``), and the window's over growing prefixes is e^{−t q(W)} Σ_c e_c(a),
    a_x = e^{t q(x)} − 1 (elementary symmetric sums), a chain of cumulative sums of positive
    terms — stable and vectorised. A window's r varies by at most ``RACE_SPAN``, so its
    sums stay finite up to its horizon.
    # draft_row [vocab] in scan order, needed [vocab + 1] bool or None -> [vocab + 1]
    """
    draft = np.ascontiguousarray(draft_row, dtype=np.float64)
    n = num_drafts
    every = needed is None
    needed = np.zeros(0, dtype=np.bool_) if every else np.ascontiguousarray(needed, dtype=np.bool_)
    remaining, mass, integral, wanted = _race_prefixes(draft, n, needed, every)
    windows = _windows(wanted, remaining)
    nodes = _window_nodes(draft, remaining, windows, n)
    head, head_end = _HeadLaw(_race_times(n, max(nodes, default=0)), n), 0
    for (first, last), num_nodes in zip(windows, nodes):
        piece = draft[head_end:first]
        head.add(piece[piece > 0])
        head_end = first
        window = slice(first, last + 1)  # every prefix in it needs the integral: support and r are monotone
        mass[window] = np.where(integral[window], _window_mass(draft, remaining, first, last, n, head, num_nodes),
                                mass[window])
    _race_finish(mass, integral, needed, every)
    return mass


@compiled
def _race_prefixes(draft, n, needed, every):
    """For ``race_all_in_mass``, in one pass over the prefixes: r_k = q(H_k^c) (summed from
    the tail for accuracy), Q where no integral is needed (1 where H_k holds n or more
    drawable tokens, 0 where fewer), which prefixes need the integral (n or more drawable
    tokens and r_k > 0) and those of them to compute (every one, or those ``needed``).
    # [vocab], int, [vocab + 1] bool (or empty), bool -> [vocab + 1] x2, [vocab + 1] bool, [computed] int"""
    size = draft.size
    remaining = np.empty(size + 1)
    remaining[size] = 0.0
    for k in range(size - 1, -1, -1):
        remaining[k] = remaining[k + 1] + draft[k]
    mass, integral = np.empty(size + 1), np.empty(size + 1, dtype=np.bool_)
    wanted = np.empty(size + 1, dtype=np.int64)
    support = count = 0
    for k in range(size + 1):
        if k > 0 and draft[k - 1] > 0:
            support += 1
        mass[k] = 1.0 if support >= n else 0.0
        integral[k] = support >= n and remaining[k] > 0
        if integral[k] and (every or needed[k]):
            wanted[count] = k
            count += 1
    return remaining, mass, integral, wanted[:count]


@compiled
def _race_finish(mass, integral, needed, every):
    """Q clipped into [0, 1] where it is an integral (NaN kept); NaN at the prefixes not
    ``needed`` (unless ``every``). # [vocab + 1] in place, [vocab + 1] bool x2 (or empty), bool"""
    for k in range(mass.size):
        if integral[k]:
            if mass[k] < 0.0:
                mass[k] = 0.0
            elif mass[k] > 1.0:
                mass[k] = 1.0
        if not every and not needed[k]:
            mass[k] = np.nan


def race_mass_bounds(draft_in_order, num_drafts: int, pair_mass, target_inside=None) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper bounds on Q(H_k), every prefix, from Q_2 (the n = 2 closed form).

    Given the first i draws in H with mass s, the next lands in H with probability
    f(s) = (q(H) − s)/(1 − s) = 1 − r/(1 − s), r = q(H^c): decreasing and concave in s, and
    s_i (the mass of the first i draws) lies in [s_2, T_i] for i ≥ 2 (T_i: the i largest
    masses of H). With m = E[s_2 | first two in H] = E[q(x_1) + q(x_2); both in H]/Q_2 in
    closed form like Q_2's:

    - upper: f(s_i) ≤ f(s_2), so Q ≤ Q_2·E[f(s_2)^{n−2} | both in H]. Where
      (n − 1)·r ≤ 2(1 − T_2), f^{n−2} is concave on [0, T_2] ((f^j)'' = j f^{j−2}(1 − s)^{−4}·r·
      ((j + 1) r − 2(1 − s)) ≤ 0) and Jensen gives Q ≤ Q_2·f(m)^{n−2}; elsewhere f^{n−3} ≤ q(H)
      and Jensen on f give Q ≤ Q_2·f(m)·q(H)^{n−3};
    - lower: f(s_i) ≥ f(T_i) for i ≥ 3, and f(s_2) is above its chord over [0, T_2], so
      Q ≥ Q_2·(q(H) − (q(H) − f(T_2))·m/T_2)·Π_{3≤i<n} f(T_i);

    exact (0 or 1) where H holds fewer than n drawable tokens or all of them. Both are moved
    outwards for rounding: r, m and 1 − T_i by relative 1e-12, 1e-10 and absolute
    ``BOUND_SLACK``, the bounds by ``BOUND_SLACK``. One pass over each row
    (``_mass_bounds_row``).

    With ``target_inside`` (p(H_k), [rows, vocab + 1]) these bounds are computed only at the
    prefixes that coarser ones leave a chance to minimise p(H) − Q(H) (``_coarse_bounds``);
    elsewhere the coarser ones are returned, and the prefix scan (``subset.can_minimise``)
    keeps the same prefixes either way.
    # draft_in_order [rows, vocab], pair_mass [rows, vocab + 1] (target_inside alike) -> [rows, vocab + 1] x2
    """
    draft_in_order = np.ascontiguousarray(draft_in_order, dtype=np.float64)
    pair_mass = np.ascontiguousarray(pair_mass, dtype=np.float64)
    lower, upper = np.empty(pair_mass.shape), np.empty(pair_mass.shape)
    for row in range(draft_in_order.shape[0]):
        inside = np.zeros(0) if target_inside is None else np.ascontiguousarray(target_inside[row], dtype=np.float64)
        _mass_bounds_row(draft_in_order[row], int(num_drafts), pair_mass[row], inside, lower[row], upper[row])
    return lower, upper


@compiled(error_model="numpy")
def _mass_bounds_row(draft, n, pair_mass, target_inside, lower, upper):
    """``race_mass_bounds`` of one row, n ≥ 3, written into ``lower`` and ``upper``; with
    ``target_inside`` (p(H_k), else empty) only at the prefixes ``_coarse_bounds`` leaves,
    its coarse bounds elsewhere.

    Walks the prefixes H_k in order, keeping their running sums — q(H), Σ q², Σ q^j/(1 − q)
    for j = 1, 2, 3, the drawable tokens — and the n − 1 largest masses of H (T_i sums the
    first i), with what depends on them alone (the rooms 1 − T_i and their inverses, ``_tops``)
    recomputed only when they change and a bound needs them; r = q(H^c) is summed from the
    tail. 1 − q(x) is the mass of the other tokens, the largest token's summed explicitly
    (``probability.largest_and_the_rest``). A token with
    1 − q(x) = 0 makes the moments infinite or NaN from its prefix on, and both bounds there
    [0, 1] (the race decides).
    # [vocab], int, [vocab + 1], [vocab + 1] or [0] -> writes [vocab + 1] x2"""
    size = draft.size
    total, largest_token, others_of_largest = largest_and_the_rest(draft)
    rest = np.empty(size + 1)  # r_k = q(H_k^c), from the tail: exactly 0 for the whole vocabulary
    rest[size] = 0.0
    for k in range(size - 1, -1, -1):
        rest[k] = rest[k + 1] + draft[k]
    if target_inside.size == size + 1:
        evaluated = _coarse_bounds(draft, n, pair_mass, rest, target_inside, lower, upper)
    else:
        evaluated = np.ones(size + 1, dtype=np.bool_)
    top = np.zeros(n - 1)  # the n − 1 largest masses of H, descending, 0 where H has fewer
    rooms, inverses = np.zeros(n), np.zeros(n)  # 1 − T_i − slack (i ≥ 3), 1 − (T_2 + slack); inverses (_tops)
    two_largest = 0.0  # T_2 + slack
    inside = squares = weighted_1 = weighted_2 = weighted_3 = 0.0
    drawable = 0
    top_moved = True
    for k in range(size + 1):
        if evaluated[k]:
            if top_moved:  # what depends on the largest masses only: the rooms' divisions leave the loop
                two_largest = _tops(top, rooms, inverses)
                top_moved = False
            high_rest, low_rest = rest[k] * (1.0 + 1e-12), rest[k] * (1.0 - 1e-12)
            terms_0, terms_1, terms_2 = inside * weighted_2, 2.0 * weighted_3, squares * weighted_1
            drawn = terms_0 - terms_1 + terms_2  # E[(q(x1) + q(x2)); x1, x2 ∈ H]
            spread = terms_0 + terms_1 + terms_2
            mass = pair_mass[k]
            mean_low = mean_high = 0.0
            if mass > 0:
                per_mass = 1.0 / mass
                mean_low, mean_high = _at_least_zero(drawn - 1e-10 * spread) * per_mass, _at_least_zero(
                    drawn + 1e-10 * spread) * per_mass
            later = 1.0  # Π_{3≤i<n} f(T_i)
            for i in range(3, n):
                later *= _next_in(high_rest, rooms[i], inverses[i])
            room_at_mean = 1.0 - mean_low
            next_at_mean = _next_in(low_rest, room_at_mean, 1.0 / room_at_mean)
            concave = (n - 1) * high_rest <= 2.0 * (1.0 - two_largest)
            upper_k = mass * next_at_mean * (next_at_mean if concave else 1.0 - low_rest) ** (n - 3) + BOUND_SLACK
            at_zero, at_two = _next_in(high_rest, 1.0, 1.0), _next_in(high_rest, rooms[2], inverses[2])  # f(0), f(T_2)
            share = mean_high * inverses[0] if two_largest > 0 else 1.0
            share = min(max(share, 0.0), 1.0) if share == share else share
            lower_k = mass * (at_zero - (at_zero - at_two) * share) * later - BOUND_SLACK
            if not (np.isfinite(lower_k) and np.isfinite(mean_high)):
                lower_k = 0.0
            if not (np.isfinite(upper_k) and np.isfinite(mean_low)):
                upper_k = 1.0
            if drawable < n or rest[k] <= 0:
                lower[k] = upper[k] = 1.0 if drawable >= n else 0.0
            else:
                lower[k], upper[k] = min(max(lower_k, 0.0), 1.0), min(max(upper_k, 0.0), 1.0)
        if k == size:
            break
        value = draft[k]  # H_{k+1} = H_k + token k
        per_spread = 1.0 / (others_of_largest if k == largest_token else total - value)  # 1 / (1 − q(x))
        inside += value
        squares += value * value
        weighted_1 += value * per_spread
        weighted_2 += value * value * per_spread
        weighted_3 += value * value * value * per_spread
        drawable += value > 0
        if value > top[n - 2]:
            _insert_descending(top, value)
            top_moved = True


@compiled(error_model="numpy")
def _coarse_bounds(draft, n, pair_mass, rest, target_inside, lower, upper):
    """Coarser bounds than ``race_mass_bounds``', at every prefix, written into ``lower``
    and ``upper``, and the prefixes where the finer ones are needed (returned): those that
    can minimise p(H) − Q(H) by the coarse bounds.

    Coarse: Q ≥ Q_2·Π_{2≤i<n} f(T_i) (the fine lower bound's chord at least f(T_2)) and
    Q ≤ Q_2·q(H)^{n−2} (each later draw lands in H with probability at most q(H)), from the
    same rounded r, rooms and inverses as the fine bounds, moved out by 2·``BOUND_SLACK``:
    coarse lower ≤ fine lower and coarse upper ≥ fine upper as computed (products of factors
    ≤ 1 that differ by a few ulps), and exact where those are.
    So the smallest p − lower over the mixed bounds is the fine one (a minimiser of p − fine
    lower has p − coarse upper below the smallest p − coarse lower, so its prefix is
    evaluated), and a prefix left out has p − coarse upper above the coarse ceiling + 2·margin,
    so p − fine upper is above the fine one + margin: the scan keeps the same prefixes.
    Where the fine bounds give up (a non-finite moment or mass: [0, 1]) the coarse ones are
    still bounds, so the scan may keep fewer prefixes there, but never drops one that can
    minimise.
    # [vocab], int, [vocab + 1] x3, writes [vocab + 1] x2 -> [vocab + 1] bool"""
    size = draft.size
    top = np.zeros(n - 1)
    rooms, inverses = np.zeros(n), np.zeros(n)
    drawable = 0
    top_moved = True
    ceiling, unknown = np.inf, False
    for k in range(size + 1):
        if drawable < n or rest[k] <= 0:
            lower[k] = upper[k] = 1.0 if drawable >= n else 0.0
        else:
            if top_moved:
                _tops(top, rooms, inverses)
                top_moved = False
            high_rest, low_rest = rest[k] * (1.0 + 1e-12), rest[k] * (1.0 - 1e-12)
            mass = pair_mass[k]
            lower_k = mass * _next_in(high_rest, rooms[2], inverses[2])
            for i in range(3, n):
                lower_k *= _next_in(high_rest, rooms[i], inverses[i])
            lower_k -= 2.0 * BOUND_SLACK
            inside_share = min(max(1.0 - low_rest, 0.0), 1.0)
            upper_k = mass * inside_share
            for _ in range(n - 3):
                upper_k *= inside_share
            upper_k += 2.0 * BOUND_SLACK
            lower[k] = min(max(lower_k, 0.0), 1.0) if np.isfinite(lower_k) else 0.0
            upper[k] = min(max(upper_k, 0.0), 1.0) if np.isfinite(upper_k) else 1.0
        gap = target_inside[k] - lower[k]
        if gap < ceiling:
            ceiling = gap
        unknown |= gap != gap  # a NaN p(H): every prefix is evaluated
        if k < size:
            value = draft[k]
            drawable += value > 0
            if value > top[n - 2]:
                _insert_descending(top, value)
                top_moved = True
    evaluated = np.empty(size + 1, dtype=np.bool_)
    for k in range(size + 1):
        evaluated[k] = unknown or not target_inside[k] - upper[k] > ceiling + 2.0 * PRUNING_MARGIN
    return evaluated


@compiled
def _insert_descending(top, value):
    """Insert ``value`` into ``top`` (descending), dropping its smallest entry."""
    slot = top.size - 1
    while slot > 0 and top[slot - 1] < value:
        top[slot] = top[slot - 1]
        slot -= 1
    top[slot] = value


@compiled
def _tops(top, rooms, inverses):
    """From the n − 1 largest masses ``top`` (descending): T_2 + slack, returned, with its
    inverse in ``inverses[0]``; the room 1 − (T_2 + slack) in ``rooms[2]`` and
    1 − T_i − slack for 3 ≤ i < n in ``rooms[i]``, each with its inverse beside it (0 where
    the room is not positive). Rooms are differences from 1 of at most 1 + slack, so a
    positive one is at least ~1e-28 and its inverse finite.
    # [n − 1], writes [n] x2 -> float"""
    largest, two_largest = 0.0, 0.0
    for i in range(1, top.size + 1):
        largest += top[i - 1]
        if i == 2:
            two_largest = largest + BOUND_SLACK
            rooms[2] = 1.0 - two_largest
        elif i >= 3:
            rooms[i] = 1.0 - largest - BOUND_SLACK
    inverses[0] = 1.0 / two_largest if two_largest > 0 else 0.0
    for i in range(2, rooms.size):
        inverses[i] = 1.0 / rooms[i] if rooms[i] > 0 else 0.0
    return two_largest


@compiled
def _at_least_zero(value):
    """max(value, 0), NaN kept (as np.maximum)."""
    return 0.0 if value < 0 else value


@compiled(error_model="numpy")
def _next_in(rest, room, inverse):
    """f = 1 − r/(1 − s) in [0, 1], given r, room = 1 − s and its inverse (0 where room ≤ 0;
    a room that many prefixes share is inverted once)."""
    if not room > 0:
        return 0.0
    return min(max(1.0 - rest * inverse, 0.0), 1.0)


def _windows(prefixes: np.ndarray, remaining: np.ndarray) -> list[tuple[int, int]]:
    """(first, last) prefix ranges covering ``prefixes`` (sorted): a new window starts after
    a gap of more than ``RACE_GAP`` tokens and where r leaves a band [RACE_SPAN^−(j+1), RACE_SPAN^−j)."""
    if prefixes.size == 0:
        return []
    band = np.floor(-np.log(remaining[prefixes]) / np.log(RACE_SPAN))
    starts = np.flatnonzero(np.concatenate([[True], (np.diff(prefixes) > RACE_GAP) | (np.diff(band) != 0)]))
    ends = np.concatenate([starts[1:], [prefixes.size]]) - 1
    return list(zip(prefixes[starts].tolist(), prefixes[ends].tolist()))


def _race_times(n, num_nodes) -> np.ndarray:
    """The quadrature's first nodes at n: t_i = start·2^(i/``RACE_NODES_PER_OCTAVE``), i < num_nodes,
    start such that ∫_0^start ≤ truncation.  # -> [num_nodes]"""
    start = (factorial(n + 1) * RACE_TRUNCATION) ** (1.0 / (n + 1))
    return start * 2.0 ** (np.arange(num_nodes) / RACE_NODES_PER_OCTAVE)


def _window_nodes(draft, remaining, windows, n) -> list[int]:
    """How many nodes each window needs: whole octaves up to its horizon (``_race_horizon``),
    from the n-th largest mass before it (``_nth_largest_before``). # -> [windows]"""
    start = _race_times(n, 1)[0]
    last_offset = (RACE_NODES_PER_OCTAVE - 1) / RACE_NODES_PER_OCTAVE  # in octaves
    firsts = np.array([first for first, _ in windows], dtype=np.int64)
    nodes = []
    for (_, last), nth_largest in zip(windows, _nth_largest_before(draft, firsts, n)):
        horizon = _race_horizon(float(nth_largest), float(remaining[last]), n)  # overflows to ∞: refused below
        if not np.isfinite(horizon) or horizon > 1e300:
            raise ValueError("draft_probs: the n-th largest draft masses are too small (subnormal) for the "
                             "exponential-race quadrature")
        num_octaves = max(1, int(np.ceil(np.log2(horizon / start) - last_offset)) + 1)
        nodes.append(num_octaves * RACE_NODES_PER_OCTAVE)
    return nodes


@compiled
def _nth_largest_before(values, ends, n):
    """The n-th largest of values[:end] for each of the increasing ``ends`` (0 where fewer than
    n values), in one pass keeping the n largest by insertion.  # [V], [windows] -> [windows]"""
    largest = np.zeros(n)  # descending
    nth, position = np.empty(ends.size), 0
    for window in range(ends.size):
        while position < ends[window]:
            if values[position] > largest[n - 1]:
                _insert_descending(largest, values[position])
            position += 1
        nth[window] = largest[n - 1]
    return nth


class _HeadLaw:
    """P(c tokens of the head arrived by t), c < n, at the nodes t_i of one grid, for a head
    that grows token by token (each token enters once, whatever the number of windows).

    Math. With a = e^{tq} − 1, a head token adds a factor (1 + a z) to Π(1 + a z)·e^{−t q(head)},
    the head's law as a polynomial in z mod z^n. At node i a token is
    - tiny where t_i q ≤ ``RACE_TINY``, small where a ≤ 1 (t_i q ≤ ln 2 up to rounding),
      large beyond; each token is tiny at the nodes i < tiny_end(q), small up to large_start(q),
      large from there (the grid is increasing);
    - tiny and small tokens enter through power sums, exactly and stably (a ≤ 1):
      Π(1 + a z)^m = exp(Σ_j (−1)^{j+1} P_j z^j / j) mod z^n, P_j = Σ m a^j, with the exponent's
      z^0 term −t·Σ m q over the tokens not large at the node (the sums ``small_mass`` kept by
      large_start, summed from the largest node down: positive terms);
    - at the few nodes where a token is small, not tiny (≤ 5: ln 2/0.25 < 2^(5/3)), it adds
      m a^j to P_j itself (``power_sums``);
    - a tiny token adds through the series a^j = Σ_k c_jk (tq)^k (``_power_series``): the
      head's scaled moments T_k(i) = Σ m (t_i q)^k over the tokens tiny at node i are kept as
      ``moments`` B_k(b) = Σ m (t_b q)^k over the tokens whose last tiny node is b, and
      T_k(i) = Σ_{b≥i} (t_i/t_b)^k B_k(b), the recurrence T(i) = (t_i/t_{i+1})^k T(i+1) + B(i)
      by doubling: every term is at most m·``RACE_TINY``^k and positive, so nothing
      overflows or cancels at any t. A token tiny at every node of the grid (most of a real
      row) costs only its powers at the last node: the grid ends at the last node any
      window needs (``_window_nodes``);
    - large tokens are the head's largest values: the ``n + RACE_LARGE_COUNT`` largest are
      kept (``top_values``, descending, with counts and large_start) and enter as binomial
      laws Bin(m, 1 − e^{−tq}) truncated at n (``_times_large_tokens``). A node where
      n + ``RACE_LARGE_COUNT`` of them are large (each arrived with probability > ½) gets the
      law 0: P(< n arrived) ≤
      P(Bin(n + 80, ½) < n) < 1e-18 there, and for every prefix holding the head.
    """

    def __init__(self, times, n):
        self.times, self.n = times, n  # [nodes], increasing
        self.series = _power_series(n)  # [n, K + 1]
        self.moments = np.zeros((self.series.shape[1], times.size))  # B_k(b)
        self.power_sums = np.zeros((n, times.size))  # Σ m a^j over the small, not tiny tokens, j ≥ 1
        self.small_mass = np.zeros(times.size + 1)  # Σ m q over the tokens with large_start b
        self.top_values, self.top_counts = np.zeros(0), np.zeros(0)
        self.top_large_start = np.zeros(0, dtype=np.int64)  # the first node each is large at
        self.reach = None  # [K + 1, nodes − 1], ``_scaled_moments``' first step

    def add(self, values, counts=None) -> None:
        """Add tokens of draft values ``values`` > 0, ``counts`` of each (1 by default).  # [tokens] x2"""
        values = np.asarray(values, dtype=np.float64)
        counts = np.ones(values.size) if counts is None else np.asarray(counts, dtype=np.float64)
        if values.size == 0:
            return
        self._keep_largest(values, counts)
        sums = np.zeros(self.series.shape[1])
        deep_mass, shallow = _tiny_at_every_node(values, counts, self.times[-1], sums)
        self.moments[:, -1] += sums
        self.small_mass[-1] += deep_mass
        values, counts = values[shallow], counts[shallow]
        small_nodes, small_tokens, exponents, offset_ends = _shallow_tokens(values, counts, self.times, self.moments,
                                                                            self.small_mass)
        _add_power_sums(self.power_sums, small_nodes, counts[small_tokens], np.expm1(exponents), offset_ends)  # a ≤ 1

    def _keep_largest(self, values, counts) -> None:
        """The largest values, descending, until they hold n + ``RACE_LARGE_COUNT`` tokens, and
        the first node each is large at."""
        self.top_values, self.top_counts = _merged_largest(self.top_values, self.top_counts, values, counts,
                                                           self.n + RACE_LARGE_COUNT)
        with np.errstate(over="ignore"):  # ln 2 / a subnormal q is ∞: large at no node
            self.top_large_start = np.searchsorted(self.times, log(2.0) / self.top_values, side="right")

    def law(self, num_nodes) -> np.ndarray:
        """The law at the first ``num_nodes`` nodes.  # -> [nodes, n]"""
        n, times = self.n, self.times[:num_nodes]
        scaled = self._scaled_moments(num_nodes)  # [K + 1, nodes]
        log_series = np.zeros((num_nodes, n))
        log_series[:, 0] = -times * np.cumsum(self.small_mass[::-1])[::-1][1 : num_nodes + 1]
        for j in range(1, n):
            log_series[:, j] = (-1) ** (j + 1) * (self.power_sums[j, :num_nodes] + self.series[j] @ scaled) / j
        law = np.zeros((num_nodes, n))  # exp of the series: c law_c = Σ_{i=1..c} i log_i law_{c−i}
        law[:, 0] = np.exp(log_series[:, 0])
        for c in range(1, n):
            law[:, c] = sum(i * log_series[:, i] * law[:, c - i] for i in range(1, c + 1)) / c
        if self.top_large_start.size and self.top_large_start.min() < num_nodes:
            _times_large_tokens(law, self.top_values, self.top_counts, self.top_large_start, times,
                                n + RACE_LARGE_COUNT)
        return law

    def _scaled_moments(self, num_nodes) -> np.ndarray:
        """T_k(i) = Σ_{b≥i} (t_i/t_b)^k B_k(b) at the first ``num_nodes`` nodes, by doubling:
        after the step of span s, T(i) holds the bins i..i + 2s − 1 and ``reach`` (t_i/t_{i+2s})^k.
        # -> [K + 1, nodes]"""
        if self.reach is None:  # (t_i/t_{i+1})^k, numpy's power, once per grid
            powers = np.arange(self.series.shape[1])[:, None]
            self.reach = (self.times[:-1] / self.times[1:])[None, :] ** powers
        scaled = self.moments.copy()
        _doubled_sums(scaled, self.reach)
        return scaled[:, :num_nodes]


@compiled(error_model="numpy")
def _tiny_at_every_node(values, counts, last_time, sums):
    """The tokens tiny at every node of a grid ending at ``last_time`` (t q ≤ ``RACE_TINY`` there:
    the bulk of a real row) enter through their powers at the last node: adds Σ m (t q)^k to
    ``sums`` [K + 1]; returns their mass Σ m q and the indices of the other tokens. A
    subnormal q makes ``RACE_TINY``/q infinite: tiny everywhere.
    # [tokens] x2, float, [K + 1] in place -> float, [others]"""
    others = np.empty(values.size, dtype=np.int64)
    mass, count = 0.0, 0
    for index in range(values.size):
        value = values[index]
        if RACE_TINY / value >= last_time:
            scaled, power = last_time * value, counts[index]
            for k in range(sums.size):
                sums[k] += power
                power *= scaled
            mass += counts[index] * value
        else:
            others[count] = index
            count += 1
    return mass, others[:count]


@compiled
def _doubled_sums(scaled, reach):
    """``_HeadLaw._scaled_moments``' doubling, in place on ``scaled`` (B_k(b) in, T_k(i) out):
    at span s = 1, 2, 4, ..., T(i) += reach(i)·T(i + s), then reach(i) ← reach(i)·reach(i + s),
    each step from the values of the step before (i ascending reads i + s before it changes),
    as numpy's slice expressions compute them. # [K + 1, nodes] in place, [K + 1, nodes − 1]"""
    rows, size = scaled.shape
    reach = reach.copy()
    span = 1
    while span < size:
        for k in range(rows):
            for node in range(size - span):
                scaled[k, node] += reach[k, node] * scaled[k, node + span]
        for k in range(rows):
            for node in range(max(0, size - 2 * span)):
                reach[k, node] = reach[k, node] * reach[k, node + span]
        span *= 2


@compiled
def _shallow_tokens(values, counts, times, moments, small_mass):
    """``_HeadLaw.add`` for the tokens not tiny at every node: adds their mass Σ m q to
    ``small_mass`` by the node each is large from (large_start), and their scaled moments
    m (t_b q)^k to ``moments`` at their last tiny node b; returns the (node, token) pairs
    where a token is small, not tiny, by node offset from where it stops being tiny, then
    token, with t·q there (a = e^{tq} − 1 is numpy's expm1, taken by the caller) and where
    each offset's pairs end. Each sum is taken per node in token order and then added to
    the kept one, as ``np.bincount`` sums and ``+=`` adds.
    # [tokens] x2, [nodes], [K + 1, nodes] and [nodes + 1] in place -> [pairs] int x2, [pairs], [offsets] int"""
    nodes, size = times.size, values.size
    tiny_end = np.searchsorted(times, RACE_TINY / values, side="right")
    large_start = np.searchsorted(times, log(2.0) / values, side="right")
    binned = np.zeros(nodes + 1)
    for token in range(size):
        binned[large_start[token]] += counts[token] * values[token]
    small_mass += binned
    powers, scaled = np.empty(size), np.empty(size)
    for token in range(size):  # t_b q ≤ RACE_TINY at the last tiny node b
        if tiny_end[token] > 0:
            powers[token], scaled[token] = counts[token], times[tiny_end[token] - 1] * values[token]
    for k in range(moments.shape[0]):
        binned[:] = 0.0
        for token in range(size):
            if tiny_end[token] > 0:
                binned[tiny_end[token] - 1] += powers[token]
                powers[token] *= scaled[token]
        moments[k] += binned[:nodes]
    pairs = offsets = 0
    for token in range(size):
        pairs += large_start[token] - tiny_end[token]  # ln 2 > RACE_TINY: never negative
        offsets = max(offsets, large_start[token] - tiny_end[token])
    small_nodes, small_tokens, exponents = np.empty(pairs, np.int64), np.empty(pairs, np.int64), np.empty(pairs)
    offset_ends = np.empty(offsets, np.int64)
    place = 0
    for offset in range(offsets):
        for token in range(size):
            node = tiny_end[token] + offset
            if node < large_start[token]:
                small_nodes[place], small_tokens[place] = node, token
                exponents[place] = times[node] * values[token]
                place += 1
        offset_ends[offset] = place
    return small_nodes, small_tokens, exponents, offset_ends


@compiled
def _add_power_sums(power_sums, small_nodes, counts, arrivals, offset_ends):
    """Adds m a^j, j = 1..n − 1, of the (node, token) pairs of ``_shallow_tokens`` to
    ``power_sums`` [n, nodes] at their nodes, offset by offset: an offset's pairs summed
    per node in token order, then added (``np.bincount`` and ``+=``).
    # [n, nodes] in place, [pairs] int, [pairs] x2, [offsets] int"""
    n, nodes = power_sums.shape
    binned = np.empty(nodes)
    start = 0
    for stop in offset_ends:
        powers = counts[start:stop].copy()
        for j in range(1, n):
            binned[:] = 0.0
            for pair in range(start, stop):
                powers[pair - start] *= arrivals[pair]
                binned[small_nodes[pair]] += powers[pair - start]
            power_sums[j] += binned
        start = stop


@compiled
def _merged_largest(top_values, top_counts, values, counts, keep):
    """The entries (value, count) of ``top_values`` (descending) and ``values`` with the largest
    values, descending (the kept ones first among ties), up to the first whose counts sum to
    ``keep`` or more. Each entry holds at least one token, so the ``keep`` largest new entries
    suffice: they are selected by insertion in one pass.
    # [top] x2, [tokens] x2, int -> [kept] x2"""
    best_values, best_counts = np.empty(keep), np.empty(keep)
    size = 0
    for index in range(values.size):
        value = values[index]
        if size == keep and not value > best_values[keep - 1]:
            continue
        slot = size if size < keep else keep - 1
        while slot > 0 and best_values[slot - 1] < value:
            best_values[slot], best_counts[slot] = best_values[slot - 1], best_counts[slot - 1]
            slot -= 1
        best_values[slot], best_counts[slot] = value, counts[index]
        size = min(size + 1, keep)
    merged_values, merged_counts = np.empty(top_values.size + size), np.empty(top_values.size + size)
    old = new = merged = 0
    total = 0.0
    while total < keep and (old < top_values.size or new < size):
        if new >= size or (old < top_values.size and top_values[old] >= best_values[new]):
            merged_values[merged], merged_counts[merged] = top_values[old], top_counts[old]
            old += 1
        else:
            merged_values[merged], merged_counts[merged] = best_values[new], best_counts[new]
            new += 1
        total += merged_counts[merged]
        merged += 1
    return merged_values[:merged], merged_counts[:merged]


def _window_mass(draft, remaining, first, last, n, head, num_nodes) -> np.ndarray:
    """Q on the prefixes first..last (module function's docstring), ``head`` the law of the
    tokens before ``first``, at its first ``num_nodes`` nodes. # -> [last − first + 1]"""
    rates = remaining[first : last + 1]
    times = head.times[:num_nodes]
    step = log(2.0) / RACE_NODES_PER_OCTAVE
    control = gammaincc(n, times)  # W(t) = P(Erlang(n, 1) > t)
    control_weights = np.where(control > RACE_TRUNCATION * 1e-3, step * times * control, 0.0)
    weights = step * times * np.exp(-rates[0] * times)
    coef = np.cumsum(head.law(num_nodes), axis=1)[:, ::-1]  # Σ_{i<n−c} head_i
    controls, counts = _window_sums(np.ascontiguousarray(draft[first:last]), np.ascontiguousarray(rates), times,
                                    weights[:, None] * coef, control_weights)
    return (1.0 + rates) ** (-n) + rates * (controls - counts)


@compiled
def _window_sums(tokens, rates, times, count_weights, control_weights):
    """The quadrature's two sums at every prefix k of a window (prefix k holds its first k
    tokens): Σ_i h t_i W(t_i) e^{−r_k t_i} and Σ_i h t_i e^{−r_k t_i} G_k(t_i), given per node
    ``control_weights`` h t W(t) (0 where W is negligible) and ``count_weights`` h t e^{−r_0 t}
    times Σ_{j<n−c} head_j for c < n.

    e^{−r_k t} G_k(t) = e^{−r_0 t} Σ_c (Σ_{j<n−c} head_j) e_c(a over the window's first k tokens),
    a = e^{tq} − 1 (the window's e^{−t q} cancels against e^{−r_k t}/e^{−r_0 t}); each token adds
    a·e_{c−1} to e_c, so one pass over the tokens, with e_0..e_{n−2} at every node, gives
    every prefix. Nodes go in octaves: a node's a and e^{−r t} come from the node an octave
    before by doubling (e^{2tq} − 1 = a(a + 2), e^{−2rt} = (e^{−rt})²), the first octave's
    from exponentials. The tokens go in blocks: the loops run along the nodes (or the tokens
    of a block) where the steps are independent, so they compile to vector instructions;
    every sum over nodes still adds them in node order.
    # [tokens], [tokens + 1], [nodes], [nodes, n], [nodes] -> [tokens + 1] x2"""
    num_nodes, n = count_weights.shape
    size, width = tokens.size, RACE_NODES_PER_OCTAVE
    controls, differences = np.zeros(size + 1), np.zeros(size + 1)
    decay = np.empty(size + 1)
    for residue in range(min(width, num_nodes)):  # e^{−r t} along one chain of doublings
        for node in range(residue, num_nodes, width):
            for k in range(size + 1):
                decay[k] = np.exp(-times[node] * rates[k]) if node < width else decay[k] * decay[k]
            if control_weights[node] != 0.0:
                for k in range(size + 1):
                    controls[k] += control_weights[node] * decay[k]
    for node in range(num_nodes):
        differences[0] += count_weights[node, 0]
    weights = np.ascontiguousarray(count_weights.T)  # [n, nodes]
    levels = np.zeros((n, num_nodes))  # e_c at every node, of the tokens passed
    levels[0] = 1.0
    block = WINDOW_BLOCK
    arrival = np.empty((num_nodes, block))  # a per node, token of the block
    by_token = np.empty((block, num_nodes))
    terms = np.empty((block, num_nodes))
    term = np.empty(num_nodes)
    for start in range(0, size, block):
        count = min(block, size - start)
        for node in range(num_nodes):
            if node < width:
                for j in range(count):
                    arrival[node, j] = np.expm1(times[node] * tokens[start + j])
            else:
                for j in range(count):
                    arrival[node, j] = arrival[node - width, j] * (arrival[node - width, j] + 2.0)
        for node in range(num_nodes):
            for j in range(count):
                by_token[j, node] = arrival[node, j]
        for j in range(count):
            term[:] = 0.0
            for c in range(1, n):
                for node in range(num_nodes):
                    term[node] += weights[c, node] * levels[c - 1, node]
            for node in range(num_nodes):
                terms[j, node] = by_token[j, node] * term[node]
            for c in range(n - 2, 0, -1):
                for node in range(num_nodes):
                    levels[c, node] += by_token[j, node] * levels[c - 1, node]
        for node in range(num_nodes):
            for j in range(count):
                differences[start + j + 1] += terms[j, node]
    return controls, np.cumsum(differences)


def _race_horizon(nth_largest, last_rate, n) -> float:
    """Largest node t a window needs: beyond it every prefix's integrand is below truncation.

    G_H(t) ≤ n e^{−q_(n)(H) t} (q_(n)(H) = n-th largest q in H) and the weight decays as
    e^{−r t}; over the window r ≥ r_last and q_(n)(H) ≥ q_(n)(H_first) (``nth_largest``), so
    t = ln(n/truncation) / max(r_last, q_(n)(H_first)) suffices. Also covers W(t) < truncation.
    """
    return max(log(n / RACE_TRUNCATION) / max(last_rate, nth_largest), float(gammainccinv(n, RACE_TRUNCATION)))


@cache
def _power_series(n) -> np.ndarray:
    """c_jk with (e^u − 1)^j = Σ_k c_jk u^k for j = 1..n−1, k = 0..K, K such that for
    u ≤ ``RACE_TINY`` the terms beyond K sum to less than 1e-17 of the whole: the
    coefficients of ((e^u − 1)/u)^j are at most j^i/i!, so the rest after u^j·u^L is at
    most (j·u)^(L+1)/(L+1)!·e^(j·u) of u^j. Computed once per n and shared, read-only.
    # -> [n, K + 1], row 0 unused"""
    scale = max(1, n - 1) * RACE_TINY
    length = 1
    while scale ** (length + 1) / factorial(length + 1) * np.exp(scale) > 1e-17:
        length += 1
    size = n - 1 + length + 1
    base = np.array([0.0] + [1.0 / factorial(k) for k in range(1, size)])  # e^u − 1
    series = np.zeros((n, size))
    power = np.eye(1, size)[0]
    for j in range(1, n):
        power = np.convolve(power, base)[:size]
        series[j] = power
    series.flags.writeable = False
    return series


@compiled
def _times_large_tokens(law, values, counts, large_start, times, limit):
    """Multiply the law at each node by the arrival laws of the head's large tokens there (those
    with ``large_start`` ≤ the node): a token of draft value q has arrived by t with
    probability π = 1 − e^{−tq}, so each of its ``counts`` copies multiplies the polynomial by
    (e^{−tq} + π z), mod z^n — products of positive terms. A node where ``limit`` or more
    tokens are large gets the law 0 (``_HeadLaw``'s docstring), which also bounds the copies
    multiplied elsewhere below ``limit``.
    # law [nodes, n] in place, [top] x3, [nodes], int"""
    num_nodes, n = law.shape
    for node in range(num_nodes):
        large = 0.0
        for index in range(values.size):
            if large_start[index] <= node:
                large += counts[index]
        if large >= limit:
            law[node, :] = 0.0
            continue
        for index in range(values.size):
            if large_start[index] > node:
                continue
            stay = np.exp(-times[node] * values[index])
            arrived = -np.expm1(-times[node] * values[index])
            for _ in range(int(counts[index])):
                for c in range(n - 1, 0, -1):
                    law[node, c] = law[node, c] * stay + law[node, c - 1] * arrived
                law[node, 0] *= stay