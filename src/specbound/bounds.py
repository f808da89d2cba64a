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

import numpy as np
import scipy.optimize
import scipy.sparse

from specbound.drafts import get_draft_scheme
from specbound.probability import as_distributions, as_target_and_draft

MAX_LP_VARIABLES = 1_000_000
LP_TOLERANCE = 1e-10  # HiGHS primal and dual feasibility tolerance (its tightest setting)
MAX_BRUTEFORCE_VOCAB = 16
MAX_BRUTEFORCE_ENTRIES = 20_000_000  # 2^V subsets x K draft tuples


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
        tuples, tuple_probs = draft_scheme.joint_law(draft_row, num_drafts)
        acceptance.append(optimal_coupling(target_row, tuples, tuple_probs)[1])
    return np.array(acceptance)


def optimal_acceptance_bruteforce(
    target_probs, draft_probs, num_drafts: int, scheme: str
) -> OptimalAcceptance:
    """α* = 1 + min over all 2^V subsets H of [p(H) − Q(H)], Q from the enumerated joint law.

    Exponential in V: for tests and tiny vocabularies (V ≤ ``MAX_BRUTEFORCE_VOCAB``).
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
