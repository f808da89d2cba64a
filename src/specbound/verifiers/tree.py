"""One drafted step as a tree, the verifiers that decide on all of it, and its exact laws
(SPEC.md §6, §7).

p = target, q = draft (SPEC.md §0). Node 0 of a drafted tree is the **root**, the last
committed token; every other node is a drafted token, and its *prefix* is the root's token
followed by the tokens on the path to it. At an internal node the drafter made n draws from
q(·|prefix) under a draft scheme (SPEC.md §4.1); the node's children are the distinct tokens
drawn, in order of first appearance, and each child's subtree was drafted given that child
only (duplicate draws share one subtree, SPEC.md §6). One target call scores every node,
leaves included, so p(·|prefix) is known everywhere. A *chain* is the tree whose internal
nodes made one draw each; its node i is its i-th draft.

Verifying the step emits the accepted path, root → the last accepted node u, and one more
token y: a residual token, or the bonus token from p(·|u) when u is a leaf. Its **outcome
law** is the exact law of (u, y) given the drafted tree; its **expected accepted length** is
E[depth(u) | tree] = Σ_{v ≠ root} P(the accepted path reaches v) (SPEC.md §7.3).

- ``ScoredTree``: the drafted step, checked; ``ScoredTree.chain`` for a chain,
  ``scored_tree`` for the engine's plain arrays;
- ``TreeVerifier``: the base class of the verifiers that decide on the whole drafted step
  (``block``, ``traversal``, ``univer``), registered in the one verifier registry with ``per_node = False``;
- ``tokenwise_outcome_law``, ``tokenwise_expected_accepted``: top-down token-level
  verification (SPEC.md §6) with any per-node verifier of the registry, exactly.

The law of the drafted tree itself, the target's law of sequences and the multi-step optimum
on them are enumerated in ``verifiers.enumeration`` (for small vocabularies).
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field
from types import MappingProxyType
from typing import Callable, ClassVar, Mapping, NamedTuple, Sequence, Union

import numpy as np

from specbound.drafts import get_draft_scheme
from specbound.probability import as_distributions, sample_from
from specbound.verifiers.base import Verifier

ROUNDOFF = 1e-12  # stop or acceptance mass this small landing on an empty residual is rounding


class TreeVerdict(NamedTuple):
    """One verification of a drafted tree: ``node``, the last accepted node (the accepted
    drafts are ``tree.path_nodes(node)``; 0: none), and ``next_token``, the residual token or,
    at a leaf, the bonus token."""

    node: int
    next_token: int


@dataclass(frozen=True, eq=False)
class ScoredTree:
    """One drafted step scored by the target call: the target and draft conditionals at its nodes
    (module docstring).

    parents       [nodes] parents[0] = -1 and 0 ≤ parents[v] < v: parents precede children
    tokens        [nodes] the token of each node (tokens[0]: the last committed token)
    draft_tokens  internal node -> its draws in draw order, duplicates kept; its children
                  carry the distinct ones, in order of first appearance
    draft_scheme  the scheme the draws at a node were made with (``specbound.drafts``)
    draft_probs   [nodes, vocab] q(·|prefix of v); rows of leaves are not read (zeros will do)
    target_probs  [nodes, vocab] p(·|prefix of v) at every node, leaves included
    check_rows    True: the rows are checked as ``as_distributions`` does (and renormalised);
                  False: float64 rows are trusted as probability rows, kept without a copy —
                  the engine's one processing step makes them (as ``DraftScheme.sample_torch``
                  trusts them), and the check costs more than a verification at V = 151,936.
                  The structure is always checked; the arrays are kept read-only.
    """

    parents: Sequence[int]
    tokens: Sequence[int]
    draft_tokens: Mapping[int, Sequence[int]]
    draft_scheme: str
    draft_probs: np.ndarray  # [nodes, vocab]
    target_probs: np.ndarray  # [nodes, vocab]
    check_rows: InitVar[bool] = True
    _children: tuple[tuple[int, ...], ...] = field(init=False, repr=False)
    _child_of: tuple[dict[int, int], ...] = field(init=False, repr=False)
    _depths: np.ndarray = field(init=False, repr=False)

    def __post_init__(self, check_rows: bool) -> None:
        parents = tuple(int(v) for v in self.parents)
        num_nodes = len(parents)
        if not parents or parents[0] != -1 or any(not 0 <= parents[v] < v for v in range(1, num_nodes)):
            raise ValueError("parents: node 0 is the root (parent -1) and every parent precedes its child")
        rows = as_distributions if check_rows else _trusted_rows
        target = rows("target_probs", self.target_probs)
        if target.shape[0] != num_nodes:
            raise ValueError(f"target_probs: expected [nodes={num_nodes}, vocab], got {target.shape}")
        vocab = target.shape[1]
        tokens = tuple(int(t) for t in self.tokens)
        if len(tokens) != num_nodes or any(not 0 <= t < vocab for t in tokens):
            raise ValueError(f"tokens: expected {num_nodes} token ids in [0, {vocab})")
        children: list[list[int]] = [[] for _ in range(num_nodes)]
        for v in range(1, num_nodes):
            children[parents[v]].append(v)
        internal = [v for v in range(num_nodes) if children[v]]
        draft_tokens = {int(v): tuple(int(t) for t in draws) for v, draws in self.draft_tokens.items()}
        if sorted(draft_tokens) != internal:
            raise ValueError(f"draft_tokens: expected the draws of the internal nodes {internal}, "
                             f"got draws for {sorted(draft_tokens)}")
        draft = np.asarray(self.draft_probs) if check_rows else _trusted_rows("draft_probs", self.draft_probs)
        if draft.shape != target.shape:
            raise ValueError(f"draft_probs: expected the target's shape {target.shape}, got {draft.shape}")
        if check_rows:
            checked, draft = draft[internal], np.zeros(target.shape)  # leaves' rows stay 0, never read
            if internal:
                draft[internal] = as_distributions("draft_probs", checked)
        scheme = get_draft_scheme(self.draft_scheme)
        for v in internal:
            draws, distinct = draft_tokens[v], tuple(dict.fromkeys(draft_tokens[v]))
            if tuple(tokens[c] for c in children[v]) != distinct:
                raise ValueError(f"draft_tokens[{v}]: the children's tokens {[tokens[c] for c in children[v]]} "
                                 f"must be the distinct draws {list(distinct)}, in order of first appearance")
            if scheme.needs_distinct_support and len(distinct) < len(draws):
                raise ValueError(f"draft_tokens[{v}]: the {scheme.name} scheme never repeats a token")
            if not np.all(draft[v, list(distinct)] > 0):
                raise ValueError(f"draft_tokens[{v}]: a draw has zero draft probability")
        depths = np.zeros(num_nodes, dtype=np.int64)
        for v in range(1, num_nodes):
            depths[v] = depths[parents[v]] + 1
        target, draft = target.view(), draft.view()  # read-only views; a trusted caller's array stays as it is
        for array in (target, draft, depths):
            array.setflags(write=False)
        object.__setattr__(self, "parents", parents)
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "draft_tokens", MappingProxyType(draft_tokens))
        object.__setattr__(self, "target_probs", target)
        object.__setattr__(self, "draft_probs", draft)
        object.__setattr__(self, "_children", tuple(tuple(c) for c in children))
        object.__setattr__(self, "_child_of", tuple({tokens[c]: c for c in kids} for kids in children))
        object.__setattr__(self, "_depths", depths)

    @classmethod
    def chain(cls, root_token: int, draft_tokens, target_probs, draft_probs) -> ScoredTree:
        """The chain root → x_1 → … → x_γ (node i = x_i).
        # draft_tokens [γ]; target_probs [γ + 1, vocab], row i = p(·|root, x_1..x_i);
        # draft_probs [γ, vocab], row i = q(·|root, x_1..x_i), the law x_{i+1} was drawn from"""
        drafts = tuple(int(t) for t in draft_tokens)
        gamma = len(drafts)
        target = np.asarray(target_probs, dtype=np.float64)
        draft = np.asarray(draft_probs, dtype=np.float64)
        if target.ndim != 2 or target.shape[0] != gamma + 1 or draft.shape != (gamma, target.shape[1]):
            raise ValueError(f"draft_probs: a chain of {gamma} drafts needs target_probs [{gamma + 1}, vocab] "
                             f"and draft_probs [{gamma}, vocab]; got {target.shape} and {draft.shape}")
        return cls(
            parents=(-1, *range(gamma)),
            tokens=(int(root_token), *drafts),
            draft_tokens={i: (token,) for i, token in enumerate(drafts)},
            draft_scheme="with_replacement",  # one draw is one draw from q under every scheme
            draft_probs=np.vstack([draft, np.zeros((1, target.shape[1]))]),
            target_probs=target,
        )

    # -- structure ----------------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return len(self.parents)

    @property
    def vocab_size(self) -> int:
        return self.target_probs.shape[1]

    @property
    def depths(self) -> np.ndarray:
        """Number of drafts on the path root → v, per node.  # [nodes]"""
        return self._depths

    @property
    def max_depth(self) -> int:
        return int(self._depths.max())

    @property
    def is_chain(self) -> bool:
        return all(len(draws) == 1 for draws in self.draft_tokens.values())

    def children(self, node: int) -> tuple[int, ...]:
        """The children of ``node``, in order of first appearance among its draws."""
        return self._children[node]

    def is_leaf(self, node: int) -> bool:
        return not self._children[node]

    def child_with_token(self, node: int, token: int) -> int | None:
        """The child of ``node`` carrying ``token``, or None."""
        return self._child_of[node].get(token)

    def path_nodes(self, node: int) -> tuple[int, ...]:
        """The nodes root → ``node``, root excluded, in depth order (the accepted drafts)."""
        nodes = []
        while node > 0:
            nodes.append(node)
            node = self.parents[node]
        return tuple(reversed(nodes))

    def path_tokens(self, node: int) -> tuple[int, ...]:
        """The drafted tokens on the path root → ``node`` (the root's token excluded)."""
        return tuple(self.tokens[v] for v in self.path_nodes(node))

    def prefix(self, node: int) -> tuple[int, ...]:
        """The context of ``node``'s conditionals: the root's token, then the path's tokens."""
        return (self.tokens[0], *self.path_tokens(node))

    def longest_root_path(self, sequence) -> int:
        """The length of the longest prefix of ``sequence`` that is a root path of the tree."""
        node = 0
        for matched, token in enumerate(sequence):
            node = self.child_with_token(node, int(token))
            if node is None:
                return matched
        return len(sequence)


def scored_tree(parents, tokens, draft_tokens, draft_scheme: str, draft_rows, target_rows) -> ScoredTree:
    """The ``ScoredTree`` of one engine step, from plain arrays, cheaply (no value checks).
    # parents [nodes], tokens [nodes]; draft_tokens: internal node -> [n] ids, in draw order;
    # draft_rows: internal node -> [vocab]; target_rows [nodes, vocab]; any float dtype, CPU

    ``draft_scheme``: the scheme of the nodes with several draws (one draw is one draw from q
    under every scheme). Rows are made float64 and renormalised — a float32 row over 151,936
    tokens sums to 1 only within ~1e-6, and the renormalised row is the law it was drawn
    from — then trusted (``check_rows=False``); the tree's structure is checked."""
    target = np.asarray(target_rows, dtype=np.float64)
    target = target / target.sum(axis=1, keepdims=True)
    draft = np.zeros(target.shape)
    for node, row in draft_rows.items():
        row = np.asarray(row, dtype=np.float64)
        draft[int(node)] = row / row.sum()
    draws = {int(node): np.asarray(drawn).tolist() for node, drawn in draft_tokens.items()}
    return ScoredTree(parents, tokens, draws, draft_scheme, draft, target, check_rows=False)


def _trusted_rows(name: str, probs) -> np.ndarray:
    """``probs`` as float64 [rows, vocab] without a copy, its shape checked, not its values."""
    rows = np.asarray(probs)
    if rows.dtype != np.float64 or rows.ndim != 2:
        raise ValueError(f"{name}: trusted rows must be float64 [nodes, vocab], got {rows.dtype} {rows.shape}")
    return rows


class TreeVerifier(Verifier):
    """Base class of the verifiers that decide on a whole drafted step (SPEC.md §7): they
    read the target and draft rows of every node at once, which the engine has after its one
    target call. Registered in ``VERIFIERS`` like the per-node verifiers, with
    ``per_node = False``: the single-step API (``verify``, ``output_law``,
    ``acceptance_rate``, ``optimum``) refuses, and callers that iterate the registry for one
    step skip them.

    Uniform layout, one step: ``uniforms [tree.num_nodes]`` in [0, 1). ``uniforms[v]``,
    v ≥ 1, is node v's own accept decision (u < its probability; each node is decided at most
    once, nodes not looked at leave theirs unused); ``uniforms[0]`` draws the emitted token
    by inverse CDF (``specbound.probability.sample_from``). The root needs no decision.
    Subclasses set ``_verify_tree``, ``_outcome_law`` and ``_stop_probabilities``, and
    ``_check_tree`` for the trees they take.
    """

    per_node: ClassVar[bool] = False

    def verify_tree(self, tree: ScoredTree, uniforms) -> TreeVerdict:
        """Verify one drafted step with the given randomness.  # uniforms [tree.num_nodes]"""
        self._check_tree(tree)
        uniforms = np.asarray(uniforms, dtype=np.float64)
        if uniforms.shape != (tree.num_nodes,) or not np.all((uniforms >= 0) & (uniforms < 1)):
            raise ValueError(f"uniforms: expected {tree.num_nodes} values in [0, 1) (one per node), "
                             f"got shape {uniforms.shape}")
        return self._verify_tree(tree, uniforms)

    def outcome_law(self, tree: ScoredTree) -> np.ndarray:
        """Exact P(last accepted node u, next token y | tree).  # -> [nodes, vocab]"""
        self._check_tree(tree)
        return self._outcome_law(tree)

    def stop_probabilities(self, tree: ScoredTree) -> np.ndarray:
        """Exact P(last accepted node = u | tree), without the [nodes, vocab] law.  # -> [nodes]"""
        self._check_tree(tree)
        return self._stop_probabilities(tree)

    def num_uniforms(self, tree: ScoredTree) -> int:
        """How many uniforms ``verify_tree`` takes for ``tree``: one per node."""
        return tree.num_nodes

    def expected_accepted(self, tree: ScoredTree) -> float:
        """Exact E[accepted drafts | tree] = Σ_u depth(u)·P(last accepted node = u)."""
        stopped = self.stop_probabilities(tree)
        return float(tree.depths @ stopped)

    # -- the single-step API does not apply ---------------------------------------------
    def _check(self, target_probs, draft_probs, draft_tokens=None, num_drafts=None):
        raise ValueError(f"verifier: {self.name!r} decides on a whole drafted tree; "
                         "call verify_tree / outcome_law / expected_accepted with a ScoredTree")

    def optimum(self, target_probs, draft_probs, num_drafts: int):
        raise ValueError(f"verifier: {self.name!r} is compared with the multi-step optimum "
                         "(enumeration.TreeDrafter.lossless_verifier_optimum), not a one-step α*")

    # -- per subclass ---------------------------------------------------------------------
    def _check_tree(self, tree: ScoredTree) -> None:
        if not isinstance(tree, ScoredTree):
            raise ValueError(f"tree: expected a ScoredTree, got {type(tree).__name__}")

    def _verify_tree(self, tree: ScoredTree, uniforms: np.ndarray) -> TreeVerdict:
        raise NotImplementedError

    def _outcome_law(self, tree: ScoredTree) -> np.ndarray:
        raise NotImplementedError

    def _stop_probabilities(self, tree: ScoredTree) -> np.ndarray:
        return self._outcome_law(tree).sum(axis=1)


def emit_from(weights: np.ndarray, uniform: float) -> int:
    """The emitted token: inverse CDF on one row of non-negative weights.  # [vocab] -> int"""
    return int(sample_from(weights[None, :], np.array([uniform]))[0])


# -- token-level verification, top-down (SPEC.md §6) ---------------------------------------
NodeVerifiers = Union[Verifier, Callable[[int, int], Verifier]]  # one verifier, or (depth, num_drafts) -> verifier


def _tokenwise_walk(tree: ScoredTree, verifiers: NodeVerifiers) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """P(the walk reaches v) per node, and the output law π(·|draws at v) per internal node.
    A node's verifier is ``verifiers.for_num_drafts(its number of draws)`` (SPEC.md §6), or
    ``verifiers(depth, number of draws)`` — a method's verifier per depth, e.g. batch SD's
    RRS at the root and speculative sampling below."""
    def verifier_at(depth: int, num_drafts: int) -> Verifier:
        if isinstance(verifiers, Verifier):
            return verifiers.for_num_drafts(num_drafts)
        return verifiers(depth, num_drafts)

    reach = np.zeros(tree.num_nodes)
    reach[0] = 1.0
    laws = {}
    for node, draws in sorted(tree.draft_tokens.items()):  # parents precede children
        verifier = verifier_at(int(tree.depths[node]), len(draws))
        if not verifier.per_node:
            raise ValueError(f"verifier: {verifier.name!r} decides on a whole tree; token-wise verification "
                             "needs a per-node verifier")
        if len(draws) > 1 and verifier.scheme != tree.draft_scheme:
            raise ValueError(f"verifier: {verifier.name!r} verifies {verifier.scheme} drafts, "
                             f"the tree was drafted {tree.draft_scheme}")
        laws[node] = verifier.output_law(tree.target_probs[node], tree.draft_probs[node], [draws])[0]
        for child in tree.children(node):
            reach[child] = reach[node] * laws[node][tree.tokens[child]]
    return reach, laws


def tokenwise_outcome_law(tree: ScoredTree, verifier: NodeVerifiers) -> np.ndarray:
    """Exact P(last accepted node u, next token y | tree) of token-level verification.
    # -> [nodes, vocab]

    At a reached internal node v, mass reach(v)·π(y|draws at v) flows into the child carrying
    y, or is emitted at v when no child does; a reached leaf emits reach(leaf)·p(·|leaf), the
    bonus token. Lossless when every node's verifier is: a child's subtree is independent of
    the verifier's coin at its parent."""
    reach, laws = _tokenwise_walk(tree, verifier)
    law = reach[:, None] * tree.target_probs
    for node, output in laws.items():
        law[node] = reach[node] * output
        law[node, [tree.tokens[c] for c in tree.children(node)]] = 0.0
    return law


def tokenwise_expected_accepted(tree: ScoredTree, verifier: NodeVerifiers) -> float:
    """Exact E[accepted drafts | tree] of token-level verification with ``verifier`` at every
    node (or ``verifier(depth, num_drafts)``): Σ_{v ≠ root} reach(v), with reach(root) = 1 and
    reach(child c of v) = reach(v)·π(token of c | draws at v).
    Information used: at each node, that node's conditionals only, one node at a time."""
    reach, _ = _tokenwise_walk(tree, verifier)
    return float(reach[1:].sum())
