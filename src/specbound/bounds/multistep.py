"""The multi-step optimum (SPEC.md §7.4): how many drafts of one drafted tree any lossless
verifier can keep, as linear programs on enumerated laws, and the closed form for chains.

p = target, q = draft (SPEC.md §0). D is the law of the drafted tree (its draws at every
node, SPEC.md §6), P the target's law of token sequences. For a tree t and target tokens y,
L(t, y) is the length of the longest prefix of y that is a root path of t. The inputs are
plain arrays: the caller enumerates trees and sequences (``specbound.verifiers.enumeration.
TreeDrafter`` for small vocabularies and depths).

The ladder, each rung at most the next on the same drafted trees, by the information it uses:

1. **token-wise** verification (SPEC.md §6): at each node, that node's conditionals p(·|v),
   q(·|v) and draws only, one node at a time, top-down;
2. **block** (chains) / **traversal** (trees) verification (SPEC.md §7.1–§7.2): the
   conditionals at every node of the drafted tree, i.e. along every drafted path, together;
3. ``lossless_verifier_optimum``, the best **lossless verifier** of the drafted tree: the
   joint law D of the whole tree and the target's sequence law P, emitting the accepted
   path and one token, the target continuing;
4. ``coupling_optimum``, the best **coupling** of the tree with the target's next d tokens:
   the same joint laws, with the target's tokens chosen jointly with the whole tree, those
   after the first disagreement included. Every lossless verifier gives such a coupling
   (emit, then let the target continue to d tokens: the accepted drafts are a common
   prefix), so this bounds rung 3; it is not reached in general — on the two-token example
   of SPEC.md §7.1 the rungs are 10/9, 11/9, 11/9, 12/9. After a verifier's emitted token
   the target continues on its own, so the tokens past the first disagreement cannot depend
   on the drafts; in a coupling they can.

``chain_coupling_optimum``: for a chain of depth d the coupling optimum is, exactly and for
any context dependence,

  max E[L] = Σ_{k=1..d} Σ_{x_1..x_k} min(P(x_1..x_k), Q(x_1..x_k)),   Q the draft's chain law.

Proof sketch. A chain is one sequence x, and d − L(x, y) is the path distance between the
leaves x and y of the prefix tree of depth d with every edge weighing ½ (they part at depth
L and walk d − L edges each): a tree metric. Optimal transport on a tree metric costs
Σ_edges w_e |P(below e) − Q(below e)| (Wasserstein-1 on a tree: each edge carries exactly the
mass imbalance below it, and no coupling carries less), and the edges at depth k give
½ Σ_{x_1..x_k} |P − Q| = TV_k. So min E[d − L] = Σ_k TV_k and max E[L] = Σ_k (1 − TV_k).
"""

from __future__ import annotations

import numpy as np
import scipy.optimize
import scipy.sparse

from specbound.bounds.coupling import LP_TOLERANCE, MAX_LP_VARIABLES
from specbound.checks import within_limit


def _maximise(objective, a_ub, b_ub, a_eq=None, b_eq=None) -> float:
    """max objective·x over x ≥ 0 with HiGHS at its tightest tolerances: trees of
    probability 1e-9 and below are common, and the defaults (1e-7) let presolve call such
    a feasible system infeasible."""
    within_limit("LP variables", len(objective), MAX_LP_VARIABLES, "variables",
                 "the multi-step LPs are for small vocabularies and depths")
    result = scipy.optimize.linprog(
        -np.asarray(objective, dtype=np.float64), A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=b_eq,
        bounds=(0, None), method="highs",
        options={"primal_feasibility_tolerance": LP_TOLERANCE, "dual_feasibility_tolerance": LP_TOLERANCE},
    )
    if not result.success:
        raise RuntimeError(f"multistep LP: HiGHS failed: {result.message}")
    return float(-result.fun)


def _probabilities(name: str, values) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or np.any(~np.isfinite(array)) or np.any(array < 0):
        raise ValueError(f"{name}: expected a vector of non-negative probabilities, got shape {array.shape}")
    return array


def coupling_optimum(tree_probs, sequence_probs, prefix_lengths) -> float:
    """max over couplings π(t, y) of the drafted tree and the target's tokens of E_π[L(t, y)].
    # tree_probs [T] D(t); sequence_probs [S] P(y); prefix_lengths [T, S] L(t, y)

    Both marginals are relaxed to ≤ (as in SPEC.md §4.2): L ≥ 0, so slack can always be
    filled with score-0 mass, and pairs with L = 0 are left out for the same reason."""
    trees = _probabilities("tree_probs", tree_probs)
    sequences = _probabilities("sequence_probs", sequence_probs)
    lengths = np.asarray(prefix_lengths, dtype=np.float64)
    if lengths.shape != (trees.size, sequences.size):
        raise ValueError(f"prefix_lengths: expected [{trees.size}, {sequences.size}], got {lengths.shape}")
    tree_index, sequence_index = np.nonzero(lengths > 0)
    if tree_index.size == 0:
        return 0.0
    variables = np.arange(tree_index.size)
    ones = np.ones(tree_index.size)
    marginals = scipy.sparse.vstack([
        scipy.sparse.csr_matrix((ones, (tree_index, variables)), shape=(trees.size, variables.size)),
        scipy.sparse.csr_matrix((ones, (sequence_index, variables)), shape=(sequences.size, variables.size)),
    ], format="csr")
    return _maximise(lengths[tree_index, sequence_index], marginals, np.concatenate([trees, sequences]))


def lossless_verifier_optimum(tree_probs, tree_of, accepted, emitted_law, target_law) -> float:
    """max E[accepted drafts] over lossless verifiers of the drafted tree.
    # tree_probs [T] D(t); per variable k = (tree, last accepted node u, next token y):
    # tree_of [K] its tree, accepted [K] depth(u); emitted_law [Z, K] (dense or sparse) the law
    # over sequences z of length d + 1 that k emits, the target continuing; target_law [Z] P(z)

    Variables π_k ≥ 0 with Σ_{k of t} π_k ≤ D(t) and, for every z, Σ_k π_k·emitted_law[z, k]
    = P(z): the emitted sequence has the target's law. The equalities carry total mass 1 =
    Σ_t D(t), so each tree's ≤ holds with equality at every feasible point (as ≤ it adds no
    exactly dependent rows); rows with P(z) = 0 are dropped (a lossless verifier never
    emits there, so the caller leaves such variables out)."""
    trees = _probabilities("tree_probs", tree_probs)
    tree_of = np.asarray(tree_of, dtype=np.int64)
    scores = np.asarray(accepted, dtype=np.float64)
    target = _probabilities("target_law", target_law)
    emitted = scipy.sparse.csr_matrix(emitted_law)
    if scores.shape != tree_of.shape or emitted.shape != (target.size, tree_of.size):
        raise ValueError(f"emitted_law: expected [{target.size}, {tree_of.size}] with tree_of and accepted "
                         f"of length {tree_of.size}; got {emitted.shape}, {tree_of.shape}, {scores.shape}")
    if tree_of.size and (tree_of.min() < 0 or tree_of.max() >= trees.size):
        raise ValueError(f"tree_of: tree indices must lie in [0, {trees.size})")
    per_tree = scipy.sparse.csr_matrix((np.ones(tree_of.size), (tree_of, np.arange(tree_of.size))),
                                       shape=(trees.size, tree_of.size))
    used = np.flatnonzero(target > 0)
    return _maximise(scores, per_tree, trees, emitted[used], target[used])


def chain_coupling_optimum(target_block_laws, draft_block_laws) -> float:
    """Σ_k Σ_{x_1..x_k} min(P(x_1..x_k), Q(x_1..x_k)): the coupling optimum of a chain of
    depth d (module docstring), given the target's and the draft's laws of the first k
    tokens for k = 1..d.  # each a list of d arrays, the k-th of shape [vocab] * k"""
    if len(target_block_laws) != len(draft_block_laws):
        raise ValueError("draft_block_laws: expected one law per depth, as many as target_block_laws")
    total = 0.0
    for depth, (target, draft) in enumerate(zip(target_block_laws, draft_block_laws), start=1):
        target, draft = np.asarray(target, dtype=np.float64), np.asarray(draft, dtype=np.float64)
        if target.shape != draft.shape or target.ndim != depth:
            raise ValueError(f"draft_block_laws: the depth-{depth} laws must both be [vocab] * {depth}, "
                             f"got {target.shape} and {draft.shape}")
        total += float(np.minimum(target, draft).sum())
    return total
