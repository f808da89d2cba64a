"""Q(H) for drafts drawn without replacement, n ≥ 3, by the exponential race (SPEC.md §4.2).

Sampling without replacement is an exponential race: token x arrives at E_x ~ Exp(q(x)),
independently, and the drafts are the first n arrivals. Q(H) = P(all n drafts ∈ H) is
then an integral over the arrival time of the first token outside H, whose inner term — a
Poisson-binomial tail over the tokens of H — does not depend on H's complement, so one
incremental pass over growing prefixes H_k evaluates every prefix at fixed quadrature
nodes (``race_all_in_mass``). Letters: q = draft (SPEC.md §0).
"""

from __future__ import annotations

from math import factorial, log

import numpy as np
from scipy.special import gammaincc, gammainccinv

RACE_TRUNCATION = 1e-13  # each neglected piece of the integral is below this
RACE_NODES_PER_OCTAVE = 3  # trapezoid step ln(2)/3 in ln t; a node's successor is at 2t
RACE_WINDOW = 600.0  # at node t only prefixes with t·q(H^c) ≤ 600 are summed: e^600 is finite
RACE_ACCURACY = 1e-11  # |error of Q(H)| observed below 1e-12; tests hold it to this bound


def race_all_in_mass(draft_row, num_drafts: int) -> np.ndarray:
    """Q(H_k) = P(n draws without replacement all land in H_k), every prefix k = 0..V.

    Math (SPEC.md §4.2). Sampling without replacement is an exponential race: token x
    arrives at E_x ~ Exp(q(x)), independently, and the drafts are the first n arrivals.
    With r = q(H^c) and G_H(t) = P(fewer than n tokens of H arrived by t),

        Q(H) = 1 − ∫_0^∞ r e^{−rt} G_H(t) dt
             = (1 + r)^{−n} + ∫_0^∞ r e^{−rt} (W(t) − G_H(t)) dt,

    with the control variate W(t) = P(Erlang(n, 1) > t), whose transform is known;
    W − G vanishes like t^n at 0, so the integrand decays at both ends of ln t.
    G_H(t) = e^{−t q(H)} Σ_{c<n} e_c(a), a_x = e^{t q(x)} − 1 (e_c = elementary symmetric
    sums), and e_c over the growing prefixes is a chain of cumulative sums of positive
    terms — the incremental Poisson-binomial DP at fixed nodes, stable and vectorised.
    The integral is a trapezoid rule in ln t with ``RACE_NODES_PER_OCTAVE`` nodes per
    doubling of t (so a(2t) = a(t)(a(t) + 2) costs no exponential), truncated where every
    neglected piece is below ``RACE_TRUNCATION``. At large t only prefixes with small
    r·t matter; they are summed relative to the prefix where that window opens, whose
    arrival-count law is a separate exact product (``_head_count_law``).
    # draft_row [vocab] in scan order -> [vocab + 1]
    """
    draft = np.asarray(draft_row, dtype=np.float64)
    vocab_size, n = draft.shape[0], num_drafts
    remaining = np.zeros(vocab_size + 1)  # r_k = q(H_k^c), summed from the tail for accuracy
    np.cumsum(draft[::-1], out=remaining[-2::-1])
    support = np.concatenate([[0], np.cumsum(draft > 0)])  # tokens of H_k that can be drawn
    horizon = _race_horizon(draft, remaining, support, n)
    certain = np.where(support >= n, 1.0, 0.0)  # Q when H_k holds the whole draft support
    if horizon is None:
        return certain
    if not np.isfinite(horizon):
        raise ValueError(
            "draft_probs: the n-th largest draft masses are too small (subnormal) for the "
            "exponential-race quadrature"
        )

    step = log(2.0) / RACE_NODES_PER_OCTAVE
    start = (factorial(n + 1) * RACE_TRUNCATION) ** (1.0 / (n + 1))  # ∫_0^start ≤ truncation
    last_offset = (RACE_NODES_PER_OCTAVE - 1) / RACE_NODES_PER_OCTAVE  # in octaves
    num_octaves = max(1, int(np.ceil(np.log2(horizon / start) - last_offset)) + 1)
    offsets = step * np.arange(RACE_NODES_PER_OCTAVE)
    control_weights = np.zeros(vocab_size + 1)  # Σ_nodes h t W(t) e^{−r_k t}
    count_diffs = np.zeros(vocab_size + 1)  # differences in k of Σ_nodes h t e^{−r_k t} G_k(t)
    arrival = np.empty((RACE_NODES_PER_OCTAVE, vocab_size))  # a = e^{tq} − 1 per node, token
    decay = np.empty((RACE_NODES_PER_OCTAVE, vocab_size + 1))  # e^{−r_k t}
    level = np.zeros_like(arrival)  # e_c over prefixes, at each token's own prefix
    term = np.empty_like(arrival)
    windowed = np.empty_like(arrival)  # a, zeroed before each node's window
    row_sum = np.empty(vocab_size + 1)  # gemv output (fresh large arrays are slow here)
    for octave in range(num_octaves):
        times = start * 2.0**octave * np.exp(offsets)  # [nodes]
        control = gammaincc(n, times)  # W(t) = P(Erlang(n, 1) > t)
        needs_control = control.max() > RACE_TRUNCATION * 1e-3  # W falls as t grows
        if octave == 0:
            np.expm1(times[:, None] * draft[None, :], out=arrival)
            np.exp(-times[:, None] * remaining[None, :], out=decay)
        else:
            np.add(arrival, 2.0, out=term)
            with np.errstate(over="ignore"):
                np.multiply(arrival, term, out=arrival)  # e^{2tq} − 1 from e^{tq} − 1
            if times[-1] * draft.max() > RACE_WINDOW:  # keep tokens outside windows finite
                np.minimum(arrival, np.exp(RACE_WINDOW + 50.0), out=arrival)
            if needs_control:
                np.multiply(decay, decay, out=decay)  # e^{−2rt} from e^{−rt}
        if needs_control:
            control_weights += np.dot(step * times * control, decay, out=row_sum)

        # Window: prefixes k ≥ k0 with r_{k0} ≤ WINDOW/t; e^{−r_k t} < e^{−600} before it.
        window_start = np.searchsorted(-remaining, -RACE_WINDOW / times, side="left")
        head = np.zeros((len(times), n))
        head[:, 0] = 1.0
        windowed_or_all = arrival
        if np.any(window_start > 0):
            windowed_or_all = windowed
            np.copyto(windowed, arrival)
            for node in np.flatnonzero(window_start > 0):
                k0 = window_start[node]
                head[node] = _head_count_law(arrival[node, :k0], draft[:k0], times[node], n)
                windowed[node, :k0] = 0.0
        # G_k e^{−r_k t} = e^{−r_{k0} t} Σ_{c<n} coef_c e_c^{(k)}, coef_c = Σ_{i<n−c} head_i,
        # and e_c^{(k)} − e_c^{(k−1)} = a_{k−1} e_{c−1}^{(k−1)}, so the k-differences need
        # e_0..e_{n−2} at each token's own prefix only.
        coef = np.cumsum(head, axis=1)[:, ::-1]  # [nodes, n]
        weight = step * times * np.exp(-remaining[window_start] * times)  # [nodes]
        np.add.at(count_diffs, window_start, weight * coef[:, 0])
        level_term = windowed_or_all  # a · e_0 (e_0 = 1 on the window, a = 0 before it)
        for c in range(1, n):
            count_diffs[1:] += np.dot(weight * coef[:, c], level_term, out=row_sum[1:])
            if c < n - 1:
                np.cumsum(level_term[:, :-1], axis=1, out=level[:, 1:])  # e_c
                np.multiply(windowed_or_all, level, out=term)
                level_term = term
    control_integral = control_weights - np.cumsum(count_diffs)
    mass = (1.0 + remaining) ** (-n) + remaining * control_integral
    mass = np.where(remaining > 0, np.clip(mass, 0.0, 1.0), certain)
    return np.where(support >= n, mass, 0.0)


def _race_horizon(draft, remaining, support, n) -> float | None:
    """Largest node t needed: beyond it every prefix's integrand is below truncation.

    G_H(t) ≤ n e^{−q_(n)(H) t} (q_(n)(H) = n-th largest q in H) and the weight decays as
    e^{−r t}, so t = ln(n/truncation) / min_k max(r_k, q_(n)(H_k)) suffices; r_k falls and
    q_(n)(H_k) rises with k, so the minimum sits at their crossing (binary search).
    Also covers W(t) < truncation. None when no prefix needs the integral.
    """
    needed = np.flatnonzero((support >= n) & (remaining > 0))
    if needed.size == 0:
        return None

    def nth_largest(k):
        return np.partition(draft[:k], k - n)[k - n]

    low, high = needed[0], needed[-1] + 1
    while low < high:  # first k with nth_largest(k) ≥ r_k
        middle = (low + high) // 2
        if nth_largest(middle) >= remaining[middle]:
            high = middle
        else:
            low = middle + 1
    rate = min(
        max(remaining[k], nth_largest(k)) for k in (low - 1, low) if needed[0] <= k <= needed[-1]
    )
    return max(log(n / RACE_TRUNCATION) / rate, float(gammainccinv(n, RACE_TRUNCATION)))


def _head_count_law(arrival, draft, time, n) -> np.ndarray:
    """P(c of the given tokens arrived by ``time``), c = 0..n−1, as a vector [n].

    Tokens with a = e^{tq} − 1 ≤ 1 enter through power sums, exactly:
    Π(1 + a z) = exp(Σ_m (−1)^{m+1} P_m z^m / m) mod z^n, with P_m = Σ a^m (stable since
    a ≤ 1); the others through a product of (1 − s) + s z factors, s = a/(1 + a).
    """
    small = arrival <= 1.0
    small_arrival = arrival[small]
    log_series = np.zeros(n)
    log_series[0] = -time * draft[small].sum()
    power = np.ones_like(small_arrival)
    for m in range(1, n):
        power = power * small_arrival
        log_series[m] = (-1) ** (m + 1) * power.sum() / m
    law = np.zeros(n)  # exp of the series: c law_c = Σ_{i=1..c} i log_i law_{c−i}
    law[0] = np.exp(log_series[0])
    for c in range(1, n):
        law[c] = sum(i * log_series[i] * law[c - i] for i in range(1, c + 1)) / c
    large = arrival[~small]
    factors = np.zeros((large.size + 1, n))
    factors[0] = law
    factors[1:, 0] = 1.0 / (1.0 + large)
    factors[1:, 1] = large / (1.0 + large)
    return _truncated_product(factors)


def _truncated_product(factors: np.ndarray) -> np.ndarray:
    """Product of polynomials mod z^n by pairwise halving.  # [m, n] -> [n]"""
    n = factors.shape[1]
    while factors.shape[0] > 1:
        if factors.shape[0] % 2:
            factors = np.vstack([factors, np.eye(1, n)])
        left, right = factors[0::2], factors[1::2]
        factors = np.stack(
            [sum(left[:, i] * right[:, c - i] for i in range(c + 1)) for c in range(n)], axis=1
        )
    return factors[0]
