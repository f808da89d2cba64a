"""Traversal verification of a drafted tree [TRAVERSAL] (SPEC.md §7.2): leaves towards the
root, acceptance at the level of sequences, with its exact law.

p = target, q = draft (SPEC.md §0). Every visited node v carries a *state* (s, P): a stake
s ∈ [0, 1] — the probability, over the part of the tree not yet looked at, that the
verifier accepts at v or below — and the row P that v emits from if it stops at v. The root
starts in (1, p(·|root)). The walk is a depth-first post-order traversal: at an internal node
the draws x_1..x_n are taken **in draw order**, Q_k being the law draw k was made from
(q(·|v); without replacement, q(·|v) without x_1..x_{k−1}, renormalised):

  1. the child c carrying x_k (met for the first time) is entered in state
     (min(1, s·P(x_k)/Q_k(x_k)), p(·|c)) and its subtree is resolved completely; if it
     accepts somewhere, the step ends there;
  2. otherwise v's state becomes, with r = (s·P − Q_k)+ and ρ = Σ r,
         s ← ρ / ((1 − s) + ρ)  (0 when ρ = 0),   P ← r / ρ;
  3. after its last draw (at once, for a leaf), v accepts with probability s — the path
     root → v is kept and the next token is drawn from P (at a leaf P = p(·|leaf): the bonus
     token) — or fails back to its parent.

At the root s stays exactly 1, so the walk always ends. On a chain, step 2 turns block
verification's weight w_i into its stop probability h_i: traversal on a chain *is* block
verification (``specbound.verifiers.block``), the same law and, for the same uniforms, the
same decisions.

Why it is lossless (our proof; the tests check it by exact enumeration). Claim: a node
entered in state (s, P), whatever the laws Q_k of its remaining draws (they may depend on
the earlier ones), accepts at itself or below with probability s on average over its
untouched subtree, and emits y followed by the target's continuation with mass s·P(y).
Induction on the draws left and on depth: draw k = a has probability Q_k(a) and its child
accepts with probability min(1, s·P(a)/Q_k(a)), emitting a and (induction on depth) the
target's continuation: mass min(Q_k, s·P) on the first token. It fails with probability
1 − Σ min(Q_k, s·P) = (1 − s) + ρ, after which (induction on draws) the node delivers
s′·P′ = r / ((1 − s) + ρ) on that event, i.e. mass r = (s·P − Q_k)+. In total
min(Q_k, s·P) + (s·P − Q_k)+ = s·P. With no draws left the node accepts with s and emits
from P. The root's state (1, p(·|root)) therefore emits the target's law.

Draft scheme it requires: *sequential draws whose conditional laws Q_k are known*, each
child's subtree drafted given that child only. Without replacement is the setting of
[TRAVERSAL] (its ``scheme``, what the engine drafts its trees with); i.i.d. draws with
replacement qualify too. There, a token drawn again after its subtree failed is rejected
outright: a failed child had s·P(x) < Q(x) (else its stake was 1 and it could not fail), so
r(x) = 0 from then on and its stake is exactly 0 — which is why duplicates may share one
subtree. The order matters: siblings are tried in draw order (without replacement the
draws are not exchangeable), each subtree resolved before the next sibling is touched; a
token-dependent order ("deepest subtree first") breaks losslessness on ragged trees.

Uniforms (``TreeVerifier``'s layout, one per node): uniforms[v], v ≥ 1, decides node v's own
acceptance in step 3; uniforms[0] draws the next token by inverse CDF from the accepting
node's P.
"""

from __future__ import annotations

import numpy as np

from specbound.probability import ZeroResidualError, normalize_mass
from specbound.verifiers.base import register_verifier
from specbound.verifiers.tree import ROUNDOFF, ScoredTree, TreeVerdict, TreeVerifier, emit_from

SEQUENTIAL_SCHEMES = ("with_replacement", "without_replacement")  # known laws Q_k of each draw


def _draws(tree: ScoredTree, node: int):
    """(Q_k [vocab], token, first time drawn) for the draws at ``node``, in draw order."""
    draft_row, draws = tree.draft_probs[node], tree.draft_tokens.get(node, ())
    unused = draft_row > 0
    for k, token in enumerate(draws):
        shrinks = k > 0 and tree.draft_scheme == "without_replacement"
        # the unused mass summed directly: 1 − used loses digits next to a dominant token
        yield (normalize_mass(np.where(unused, draft_row, 0.0), "draft") if shrinks else draft_row,
               token, token not in draws[:k])
        unused[token] = False


def _after_failure(stake: float, row: np.ndarray, draw_law: np.ndarray) -> tuple[float, np.ndarray]:
    """The state once the child of a draw from Q_k failed: (ρ/((1 − s) + ρ), r/ρ), r = (s·P − Q_k)+."""
    residual = np.maximum(stake * row - draw_law, 0.0)
    mass = residual.sum()
    if not mass > 0:
        return 0.0, residual
    return mass / ((1.0 - stake) + mass), residual / mass


def _resolve(tree, node, stake, row, reach, stopped, law) -> float:
    """Add reach·P(accept at u [, next token y]) to stopped[u] [law[u]] for u in ``node``'s
    subtree entered in state (stake, row); return the probability that the subtree accepts."""
    declined = 1.0  # probability that every child tried so far failed
    for draw_law, token, first in _draws(tree, node):
        if stake == 0.0 or declined == 0.0:  # nothing left to deliver below
            break
        if first:
            child = tree.child_with_token(node, token)
            child_stake = min(1.0, stake * row[token] / draw_law[token])
            declined *= 1.0 - _resolve(tree, child, child_stake, tree.target_probs[child],
                                       reach * declined, stopped, law)
        stake, row = _after_failure(stake, row, draw_law)
    stopped[node] += reach * declined * stake
    if law is not None:
        law[node] += reach * declined * stake * row
    return 1.0 - declined * (1.0 - stake)


def _visit(tree, node, stake, row, uniforms) -> TreeVerdict | None:
    """Resolve ``node``'s subtree with the given uniforms: its verdict if it accepts, else None."""
    for draw_law, token, first in _draws(tree, node):
        if stake == 0.0:
            return None
        if first:
            child = tree.child_with_token(node, token)
            child_stake = min(1.0, stake * row[token] / draw_law[token])
            verdict = _visit(tree, child, child_stake, tree.target_probs[child], uniforms)
            if verdict is not None:
                return verdict
        stake, row = _after_failure(stake, row, draw_law)
    accepts = stake > 0 if node == 0 else uniforms[node] < stake
    return TreeVerdict(node, emit_from(row, uniforms[0])) if accepts else None


@register_verifier
class Traversal(TreeVerifier):
    """Traversal verification [TRAVERSAL] of a drafted tree: lossless; block verification
    on a chain (module docstring)."""

    name = "traversal"
    label = "traversal verification"
    scheme = "without_replacement"

    def _check_tree(self, tree):
        super()._check_tree(tree)
        if not tree.is_chain and tree.draft_scheme not in SEQUENTIAL_SCHEMES:
            raise ValueError(f"tree: traversal verification needs sequential draws with known laws "
                             f"{SEQUENTIAL_SCHEMES}, the tree was drafted {tree.draft_scheme}")

    def _walk(self, tree, uniforms) -> TreeVerdict | None:
        """The walk from the root with the given uniforms: its verdict, None where the root rejected."""
        return _visit(tree, 0, 1.0, tree.target_probs[0], uniforms)

    def _walk_laws(self, tree, stopped, law) -> float:
        """The walk from the root on probabilities: fills ``stopped`` [nodes] (and ``law`` [nodes,
        vocab] unless None) and returns the probability that the root accepts."""
        return _resolve(tree, 0, 1.0, tree.target_probs[0], 1.0, stopped, law)

    def _verify_tree(self, tree, uniforms):
        verdict = self._walk(tree, uniforms)
        if verdict is None:
            raise ZeroResidualError(f"{self.label} rejected the root; only rounding can do this")
        return verdict

    def _accepting(self, tree, with_law: bool):
        stopped = np.zeros(tree.num_nodes)
        law = np.zeros((tree.num_nodes, tree.vocab_size)) if with_law else None
        accepted = self._walk_laws(tree, stopped, law)
        if 1.0 - accepted > ROUNDOFF:
            raise ZeroResidualError(f"{self.label} rejected the root with probability {1 - accepted:.3g}")
        return stopped, law

    def _outcome_law(self, tree):
        return self._accepting(tree, with_law=True)[1]

    def _stop_probabilities(self, tree):
        return self._accepting(tree, with_law=False)[0]
