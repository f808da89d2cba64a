"""The optimal-transport LP behind α* (SPEC.md §4.2, [HU]): the best coupling of the target
token with the draft tuple.

α*(p, D) is the largest acceptance P(y ∈ x̄) of any lossless verifier whose drafts x̄
have the joint law D: the optimum of the LP over couplings π(x̄, y) with marginals D and
p. For an explicit joint law on a small vocabulary this module solves that LP itself
(scipy's HiGHS); the solved coupling also drives the optimal verifier
(``specbound.verifiers.optimal``). Letters: p = target (SPEC.md §0).

Size: K draft tuples over V tokens make K·V variables and K + V − 1 constraints. HiGHS'
time grows faster than the variables, as (K + V)·K·V (the upper end over
with/without-replacement and greedy joint laws; its cost per entry:
``work_limits.LP_SECONDS_PER_ENTRY``). ``lp_seconds`` is that estimate; an LP above
``LP_SECONDS_LIMIT`` (or ``MAX_LP_VARIABLES``) is refused with ``checks.WorkLimitError``
before it is built.
"""

from __future__ import annotations

import numpy as np
import scipy.optimize
import scipy.sparse

from specbound.checks import within_limit
from specbound.probability import as_distributions
from specbound.work_limits import LP_SECONDS_FIXED, LP_SECONDS_PER_ENTRY

MAX_LP_VARIABLES = 1_000_000
LP_SECONDS_LIMIT = 10.0


def lp_seconds(num_tuples: int, vocab_size: int) -> float:
    """Estimated seconds of ``optimal_coupling`` for K = ``num_tuples`` tuples over V tokens."""
    return LP_SECONDS_FIXED + LP_SECONDS_PER_ENTRY * (num_tuples + vocab_size) * num_tuples * vocab_size
LP_TOLERANCE = 1e-10  # HiGHS primal and dual feasibility tolerance (its tightest setting)


def optimal_coupling(target_row, draft_tuples, tuple_probs) -> tuple[np.ndarray, float]:
    """Solve the optimal-transport LP of SPEC.md §4.2 for one row.

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
    within_limit(f"draft_tuples: the coupling LP with {num_tuples:,} × {vocab_size:,} variables",
                 lp_seconds(num_tuples, vocab_size), LP_SECONDS_LIMIT, "s",
                 hint="the LP is for small problems (fewer drafts, a smaller vocabulary)")
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
