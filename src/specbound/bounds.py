"""The optimal multi-draft acceptance rate α* and its certificate (SPEC §4.2, [HU]).

Convention (SPEC §0): p is the target distribution, q the draft distribution, D the
joint law of the n draft tokens x̄ = (x1..xn) under a draft scheme (SPEC §4.1).

α*(p, D) is the largest acceptance P(y ∈ x̄) of any lossless verifier: the optimum of the
optimal-transport LP over couplings π(x̄, y) with marginals D and p. Its dual, by total
unimodularity [HU], is the subset-selection formula

    α* = 1 + min_{H ⊆ vocab} [ p(H) − Q(H) ],   Q(H) = P_{x̄~D}(all n drafts ∈ H).

Three ways to compute it live here:
- ``optimal_coupling`` / ``optimal_acceptance_lp``: the LP itself (scipy HiGHS), for any
  explicit joint law on a small vocabulary; the coupling also drives the optimal verifier;
- ``optimal_acceptance_bruteforce``: the subset formula over all 2^V subsets;
- ``optimal_acceptance``: the fast exact prefix scan, batched, at real vocabulary sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import factorial, log

import numpy as np
import scipy.optimize
import scipy.sparse
from scipy.special import gammaincc, gammainccinv

from specbound.drafts import get_draft_scheme, top_tokens
from specbound.probability import as_distributions, as_target_and_draft

MAX_LP_VARIABLES = 1_000_000
LP_TOLERANCE = 1e-10  # HiGHS primal and dual feasibility tolerance (its tightest setting)
MAX_BRUTEFORCE_VOCAB = 16
MAX_BRUTEFORCE_ENTRIES = 20_000_000  # 2^V subsets x K draft tuples

SCAN_ROW_BLOCK = 4  # rows scanned together: larger blocks fall out of cache at V ~ 150k

# Exponential-race quadrature for Q(H) without replacement (``race_all_in_mass``):
RACE_TRUNCATION = 1e-13  # each neglected piece of the integral is below this
RACE_NODES_PER_OCTAVE = 3  # trapezoid step ln(2)/3 in ln t; a node's successor is at 2t
RACE_WINDOW = 600.0  # at node t only prefixes with t·q(H^c) ≤ 600 are summed: e^600 is finite
RACE_ACCURACY = 1e-11  # |error of Q(H)| observed below 1e-12; tests hold it to this bound


@dataclass(frozen=True)
class OptimalAcceptance:
    """α* per row and a subset H* attaining the minimum of p(H) − Q(H).

    H* is the certificate: every lossless verifier under this draft scheme loses at least
    Q(H*) − p(H*) acceptance, because drafts fall entirely inside H* more often (Q) than
    the target can emit a token of H* (p). When several subsets attain the minimum, each
    function says which one it returns.
    """

    acceptance: np.ndarray  # [batch]
    optimal_subset: np.ndarray  # [batch, vocab] bool


def optimal_coupling(target_row, draft_tuples, tuple_probs) -> tuple[np.ndarray, float]:
    """Solve the optimal-transport LP of SPEC §4.2 for one row.

    maximise Σ_{k, y ∈ x̄_k} π(k, y)  subject to  Σ_y π(k, y) = D_k,  Σ_k π(k, y) = p(y),
    π ≥ 0, where draft tuple k is x̄_k with probability D_k. Returns the coupling
    ``[K, vocab]`` (clipped at 0; marginals hold to ``LP_TOLERANCE``) and α* = its
    optimal value. The optimal verifier emits y ~ coupling[k] / D_k given x̄_k.
    # target_row [vocab], draft_tuples [K, n] int, tuple_probs [K]
    """
    target = as_distributions("target_row", target_row)
    if target.shape[0] != 1:
        raise ValueError(f"target_row: expected one row, got {target.shape[0]}")
    target = target[0]
    vocab_size = target.shape[0]
    tuples = np.asarray(draft_tuples)
    probs = np.asarray(tuple_probs, dtype=np.float64)
    if tuples.ndim != 2 or not np.issubdtype(tuples.dtype, np.integer):
        raise ValueError(f"draft_tuples: expected integer array [K, n], got {tuples.dtype} {tuples.shape}")
    if probs.shape != (tuples.shape[0],):
        raise ValueError(f"tuple_probs: expected shape ({tuples.shape[0]},), got {probs.shape}")
    if tuples.size and (tuples.min() < 0 or tuples.max() >= vocab_size):
        raise ValueError(f"draft_tuples: token ids must lie in [0, {vocab_size})")
    if np.any(probs < 0) or abs(probs.sum() - 1.0) > 1e-6:
        raise ValueError("tuple_probs: must be non-negative and sum to 1")
    num_tuples = tuples.shape[0]
    if num_tuples * vocab_size > MAX_LP_VARIABLES:
        raise ValueError(
            f"draft_tuples: the LP would have {num_tuples} x {vocab_size} = "
            f"{num_tuples * vocab_size:,} variables, above the limit {MAX_LP_VARIABLES:,}"
        )
    probs = probs / probs.sum()

    # Variable π(k, y) sits at index k * vocab + y.
    hits = np.zeros((num_tuples, vocab_size))  # [K, vocab] 1 where y ∈ x̄_k
    np.put_along_axis(hits, tuples, 1.0, axis=1)
    tuple_marginal = scipy.sparse.kron(
        scipy.sparse.identity(num_tuples), np.ones((1, vocab_size)), format="csr"
    )
    # The last target constraint follows from the others (both marginals sum to 1);
    # dropping it keeps rounding in the sums from making the LP look infeasible.
    target_marginal = scipy.sparse.kron(
        np.ones((1, num_tuples)), scipy.sparse.identity(vocab_size, format="csr")[:-1], format="csr"
    )
    result = scipy.optimize.linprog(
        -hits.ravel(),
        A_eq=scipy.sparse.vstack([tuple_marginal, target_marginal], format="csr"),
        b_eq=np.concatenate([probs, target[:-1]]),
        bounds=(0, None),
        method="highs",
        options={
            "primal_feasibility_tolerance": LP_TOLERANCE,
            "dual_feasibility_tolerance": LP_TOLERANCE,
        },
    )
    if not result.success:
        raise RuntimeError(f"optimal_coupling: HiGHS failed: {result.message}")
    coupling = np.maximum(result.x.reshape(num_tuples, vocab_size), 0.0)
    return coupling, float(-result.fun)


def _checked_rows(target_probs, draft_probs, num_drafts, scheme):
    """Validated float64 [batch, vocab] pair and the DraftScheme object."""
    target, draft = as_target_and_draft(target_probs, draft_probs)
    draft_scheme = get_draft_scheme(scheme)
    draft_scheme.check_num_drafts(num_drafts, draft)
    return target, draft, draft_scheme


def optimal_acceptance_lp(target_probs, draft_probs, num_drafts: int, scheme: str) -> np.ndarray:
    """α* per row from the coupling LP on the scheme's exact joint law (small V only).

    # target_probs, draft_probs [batch, vocab] -> [batch]
    """
    target, draft, draft_scheme = _checked_rows(target_probs, draft_probs, num_drafts, scheme)
    acceptance = []
    for target_row, draft_row in zip(target, draft):
        tuples, tuple_probs = draft_scheme.joint_law(
            draft_row, num_drafts, max_tuples=MAX_LP_VARIABLES // target.shape[1]
        )
        acceptance.append(optimal_coupling(target_row, tuples, tuple_probs)[1])
    return np.array(acceptance)


def optimal_acceptance_bruteforce(
    target_probs, draft_probs, num_drafts: int, scheme: str
) -> OptimalAcceptance:
    """α* = 1 + min over all 2^V subsets H of [p(H) − Q(H)], Q from the enumerated joint law.

    Exponential in V: for tests and tiny vocabularies (V ≤ ``MAX_BRUTEFORCE_VOCAB``).
    Among minimisers, H* is the one whose bitmask Σ_{y∈H} 2^y is smallest.
    # target_probs, draft_probs [batch, vocab] -> OptimalAcceptance
    """
    target, draft, draft_scheme = _checked_rows(target_probs, draft_probs, num_drafts, scheme)
    vocab_size = target.shape[1]
    if vocab_size > MAX_BRUTEFORCE_VOCAB:
        raise ValueError(
            f"target_probs: brute force enumerates 2^V subsets; V = {vocab_size} exceeds "
            f"{MAX_BRUTEFORCE_VOCAB}"
        )
    subsets = np.arange(2**vocab_size, dtype=np.int64)  # bit y set <=> token y ∈ H
    members = (subsets[:, None] >> np.arange(vocab_size)) & 1  # [2^V, vocab]
    acceptance, optimal_subset = [], []
    for target_row, draft_row in zip(target, draft):
        tuples, tuple_probs = draft_scheme.joint_law(draft_row, num_drafts)
        if subsets.size * len(tuples) > MAX_BRUTEFORCE_ENTRIES:
            raise ValueError(
                f"num_drafts: 2^{vocab_size} subsets x {len(tuples)} draft tuples exceeds "
                f"{MAX_BRUTEFORCE_ENTRIES:,} entries"
            )
        tuple_bits = np.bitwise_or.reduce(np.int64(1) << tuples, axis=1)  # [K]
        all_inside = (tuple_bits[None, :] & ~subsets[:, None]) == 0  # [2^V, K]
        gap = members @ target_row - all_inside @ tuple_probs  # p(H) − Q(H), [2^V]
        best = int(np.argmin(gap))
        acceptance.append(1.0 + gap[best])
        optimal_subset.append(members[best].astype(bool))
    return OptimalAcceptance(np.array(acceptance), np.array(optimal_subset))


# --------------------------------------------------------------------------------------
# The fast exact path: prefix scan in p/q order [HU]
# --------------------------------------------------------------------------------------
def scan_order(target_probs: np.ndarray, draft_probs: np.ndarray) -> np.ndarray:
    """Tokens sorted by p/q ascending: p = 0 < q first (ratio 0), q = 0 last (ratio ∞).

    Tokens with p = q = 0 (ratio NaN) go last too; they change neither p(H) nor Q(H).
    Equal ratios keep token-id order. For speed the ratio's bit pattern (monotone for
    non-negative floats, NaN above ∞) has its low bits replaced by the token id and is
    value-sorted; ratios that this truncation merged are put back in exact order.
    # [batch, vocab] x2 -> [batch, vocab] int
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = target_probs / draft_probs
    ratio += 0.0  # turns −0.0 into +0.0
    ratio_bits = ratio.view(np.uint64)
    vocab_size = ratio.shape[1]
    index_mask = np.uint64((1 << max(1, (vocab_size - 1).bit_length())) - 1)
    keys = np.bitwise_and(ratio_bits, ~index_mask)  # in place below: fresh arrays are slow
    np.bitwise_or(keys, np.arange(vocab_size, dtype=np.uint64), out=keys)
    keys.sort(axis=1)
    np.bitwise_and(keys, index_mask, out=keys)
    order = keys.view(np.int64)  # token ids < 2^63
    bits_in_order = np.take_along_axis(ratio_bits, order, axis=1)
    if np.any(bits_in_order[:, 1:] < bits_in_order[:, :-1]):
        order = np.take_along_axis(order, np.argsort(bits_in_order, axis=1, kind="stable"), axis=1)
    return order


def _prefix_sums(values: np.ndarray) -> np.ndarray:
    """[batch, V] -> [batch, V+1]: column k holds the sum of the first k values."""
    sums = np.zeros((values.shape[0], values.shape[1] + 1))
    np.cumsum(values, axis=1, out=sums[:, 1:])
    return sums


def prefix_all_in_mass(draft_in_order, num_drafts: int, scheme: str) -> np.ndarray:
    """Q(H_k) = P(all n drafts ∈ H_k) for every prefix H_k = the first k tokens, k = 0..V.

    ``draft_in_order`` is q already permuted into scan order. Exact formulas (SPEC §4.2):
    - with replacement: Q = q(H)^n;
    - without replacement, n = 1: q(H); n = 2: Q = Σ_{x∈H} q(x)(q(H) − q(x))/(1 − q(x))
      = q(H)² − q(H^c) Σ_{x∈H} q(x)²/(1 − q(x)) (q < 1: two distinct drafts exist);
    - without replacement, n ≥ 3: the exponential-race integral (``race_all_in_mass``).
    # draft_in_order [batch, vocab] -> [batch, vocab + 1]
    """
    draft = np.atleast_2d(np.asarray(draft_in_order, dtype=np.float64))
    if scheme == "with_replacement":
        inside = _prefix_sums(draft)
        mass = inside.copy()
        for _ in range(num_drafts - 1):  # repeated products: float ** int is a slow pow()
            mass *= inside
        return mass
    if scheme != "without_replacement":
        raise ValueError(
            f"scheme: prefix_all_in_mass covers with_replacement and without_replacement, "
            f"got {scheme!r}"
        )
    if num_drafts == 1:
        return _prefix_sums(draft)
    if num_drafts == 2:  # = q(H)² − q(H^c) Σ_H q²/(1 − q): no cancellation as H → vocab
        inside = _prefix_sums(draft)
        outside = np.zeros_like(inside)
        np.cumsum(draft[:, ::-1], axis=1, out=outside[:, -2::-1])
        return inside**2 - outside * _prefix_sums(draft**2 / _mass_of_the_others(draft))
    return np.stack([race_all_in_mass(row, num_drafts) for row in draft])


def _mass_of_the_others(draft: np.ndarray) -> np.ndarray:
    """1 − q(x) per token, summed from the other tokens for each row's largest one (where
    1 − q would cancel: q = 1 − 1e-9 leaves 1e-9 with 1e-7 relative error).
    # [batch, vocab] -> [batch, vocab]"""
    complement = 1.0 - draft
    largest = np.argmax(draft, axis=1)[:, None]
    is_largest = np.zeros(draft.shape, dtype=bool)
    np.put_along_axis(is_largest, largest, True, axis=1)
    others = np.where(is_largest, 0.0, draft).sum(axis=1, keepdims=True)
    np.put_along_axis(complement, largest, others, axis=1)
    return complement


def _optimum_from_prefixes(target, order, all_in_mass) -> OptimalAcceptance:
    """α* = 1 + min_k [p(H_k) − Q(H_k)]; H* = the shortest minimising prefix."""
    target_in_order = np.take_along_axis(target, order, axis=1)
    gaps = _prefix_sums(target_in_order) - all_in_mass  # [batch, V+1]
    best = np.argmin(gaps, axis=1)  # first minimiser: the shortest prefix
    acceptance = 1.0 + np.take_along_axis(gaps, best[:, None], axis=1)[:, 0]
    subset = np.zeros(order.shape, dtype=bool)
    for row, prefix_length in enumerate(best):
        subset[row, order[row, :prefix_length]] = True
    return OptimalAcceptance(acceptance, subset)


def _greedy_optimum(target, draft, num_drafts) -> OptimalAcceptance:
    """α*_greedy = p(T) + Σ_{x∉T} min(p(x), q′(x)), T = top n−1 of q, q′ = q/(1 − q(T)).

    The draft set is T plus one x ~ q′ outside T, so Q(H) = [T ⊆ H] q′(H ∖ T) and the
    subset formula is minimised by H* = T ∪ {x ∉ T : p(x) < q′(x)} (or ∅ when that gives
    no loss): 1 + p(T) − Σ_{x∉T} (q′ − p)+ [HU]. SpecHub pairs have the same set law.
    """
    top = top_tokens(draft, num_drafts - 1)  # [batch, n-1]
    in_top = np.zeros(draft.shape, dtype=bool)
    np.put_along_axis(in_top, top, True, axis=1)
    rest_mass = np.where(in_top, 0.0, draft).sum(axis=1, keepdims=True)  # 1 − q(T), > 0
    last_draft = np.where(in_top, 0.0, draft) / rest_mass  # q′
    shortfall = np.where(in_top, 0.0, np.maximum(last_draft - target, 0.0))
    loss = shortfall.sum(axis=1) - np.where(in_top, target, 0.0).sum(axis=1)
    acceptance = 1.0 - np.maximum(loss, 0.0)
    subset = (in_top | (shortfall > 0)) & (loss > 0)[:, None]
    return OptimalAcceptance(acceptance, subset)


def optimal_acceptance(target_probs, draft_probs, num_drafts: int, scheme: str) -> OptimalAcceptance:
    """Exact α* and its certificate H*, batched, at any vocabulary size (SPEC §4.2, [HU]).

    with_replacement / without_replacement: by q-convexity [HU] the minimum of
    p(H) − Q(H) is attained on a prefix of the scan order (p/q ascending, ``scan_order``),
    so only the V + 1 prefixes are checked (``prefix_all_in_mass``): O(V log V) with
    replacement; without replacement and n ≥ 3, Q(H) comes from the exponential-race
    quadrature, accurate to ``RACE_ACCURACY``. greedy / spechub: closed form.
    # target_probs, draft_probs [batch, vocab] -> OptimalAcceptance ([batch], [batch, vocab])
    """
    target, draft, _ = _checked_rows(target_probs, draft_probs, num_drafts, scheme)
    if scheme in ("greedy", "spechub"):
        return _greedy_optimum(target, draft, num_drafts)
    blocks = []
    for start in range(0, target.shape[0], SCAN_ROW_BLOCK):
        rows = slice(start, start + SCAN_ROW_BLOCK)
        order = scan_order(target[rows], draft[rows])
        draft_in_order = np.take_along_axis(draft[rows], order, axis=1)
        blocks.append(_optimum_from_prefixes(
            target[rows], order, prefix_all_in_mass(draft_in_order, num_drafts, scheme)
        ))
    return OptimalAcceptance(
        np.concatenate([block.acceptance for block in blocks]),
        np.concatenate([block.optimal_subset for block in blocks]),
    )


# --------------------------------------------------------------------------------------
# Without replacement, n ≥ 3: the exponential race
# --------------------------------------------------------------------------------------
def race_all_in_mass(draft_row, num_drafts: int) -> np.ndarray:
    """Q(H_k) = P(n draws without replacement all land in H_k), every prefix k = 0..V.

    Math (SPEC §4.2). Sampling without replacement is an exponential race: token x
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
