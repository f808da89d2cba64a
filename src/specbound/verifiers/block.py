"""Block verification of a chain of γ drafts [BLOCK] (SPEC.md §7.1), with its exact law.

p = target, q = draft (SPEC.md §0). Drafts x_1..x_γ, x_{i+1} ~ q_i = q(·|x_1..x_i); p_i is
the target's conditional at node i (prefix x_1..x_i), all known after one target call.

Weights, one per prefix of the block (a running likelihood ratio clipped at 1):

  w_0 = 1,   w_i = min(1, w_{i−1}·p_{i−1}(x_i)/q_{i−1}(x_i)).

Residual at node i < γ, its mass ρ_i and the probability h_i of stopping there:

  r_i = (w_i p_i − q_i)+,   ρ_i = Σ r_i,   h_i = ρ_i / ((1 − w_i) + ρ_i)  (0 when ρ_i = 0),
  h_γ = w_γ (r_γ = w_γ p_γ: the bonus),   h_0 = 1.

The verifier keeps τ = max{i ≥ 1 : η_i < h_i} drafts (τ = 0 when there is none) and emits
the next token from norm(r_τ) — from p_γ, the bonus token, when τ = γ. So
P(τ = i | x) = h_i Π_{j>i}(1 − h_j).

Why it is lossless (our derivation; the tests check it by exact enumeration). Write
A_i = P(τ ≥ i | x) = 1 − Π_{j≥i}(1 − h_j). Since E_{x_{i+1}~q_i}[w_{i+1}] = Σ min(q_i, w_i p_i)
= w_i − ρ_i, induction from i = γ down gives E[A_i | x_1..x_i] = w_i: a prefix's weight is
its probability, over the rest of the block, of being kept. Hence P(τ = i, x_1..x_i) =
Q(x_1..x_i)·ρ_i, and the mass emitted at node i is Q(x_1..x_i)·r_i. The sequences starting
x_1..x_i y are kept further (Q(x_1..x_i)·min(q_i(y), w_i p_i(y))), stopped at i with y
(Q(x_1..x_i)·(w_i p_i − q_i)+(y)) or stopped earlier and continued by the target
((P − Q w_i)(x_1..x_i)·p_i(y), induction on i): P(x_1..x_i y) in total. So the emitted
sequence has the target's law, and E[τ] = Σ_{i=1..γ} E_Q[w_i] over the drafts.

[BLOCK] prove it optimal among verifiers that see the same conditionals; the multi-step LP
(``specbound.bounds.multistep``) agrees: on every chain we enumerate, block verification
equals the best lossless verifier of the drafted chain.

Uniforms (``TreeVerifier``'s layout, [γ + 1] = one per node): uniforms[i], i = 1..γ,
decides node i — scanned from i = γ down, the first i with uniforms[i] < h_i is τ, and the
ones below τ are not looked at; uniforms[0] draws the next token by inverse CDF from r_τ.
Traversal verification on a chain (``specbound.verifiers.traversal``) reads them the same
way and makes the same decisions.
"""

from __future__ import annotations

import numpy as np

from specbound.probability import ZeroResidualError
from specbound.verifiers.base import register_verifier
from specbound.verifiers.tree import ROUNDOFF, ScoredTree, TreeVerdict, TreeVerifier, emit_from


def block_terms(tree: ScoredTree) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Weights w [γ+1], stop probabilities h [γ+1] (h_0 = 1) and residuals r [γ+1, vocab]
    of a chain; row γ of r is w_γ·p_γ, so h_i·norm(r_i) is the law of stopping at i with y."""
    gamma = tree.num_nodes - 1  # a chain's node i is its i-th draft
    target, draft = tree.target_probs, tree.draft_probs
    drafts = np.array(tree.tokens[1:], dtype=np.int64)
    ratios = target[np.arange(gamma), drafts] / draft[np.arange(gamma), drafts]  # [γ]
    weights = np.ones(gamma + 1)
    for i in range(1, gamma + 1):
        weights[i] = min(1.0, weights[i - 1] * ratios[i - 1])
    residuals = np.empty((gamma + 1, tree.vocab_size))
    np.maximum(weights[:gamma, None] * target[:gamma] - draft[:gamma], 0.0, out=residuals[:gamma])
    residuals[gamma] = weights[gamma] * target[gamma]
    masses = residuals[:gamma].sum(axis=1)
    stop = np.zeros(gamma + 1)
    np.divide(masses, (1.0 - weights[:gamma]) + masses, out=stop[:gamma], where=masses > 0)
    stop[gamma] = weights[gamma]
    stop[0] = 1.0
    return weights, stop, residuals


def _stop_law(stop: np.ndarray) -> np.ndarray:
    """P(τ = i) = h_i Π_{j>i}(1 − h_j).  # [γ+1] -> [γ+1]"""
    declined_above = np.append(np.cumprod((1.0 - stop[1:])[::-1])[::-1], 1.0)  # Π_{j>i}(1 − h_j)
    return stop * declined_above


@register_verifier
class Block(TreeVerifier):
    """Block verification [BLOCK] of a chain: lossless, never below token-wise
    verification, optimal on chains (module docstring)."""

    name = "block"
    label = "block verification"
    scheme = "with_replacement"  # one draft per node: one draw from q
    fixed_num_drafts = 1

    def _check_tree(self, tree):
        super()._check_tree(tree)
        if not tree.is_chain:
            raise ValueError("tree: block verification needs a chain, one draw at every internal node")

    def _verify_tree(self, tree, uniforms):
        _, stop, residuals = block_terms(tree)
        kept = next((i for i in range(tree.num_nodes - 1, 0, -1) if uniforms[i] < stop[i]), 0)
        return TreeVerdict(kept, emit_from(residuals[kept], uniforms[0]))

    def _outcome_law(self, tree):
        _, stop, residuals = block_terms(tree)
        stopped = _stop_law(stop)
        masses = residuals.sum(axis=1)
        lost = (masses <= 0) & (stopped > ROUNDOFF)
        if np.any(lost):
            raise ZeroResidualError(f"block verification stops at node {int(np.argmax(lost))} with zero residual mass")
        scale = np.divide(stopped, masses, out=np.zeros_like(masses), where=masses > 0)
        return residuals * scale[:, None]

    def _stop_probabilities(self, tree):
        return _stop_law(block_terms(tree)[1])
