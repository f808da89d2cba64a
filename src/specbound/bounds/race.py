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

from math import factorial, log

import numpy as np
from scipy.special import gammaincc, gammainccinv, gammaln

from specbound.bounds.subset import prefix_sums
from specbound.probability import mass_of_the_others

RACE_TRUNCATION = 1e-13  # each neglected piece of the integral is below this
RACE_NODES_PER_OCTAVE = 3  # trapezoid step ln(2)/3 in ln t; a node's successor is at 2t
RACE_SPAN = 16.0  # a window's prefixes have r_first / r_last ≤ 16, so e^{t q(window)} < e^{520}
RACE_GAP = 512  # needed prefixes more than this many tokens apart go to separate windows
RACE_LARGE_COUNT = 80  # a head with n + 80 tokens of e^{tq} − 1 > 1: P(< n arrive) < 1e-18
RACE_ACCURACY = 1e-11  # |error of Q(H)| observed below 1e-12; tests hold it to this bound
BOUND_SLACK = 1e-12  # race_mass_bounds' allowance for rounding
RACE_TINY = 0.25  # a head token with t·q below this enters a node's law through the head's moments
BLOCK_ELEMENTS = 2**18  # the [nodes, tokens] arrays of one pass (fresh large arrays are slow here)


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
    draft = np.asarray(draft_row, dtype=np.float64)
    n = num_drafts
    remaining = np.zeros(draft.shape[0] + 1)  # r_k = q(H_k^c), summed from the tail for accuracy
    np.cumsum(draft[::-1], out=remaining[-2::-1])
    support = np.concatenate([[0], np.cumsum(draft > 0)])  # tokens of H_k that can be drawn
    mass = np.where(support >= n, 1.0, 0.0)  # Q when H_k holds the whole draft support, or too little
    integral = (support >= n) & (remaining > 0)
    wanted = integral if needed is None else integral & np.asarray(needed, dtype=bool)
    windows = _windows(np.flatnonzero(wanted), remaining)
    nodes = _window_nodes(draft, remaining, windows, n)
    head, head_end = _HeadLaw(_race_times(n, max(nodes, default=0)), n), 0
    for (first, last), num_nodes in zip(windows, nodes):
        piece = draft[head_end:first]
        head.add(piece[piece > 0])
        head_end = first
        window = slice(first, last + 1)  # every prefix in it needs the integral: support and r are monotone
        mass[window] = np.where(integral[window], _window_mass(draft, remaining, first, last, n, head, num_nodes),
                                mass[window])
    mass = np.where(integral, np.clip(mass, 0.0, 1.0), mass)
    return mass if needed is None else np.where(needed, mass, np.nan)


def race_mass_bounds(draft_in_order, num_drafts: int, pair_mass) -> tuple[np.ndarray, np.ndarray]:
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
    ``BOUND_SLACK``, the bounds by ``BOUND_SLACK``.
    # draft_in_order [rows, vocab], pair_mass [rows, vocab + 1] -> [rows, vocab + 1] x2
    """
    inside, spread = prefix_sums(draft_in_order), mass_of_the_others(draft_in_order)  # q(H), 1 − q(x)
    rest = np.zeros(inside.shape)  # r = q(H^c), summed from the tail: exact 0 for the whole vocabulary
    np.cumsum(draft_in_order[:, ::-1], axis=1, out=rest[:, -2::-1])
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):  # 1 − q(x) = 0: not finite, both bounds [0, 1] below
        weighted = [prefix_sums(draft_in_order**power / spread) for power in (1, 2, 3)]  # Σ_H q^j/(1 − q)
        squares = prefix_sums(draft_in_order**2)
        # E[(q(x1) + q(x2)); x1, x2 ∈ H] = Σ_x q_x/(1 − q_x)·[q_x (q(H) − q_x) + Σ_{y∈H} q_y² − q_x²]
        terms = (inside * weighted[1], 2.0 * weighted[2], squares * weighted[0])
        drawn = terms[0] - terms[1] + terms[2]
    with np.errstate(divide="ignore", invalid="ignore"):
        mean_low, mean_high = (np.where(pair_mass > 0, np.maximum(drawn + sign * 1e-10 * sum(terms), 0.0) / pair_mass,
                                        0.0) for sign in (-1.0, 1.0))
    low_rest, high_rest = rest * (1.0 - 1e-12), rest * (1.0 + 1e-12)
    largest = np.zeros(pair_mass.shape)  # T_i, summed level by level
    level = None  # the i-th largest mass of each prefix
    later = np.ones(pair_mass.shape)  # Π_{3≤i<n} f(T_i)
    for i in range(1, num_drafts):
        below = draft_in_order if level is None else np.minimum(draft_in_order, np.concatenate(
            [np.zeros((level.shape[0], 1)), level[:, :-1]], axis=1))
        level = np.maximum.accumulate(below, axis=1)  # running max of what the i − 1 larger leave
        largest[:, 1:] += level
        if i == 2:
            two_largest = largest + BOUND_SLACK
        elif i >= 3:
            later *= _next_in(high_rest, 1.0 - largest - BOUND_SLACK)
    next_at_mean = _next_in(low_rest, 1.0 - mean_low)
    concave = (num_drafts - 1) * high_rest <= 2.0 * (1.0 - two_largest)
    upper = pair_mass * next_at_mean * np.where(concave, next_at_mean, 1.0 - low_rest) ** (num_drafts - 3)
    upper += BOUND_SLACK
    at_zero, at_two = _next_in(high_rest, 1.0), _next_in(high_rest, 1.0 - two_largest)  # f(0), f(T_2)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.clip(np.where(two_largest > 0, mean_high / two_largest, 1.0), 0.0, 1.0)
    lower = pair_mass * (at_zero - (at_zero - at_two) * share) * later - BOUND_SLACK
    # A draft mass so close to 1 that 1 − q(x) rounds to 0 (beside subnormal masses) overflows the
    # closed forms: m is then unknown, and so are both bounds — [0, 1] leaves the prefix to the race
    lower = np.where(np.isfinite(lower) & np.isfinite(mean_high), lower, 0.0)
    upper = np.where(np.isfinite(upper) & np.isfinite(mean_low), upper, 1.0)
    support = prefix_sums((draft_in_order > 0).astype(np.float64))
    exact = np.where(support >= num_drafts, 1.0, 0.0)
    known = (support < num_drafts) | (rest <= 0)
    return np.where(known, exact, np.clip(lower, 0.0, 1.0)), np.where(known, exact, np.clip(upper, 0.0, 1.0))


def _next_in(rest, room):
    """f = 1 − r/(1 − s) in [0, 1], given r and room = 1 − s (0 where room ≤ 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(room > 0, np.clip(1.0 - rest / np.where(room > 0, room, 1.0), 0.0, 1.0), 0.0)


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
    from the n-th largest mass before it (a running partition). # -> [windows]"""
    start = _race_times(n, 1)[0]
    last_offset = (RACE_NODES_PER_OCTAVE - 1) / RACE_NODES_PER_OCTAVE  # in octaves
    nodes, largest, end = [], np.zeros(0), 0
    for first, last in windows:
        largest, end = np.concatenate([largest, draft[end:first]]), first
        if largest.size > n:
            largest = np.partition(largest, largest.size - n)[-n:]
        horizon = _race_horizon(float(largest.min()) if largest.size == n else 0.0, remaining[last], n)
        if not np.isfinite(horizon) or horizon > 1e300:
            raise ValueError("draft_probs: the n-th largest draft masses are too small (subnormal) for the "
                             "exponential-race quadrature")
        num_octaves = max(1, int(np.ceil(np.log2(horizon / start) - last_offset)) + 1)
        nodes.append(num_octaves * RACE_NODES_PER_OCTAVE)
    return nodes


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
      laws Bin(m, 1 − e^{−tq}) truncated at n. A node where n + ``RACE_LARGE_COUNT`` of them are
      large (each arrived with probability > ½) gets the law 0: P(< n arrived) ≤
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

    def add(self, values, counts=None) -> None:
        """Add tokens of draft values ``values`` > 0, ``counts`` of each (1 by default).  # [tokens] x2"""
        values = np.asarray(values, dtype=np.float64)
        counts = np.ones(values.size) if counts is None else np.asarray(counts, dtype=np.float64)
        if values.size == 0:
            return
        self._keep_largest(values, counts)
        nodes = self.times.size
        with np.errstate(over="ignore"):  # RACE_TINY / a subnormal q is ∞: tiny at every node
            deep = RACE_TINY / values >= self.times[-1]  # tiny at every node: the bulk of a real row
        scaled, power = self.times[-1] * values[deep], counts[deep]  # the last node's t q ≤ RACE_TINY
        for k in range(self.series.shape[1]):
            self.moments[k, -1] += power.sum()
            power = power * scaled
        self.small_mass[-1] += counts[deep] @ values[deep]
        values, counts = values[~deep], counts[~deep]
        tiny_end = np.searchsorted(self.times, RACE_TINY / values, side="right")
        large_start = np.searchsorted(self.times, log(2.0) / values, side="right")
        self.small_mass += np.bincount(large_start, weights=counts * values, minlength=nodes + 1)
        tiny = tiny_end > 0
        last_tiny = tiny_end[tiny] - 1
        scaled, power = self.times[last_tiny] * values[tiny], counts[tiny]  # t_b q ≤ RACE_TINY
        for k in range(self.series.shape[1]):
            self.moments[k] += np.bincount(last_tiny, weights=power, minlength=nodes)
            power = power * scaled
        for offset in range(int((large_start - tiny_end).max(initial=0))):  # the small, not tiny nodes
            node = tiny_end + offset
            small = node < large_start
            arrival = np.expm1(self.times[node[small]] * values[small])  # ≤ 1
            power = counts[small].copy()
            for j in range(1, self.n):
                power *= arrival
                self.power_sums[j] += np.bincount(node[small], weights=power, minlength=nodes)

    def _keep_largest(self, values, counts) -> None:
        """The largest values, descending, until they hold n + ``RACE_LARGE_COUNT`` tokens, and
        the first node each is large at."""
        keep = self.n + RACE_LARGE_COUNT
        if values.size > keep:  # each holds ≥ 1 token: the `keep` largest suffice
            chosen = np.argpartition(-values, keep - 1)[:keep]
            values, counts = values[chosen], counts[chosen]
        values = np.concatenate([self.top_values, values])
        order = np.argsort(-values, kind="stable")
        counts = np.concatenate([self.top_counts, counts])[order]
        size = int(np.searchsorted(np.cumsum(counts), keep)) + 1
        self.top_values, self.top_counts = values[order][:size], counts[:size]
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
        large = self.top_large_start[None, :] <= np.arange(num_nodes)[:, None]  # [nodes, top]
        if np.any(large):
            binomial = _binomial_laws(self.top_values, self.top_counts, times, n)  # [nodes, top, n]
            factors = np.where(large[:, :, None], binomial, np.eye(1, n)[None, :, :])
            law = _truncated_product(np.concatenate([law[:, None, :], factors], axis=1))
            law[large @ self.top_counts >= n + RACE_LARGE_COUNT] = 0.0
        return law

    def _scaled_moments(self, num_nodes) -> np.ndarray:
        """T_k(i) = Σ_{b≥i} (t_i/t_b)^k B_k(b) at the first ``num_nodes`` nodes, by doubling:
        after the step of span s, T(i) holds the bins i..i + 2s − 1 and ``reach`` (t_i/t_{i+2s})^k.
        # -> [K + 1, nodes]"""
        size = self.times.size
        scaled = self.moments[:, :size].copy()
        powers = np.arange(self.series.shape[1])[:, None]
        reach = (self.times[: size - 1] / self.times[1:size])[None, :] ** powers  # (t_i/t_{i+1})^k
        span = 1
        while span < size:
            scaled[:, : size - span] += reach[:, : size - span] * scaled[:, span:]
            reached = max(0, size - 2 * span)
            reach = reach[:, :reached] * reach[:, span : span + reached]
            span *= 2
        return scaled[:, :num_nodes]


def _window_mass(draft, remaining, first, last, n, head, num_nodes) -> np.ndarray:
    """Q on the prefixes first..last (module function's docstring), ``head`` the law of the
    tokens before ``first``, at its first ``num_nodes`` nodes. # -> [last − first + 1]"""
    tokens = draft[first:last]  # the window's tokens: prefix first + i holds the first i of them
    rates = remaining[first : last + 1]
    step = log(2.0) / RACE_NODES_PER_OCTAVE
    num_octaves = num_nodes // RACE_NODES_PER_OCTAVE
    times = head.times[:num_nodes]
    control = gammaincc(n, times)  # W(t) = P(Erlang(n, 1) > t)
    coef = np.cumsum(head.law(num_nodes), axis=1)[:, ::-1]  # Σ_{i<n−c} head_i
    weight = step * times * np.exp(-rates[0] * times)  # [nodes]
    control_weights = np.zeros(rates.size)  # Σ_nodes h t W(t) e^{−r_k t}
    count_diffs = np.zeros(rates.size)  # differences in k of Σ_nodes h t e^{−r_k t} G_k(t)
    count_diffs[0] = weight @ coef[:, 0]
    octaves_per_block = max(1, BLOCK_ELEMENTS // (RACE_NODES_PER_OCTAVE * rates.size))
    arrival = decay = None
    for block_start in range(0, num_octaves, octaves_per_block):
        block = range(block_start, min(num_octaves, block_start + octaves_per_block))
        nodes = slice(block.start * RACE_NODES_PER_OCTAVE, block.stop * RACE_NODES_PER_OCTAVE)
        arrival, decay = _doubled(tokens, rates, times[nodes], arrival, decay)
        needs_control = control[nodes] > RACE_TRUNCATION * 1e-3
        if np.any(needs_control):
            control_weights += (step * times[nodes] * control[nodes])[needs_control] @ decay[needs_control]
        # e_c^{(k)} − e_c^{(k−1)} = a_{k−1} e_{c−1}^{(k−1)}: e_0..e_{n−2} at each token's own prefix
        level_term = arrival
        for c in range(1, n):
            count_diffs[1:] += (weight[nodes] * coef[nodes, c]) @ level_term
            if c < n - 1:
                level = np.zeros_like(arrival)
                np.cumsum(level_term[:, :-1], axis=1, out=level[:, 1:])  # e_c
                level_term = arrival * level
    return (1.0 + rates) ** (-n) + rates * (control_weights - np.cumsum(count_diffs))


def _doubled(tokens, rates, times, arrival, decay):
    """a = e^{tq} − 1 per node and token, and e^{−r t} per node and prefix, at ``times``
    (whole octaves): by exponentials for the first octave, else by doubling the octave
    before (``arrival``, ``decay``: the previous block's rows, its last octave used).
    # -> [nodes, tokens], [nodes, prefixes]"""
    width = RACE_NODES_PER_OCTAVE
    new_arrival = np.empty((len(times), tokens.size))
    new_decay = np.empty((len(times), rates.size))
    if arrival is not None:
        arrival, decay = arrival[-width:], decay[-width:]
    for rows in range(0, len(times), width):
        rows = slice(rows, rows + width)
        if arrival is None:
            np.expm1(times[rows, None] * tokens[None, :], out=new_arrival[rows])
            np.exp(-times[rows, None] * rates[None, :], out=new_decay[rows])
        else:
            np.multiply(arrival, arrival + 2.0, out=new_arrival[rows])  # e^{2tq} − 1 from e^{tq} − 1
            np.multiply(decay, decay, out=new_decay[rows])  # e^{−2rt} from e^{−rt}
        arrival, decay = new_arrival[rows], new_decay[rows]
    return new_arrival, new_decay


def _race_horizon(nth_largest, last_rate, n) -> float:
    """Largest node t a window needs: beyond it every prefix's integrand is below truncation.

    G_H(t) ≤ n e^{−q_(n)(H) t} (q_(n)(H) = n-th largest q in H) and the weight decays as
    e^{−r t}; over the window r ≥ r_last and q_(n)(H) ≥ q_(n)(H_first) (``nth_largest``), so
    t = ln(n/truncation) / max(r_last, q_(n)(H_first)) suffices. Also covers W(t) < truncation.
    """
    return max(log(n / RACE_TRUNCATION) / max(last_rate, nth_largest), float(gammainccinv(n, RACE_TRUNCATION)))


def _power_series(n) -> np.ndarray:
    """c_jk with (e^u − 1)^j = Σ_k c_jk u^k for j = 1..n−1, k = 0..K, K such that for
    u ≤ ``RACE_TINY`` the terms beyond K sum to less than 1e-17 of the whole: the
    coefficients of ((e^u − 1)/u)^j are at most j^i/i!, so the rest after u^j·u^L is at
    most (j·u)^(L+1)/(L+1)!·e^(j·u) of u^j.  # -> [n, K + 1], row 0 unused"""
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
    return series


def _binomial_laws(values, counts, times, n) -> np.ndarray:
    """P(c of m tokens of draft value q arrived by t) = Bin(m, 1 − e^{−tq}) at c < n, per node
    and value.  # [values] x2, [nodes] -> [nodes, values, n]"""
    value, count = values[None, :, None], counts[None, :, None]
    arrived = np.arange(n)[None, None, :]
    t = times[:, None, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        log_binomial = (gammaln(count + 1) - gammaln(arrived + 1) - gammaln(count - arrived + 1)
                        + arrived * np.log(-np.expm1(-t * value)) - (count - arrived) * t * value)
    return np.where(arrived <= count, np.exp(log_binomial), 0.0)


def _truncated_product(factors: np.ndarray) -> np.ndarray:
    """Product of polynomials mod z^n by pairwise halving, per node.  # [nodes, m, n] -> [nodes, n]"""
    n = factors.shape[2]
    while factors.shape[1] > 1:
        if factors.shape[1] % 2:
            factors = np.concatenate([factors, np.broadcast_to(np.eye(1, n), (factors.shape[0], 1, n))], axis=1)
        left, right = factors[:, 0::2], factors[:, 1::2]
        factors = np.stack(
            [sum(left[:, :, i] * right[:, :, c - i] for i in range(c + 1)) for c in range(n)], axis=2
        )
    return factors[:, 0]
