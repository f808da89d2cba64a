"""UniVer [UNIVER] (SPEC.md §7.5): tree verification in which each node's one-step plan — the
best lossless verifier of its draw scheme — is scaled by the node's prefix acceptance
probability, and the children it routes mass to are tried in turn, leaves towards the root.

p = target, q = draft (SPEC.md §0). A visited node v carries a *stake* s: the probability,
over the part of the tree not yet looked at, that the walk accepts at v or below. The root's
stake is 1. At an internal node with draws x̄:

  1. the node's *plan* π(·|x̄) is the exact output law of a lossless one-step verifier for
     the sub-probability target s·p(·|v) beside a *fail* token ⊥ of mass 1 − s that is never
     drafted (``PLANS``: Global Resolution for i.i.d. draws, which routes the most mass into
     the drafts, α* of the augmented pair; the scheme's own verifier otherwise);
  2. the children c_1, c_2, … (draw order) are tried in turn: with m_k = π(token of c_k|x̄)
     and M_k = m_1 + … + m_k, c_k is entered with stake m_k / (1 − M_{k−1}) and its subtree
     resolved completely; if it accepts somewhere, the step ends;
  3. once every child failed (probability 1 − M), v stops — the path root → v is kept — with
     probability Σ_{y not a child} π(y|x̄) / (1 − M), the next token drawn from π restricted to
     the tokens that are no child; otherwise (π(⊥|x̄) / (1 − M)) v fails to its parent.
A leaf entered with stake s accepts with probability s and emits the bonus token p(·|leaf).

Lossless, by induction on depth (SPEC.md §7.5): a node entered with stake s delivers
s·p(y|v) of "y, then the target's continuation" and fails with 1 − s, because its plan is
lossless for (s·p(·|v), 1 − s) and child c_k delivers m_k of "its token, then the target"
(entered with probability 1 − M_{k−1}, accepting with its stake). On a chain the plan with
one draw is speculative sampling on the scaled target, and UniVer is block verification;
with the plan RRS without replacement it is traversal verification (§7.2), draw for draw in
law.

Uniforms (``TreeVerifier``'s layout, one per node): uniforms[v], v ≥ 1, decides node v's own
stop in step 3 (a leaf's acceptance); uniforms[0] draws the next token by inverse CDF.
"""

from __future__ import annotations

import numpy as np

from specbound.verifiers.base import get_verifier, register_verifier
from specbound.verifiers.traversal import Traversal
from specbound.verifiers.tree import ScoredTree, TreeVerdict, TreeVerifier, emit_from

# the one-step plan at a node, by the tree's draft scheme: the best lossless verifier of each
PLANS = {"with_replacement": "global_resolution", "without_replacement": "rrs_without_replacement",
         "greedy": "greedy", "spechub": "spechub"}


def node_plan(tree: ScoredTree, node: int, stake: float) -> np.ndarray:
    """π(·|draws at ``node``) of its plan for the target stake·p(·|node) beside the fail
    token ⊥, which is entry V.  # -> [vocab + 1]"""
    draws = tree.draft_tokens[node]
    scheme = tree.draft_scheme if len(draws) > 1 else "with_replacement"  # one draw is one draw from q
    verifier = get_verifier(PLANS[scheme]).for_num_drafts(len(draws))
    target = np.append(stake * tree.target_probs[node], 1.0 - stake)
    draft = np.append(tree.draft_probs[node], 0.0)
    return verifier.output_law(target[None], draft[None], np.array([draws]))[0]


def _children(tree: ScoredTree, node: int, plan: np.ndarray):
    """(child, its stake) in draw order, the plan's mass on the tokens that are no child, and
    the plan's total mass on the children.  # -> list, [vocab], float"""
    tried, entered = [], 0.0
    rest = plan[:-1].copy()
    for child in tree.children(node):
        mass = plan[tree.tokens[child]]
        rest[tree.tokens[child]] = 0.0
        if mass > 0 and entered < 1.0:
            tried.append((child, min(1.0, mass / (1.0 - entered))))
        entered += mass
    return tried, rest, entered


def _resolve(tree, node, stake, reach, stopped, law) -> float:
    """Add reach·P(stop at u [, next token y]) to stopped[u] [law[u]] for u in ``node``'s
    subtree entered with ``stake``; return the probability that the subtree accepts, given
    its drafts (its stake on average over them)."""
    if tree.is_leaf(node):
        stopped[node] += reach * stake
        if law is not None:
            law[node] += reach * stake * tree.target_probs[node]
        return stake
    tried, rest, entered = _children(tree, node, node_plan(tree, node, stake))
    declined = 1.0  # probability that every child tried so far failed
    for child, child_stake in tried:
        declined *= 1.0 - _resolve(tree, child, child_stake, reach * declined, stopped, law)
    stops = rest / (1.0 - entered) if entered < 1.0 else 0.0 * rest  # the stop's law once all failed
    stopped[node] += reach * declined * stops.sum()
    if law is not None:
        law[node] += reach * declined * stops
    return 1.0 - declined * (1.0 - stops.sum())


def _visit(tree, node, stake, uniforms) -> TreeVerdict | None:
    """Resolve ``node``'s subtree with the given uniforms: its verdict if it accepts, else None."""
    if tree.is_leaf(node):
        return TreeVerdict(node, emit_from(tree.target_probs[node], uniforms[0])) if uniforms[node] < stake else None
    tried, rest, entered = _children(tree, node, node_plan(tree, node, stake))
    for child, child_stake in tried:
        verdict = _visit(tree, child, child_stake, uniforms)
        if verdict is not None:
            return verdict
    stops = rest.sum()
    accepts = stops > 0 if node == 0 else entered < 1.0 and uniforms[node] < stops / (1.0 - entered)
    return TreeVerdict(node, emit_from(rest, uniforms[0])) if accepts else None


@register_verifier
class UniVer(Traversal):
    """UniVer [UNIVER] of a drafted tree (module docstring): lossless; block verification on
    a chain, traversal verification on trees drawn without replacement. Its walk differs from
    traversal's (``Traversal._walk``, ``_walk_laws``), the rest is shared."""

    name = "univer"
    label = "UniVer (scaled one-step plans)"
    scheme = "with_replacement"

    def _check_tree(self, tree):
        TreeVerifier._check_tree(self, tree)
        if tree.draft_scheme not in PLANS:
            raise ValueError(f"tree: UniVer has one-step plans for {sorted(PLANS)}, the tree was drafted "
                             f"{tree.draft_scheme}")

    def _walk(self, tree, uniforms):
        return _visit(tree, 0, 1.0, uniforms)

    def _walk_laws(self, tree, stopped, law):
        return _resolve(tree, 0, 1.0, 1.0, stopped, law)
