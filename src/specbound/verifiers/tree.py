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

- ``DraftedTree``: the drafted step, checked; ``DraftedTree.chain`` for a chain,
  ``drafted_tree`` for the engine's plain arrays;
- ``TreeVerifier``: the base class of the verifiers that decide on the whole drafted step
  (``block``, ``traversal``), registered in the one verifier registry with ``per_node = False``;
- ``tokenwise_outcome_law``, ``tokenwise_expected_accepted``: top-down token-level
  verification (SPEC.md §6) with any per-node verifier of the registry, exactly;
- ``TreeDrafter``, ``SequenceLaws``: the law of the drafted tree and the target's law of
  token sequences, enumerated for small vocabularies, and on them the multi-step optimum
  (``specbound.bounds.multistep``).
"""

from __future__ import annotations

import itertools
from dataclasses import InitVar, dataclass, field
from types import MappingProxyType
from typing import Callable, ClassVar, Mapping, NamedTuple, Sequence, Union

import numpy as np
from scipy import sparse

from specbound.bounds import multistep
from specbound.checks import within_limit
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
class DraftedTree:
    """One drafted step with the target and draft conditionals at its nodes (module docstring).

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
    def chain(cls, root_token: int, draft_tokens, target_probs, draft_probs) -> DraftedTree:
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


def drafted_tree(parents, tokens, draft_tokens, draft_scheme: str, draft_rows, target_rows) -> DraftedTree:
    """The ``DraftedTree`` of one engine step, from plain arrays, cheaply (no value checks).
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
    return DraftedTree(parents, tokens, draws, draft_scheme, draft, target, check_rows=False)


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

    def verify_tree(self, tree: DraftedTree, uniforms) -> TreeVerdict:
        """Verify one drafted step with the given randomness.  # uniforms [tree.num_nodes]"""
        self._check_tree(tree)
        uniforms = np.asarray(uniforms, dtype=np.float64)
        if uniforms.shape != (tree.num_nodes,) or not np.all((uniforms >= 0) & (uniforms < 1)):
            raise ValueError(f"uniforms: expected {tree.num_nodes} values in [0, 1) (one per node), "
                             f"got shape {uniforms.shape}")
        return self._verify_tree(tree, uniforms)

    def outcome_law(self, tree: DraftedTree) -> np.ndarray:
        """Exact P(last accepted node u, next token y | tree).  # -> [nodes, vocab]"""
        self._check_tree(tree)
        return self._outcome_law(tree)

    def stop_probabilities(self, tree: DraftedTree) -> np.ndarray:
        """Exact P(last accepted node = u | tree), without the [nodes, vocab] law.  # -> [nodes]"""
        self._check_tree(tree)
        return self._stop_probabilities(tree)

    def num_uniforms(self, tree: DraftedTree) -> int:
        """How many uniforms ``verify_tree`` takes for ``tree``: one per node."""
        return tree.num_nodes

    def expected_accepted(self, tree: DraftedTree) -> float:
        """Exact E[accepted drafts | tree] = Σ_u depth(u)·P(last accepted node = u)."""
        stopped = self.stop_probabilities(tree)
        return float(tree.depths @ stopped)

    # -- the single-step API does not apply ---------------------------------------------
    def _check(self, target_probs, draft_probs, draft_tokens=None, num_drafts=None):
        raise ValueError(f"verifier: {self.name!r} decides on a whole drafted tree; "
                         "call verify_tree / outcome_law / expected_accepted with a DraftedTree")

    def optimum(self, target_probs, draft_probs, num_drafts: int):
        raise ValueError(f"verifier: {self.name!r} is compared with the multi-step optimum "
                         "(TreeDrafter.lossless_verifier_optimum), not a one-step α*")

    # -- per subclass ---------------------------------------------------------------------
    def _check_tree(self, tree: DraftedTree) -> None:
        if not isinstance(tree, DraftedTree):
            raise ValueError(f"tree: expected a DraftedTree, got {type(tree).__name__}")

    def _verify_tree(self, tree: DraftedTree, uniforms: np.ndarray) -> TreeVerdict:
        raise NotImplementedError

    def _outcome_law(self, tree: DraftedTree) -> np.ndarray:
        raise NotImplementedError

    def _stop_probabilities(self, tree: DraftedTree) -> np.ndarray:
        return self._outcome_law(tree).sum(axis=1)


def emit_from(weights: np.ndarray, uniform: float) -> int:
    """The emitted token: inverse CDF on one row of non-negative weights.  # [vocab] -> int"""
    return int(sample_from(weights[None, :], np.array([uniform]))[0])


# -- token-level verification, top-down (SPEC.md §6) ---------------------------------------
NodeVerifiers = Union[Verifier, Callable[[int, int], Verifier]]  # one verifier, or (depth, num_drafts) -> verifier


def _tokenwise_walk(tree: DraftedTree, verifiers: NodeVerifiers) -> tuple[np.ndarray, dict[int, np.ndarray]]:
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


def tokenwise_outcome_law(tree: DraftedTree, verifier: NodeVerifiers) -> np.ndarray:
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


def tokenwise_expected_accepted(tree: DraftedTree, verifier: NodeVerifiers) -> float:
    """Exact E[accepted drafts | tree] of token-level verification with ``verifier`` at every
    node (or ``verifier(depth, num_drafts)``): Σ_{v ≠ root} reach(v), with reach(root) = 1 and
    reach(child c of v) = reach(v)·π(token of c | draws at v).
    Information used: at each node, that node's conditionals only, one node at a time."""
    reach, _ = _tokenwise_walk(tree, verifier)
    return float(reach[1:].sum())


# -- the law of the drafted tree, for small vocabularies -----------------------------------
Prefix = tuple[int, ...]
ProbsFn = Callable[[Prefix], np.ndarray]  # prefix -> [vocab]
Branching = Union[Sequence[int], Callable[[Prefix], int]]
MAX_ENUMERATED_TREES = 200_000
_Subtree = tuple[int, tuple[int, ...], tuple["_Subtree", ...]]  # (token, its draws, child subtrees)


class SequenceLaws:
    """A model's autoregressive law of token sequences, P(z_1..z_L | prefix) =
    Π_k probs(prefix + z_<k)(z_k), as dense arrays ``[vocab] * L``, cached by (prefix, L)."""

    def __init__(self, probs: ProbsFn):
        self.probs = probs
        self._cache: dict[tuple[Prefix, int], np.ndarray] = {}

    def law(self, prefix: Prefix, length: int) -> np.ndarray:
        key = (tuple(prefix), int(length))
        if key not in self._cache:
            self._cache[key] = self._law(*key)
        return self._cache[key]

    def _law(self, prefix: Prefix, length: int) -> np.ndarray:
        if length == 0:
            return np.array(1.0)
        row = np.asarray(self.probs(prefix), dtype=np.float64)
        law = np.zeros((row.shape[0],) * length)
        for token in np.flatnonzero(row > 0):
            law[token] = row[token] * self.law(prefix + (int(token),), length - 1)
        return law


@dataclass(frozen=True)
class TreeDrafter:
    """The drafting side of one step, from model callables ``prefix -> [vocab]`` (a prefix
    starts with the root's token): at a node with prefix h, ``branching`` draws from
    q(·|h) under ``draft_scheme`` (as many as the scheme allows:
    ``DraftScheme.effective_num_drafts``), each distinct token a child drafted given itself
    only. A tree's probability is the product over its internal nodes of the probability of
    that node's draw sequence (the scheme's ``joint_law``).

    branching  draws per node by depth (root = depth 0; nodes past its end are leaves), or a
               callable ``prefix -> number of draws`` (0: a leaf) for token-dependent shapes
    """

    target_probs: ProbsFn
    draft_probs: ProbsFn
    branching: Branching
    draft_scheme: str = "with_replacement"

    def num_draws(self, prefix: Prefix) -> int:
        if callable(self.branching):
            requested = int(self.branching(prefix))
        else:
            depth = len(prefix) - 1
            requested = int(self.branching[depth]) if depth < len(self.branching) else 0
        support = int(np.count_nonzero(np.asarray(self.draft_probs(prefix)) > 0))
        return get_draft_scheme(self.draft_scheme).effective_num_drafts(requested, support) if requested else 0

    # -- the exact law, and sampling -----------------------------------------------------
    def enumerate(self, root_token: int) -> list[tuple[float, DraftedTree]]:
        """Every drafted tree of positive probability, with it (they sum to 1). Exponential in
        the tree's size: tests and the LPs of ``specbound.bounds.multistep`` only."""
        root = (int(root_token),)
        return [(probability, self._build(subtree, root))
                for probability, subtree in self._subtrees(root, {})]

    def _subtrees(self, prefix: Prefix, cache: dict) -> list[tuple[float, _Subtree]]:
        if prefix not in cache:
            num_draws = self.num_draws(prefix)
            if num_draws == 0:
                cache[prefix] = [(1.0, (prefix[-1], (), ()))]
                return cache[prefix]
            scheme = get_draft_scheme(self.draft_scheme).for_num_drafts(num_draws)
            tuples, probabilities = scheme.joint_law(self.draft_probs(prefix), num_draws)
            results = []
            for draws, draws_probability in zip(map(tuple, tuples.tolist()), probabilities):
                options = [self._subtrees(prefix + (token,), cache) for token in dict.fromkeys(draws)]
                for combination in itertools.product(*options):
                    probability = float(draws_probability) * float(np.prod([p for p, _ in combination]))
                    results.append((probability, (prefix[-1], draws, tuple(s for _, s in combination))))
                within_limit("drafted trees", len(results), MAX_ENUMERATED_TREES, "trees",
                             "enumeration is for small vocabularies and depths")
            cache[prefix] = results
        return cache[prefix]

    def sample(self, root_token: int, rng: np.random.Generator) -> DraftedTree:
        """Draft one tree with the scheme's own sampler."""
        root = (int(root_token),)
        return self._build(self._sample_subtree(root, rng), root)

    def _sample_subtree(self, prefix: Prefix, rng: np.random.Generator) -> _Subtree:
        num_draws = self.num_draws(prefix)
        draws: tuple[int, ...] = ()
        if num_draws:
            scheme = get_draft_scheme(self.draft_scheme).for_num_drafts(num_draws)
            draws = tuple(scheme.sample(self.draft_probs(prefix), num_draws, rng)[0].tolist())
        children = tuple(self._sample_subtree(prefix + (token,), rng) for token in dict.fromkeys(draws))
        return (prefix[-1], draws, children)

    def _build(self, subtree: _Subtree, root: Prefix) -> DraftedTree:
        """Number a subtree in preorder and attach every node's conditionals."""
        parents, tokens, prefixes, draft_tokens = [], [], [], {}

        def visit(node: _Subtree, parent: int, prefix: Prefix) -> None:
            index = len(parents)
            token, draws, children = node
            parents.append(parent)
            tokens.append(token)
            prefixes.append(prefix)
            if draws:
                draft_tokens[index] = draws
            for child in children:
                visit(child, index, prefix + (child[0],))

        visit(subtree, -1, root)
        vocab = np.asarray(self.target_probs(root)).shape[0]
        return DraftedTree(
            parents=parents,
            tokens=tokens,
            draft_tokens=draft_tokens,
            draft_scheme=self.draft_scheme,
            draft_probs=np.array([self.draft_probs(h) if v in draft_tokens else np.zeros(vocab)
                                  for v, h in enumerate(prefixes)]),
            target_probs=np.array([self.target_probs(h) for h in prefixes]),
        )

    def expectation(self, root_token: int, statistic: Callable[[DraftedTree], float]) -> float:
        """E over the drafted tree of ``statistic(tree)``, exactly (by enumeration)."""
        return float(sum(probability * statistic(tree) for probability, tree in self.enumerate(root_token)))

    # -- the multi-step optimum (SPEC.md §7.4) --------------------------------------------
    def coupling_optimum(self, root_token: int) -> float:
        """The best coupling of the drafted tree with the target's next d tokens, by the
        expected longest root path that is a prefix of the target's tokens: it bounds every
        lossless verifier of these drafts (``bounds.multistep.coupling_optimum``)."""
        trees = self.enumerate(root_token)
        depth = max(tree.max_depth for _, tree in trees)
        if depth == 0:
            return 0.0
        target_law = SequenceLaws(self.target_probs).law((int(root_token),), depth)
        sequences = np.argwhere(target_law > 0)  # [S, d]
        prefix_lengths = np.array([[tree.longest_root_path(y) for y in sequences] for _, tree in trees])
        return multistep.coupling_optimum(np.array([p for p, _ in trees]), target_law[tuple(sequences.T)],
                                          prefix_lengths)

    def lossless_verifier_optimum(self, root_token: int) -> float:
        """The best expected accepted length of any lossless verifier of the drafted tree
        that emits its accepted path and one token, the target continuing
        (``bounds.multistep.lossless_verifier_optimum``). A variable per (tree t, last
        accepted node u, next token y) with p(y|u) > 0 on a path the target can emit; its
        emitted law over sequences z of length d + 1 is 1[z starts with path(u), y]·
        P_target(rest of z | prefix of u, y)."""
        trees = self.enumerate(root_token)
        length = max(tree.max_depth for _, tree in trees) + 1
        root = (int(root_token),)
        targets = SequenceLaws(self.target_probs)
        target_law = targets.law(root, length)
        sequence_index = np.arange(target_law.size).reshape(target_law.shape)
        rows, columns, values, tree_of, accepted = [], [], [], [], []
        for t, (_, tree) in enumerate(trees):
            for node in range(tree.num_nodes):
                path = tree.path_tokens(node)
                if targets.law(root, len(path))[path] == 0:
                    continue
                for token in np.flatnonzero(tree.target_probs[node] > 0):
                    emitted = path + (int(token),)
                    continuation = targets.law(tree.prefix(node) + (int(token),), length - len(emitted)).ravel()
                    keep = continuation > 0
                    rows.append(sequence_index[emitted].ravel()[keep])
                    columns.append(np.full(int(keep.sum()), len(accepted)))
                    values.append(continuation[keep])
                    tree_of.append(t)
                    accepted.append(tree.depths[node])
        emitted_law = sparse.csr_matrix((np.concatenate(values), (np.concatenate(rows), np.concatenate(columns))),
                                        shape=(target_law.size, len(accepted)))
        return multistep.lossless_verifier_optimum(np.array([p for p, _ in trees]), np.array(tree_of),
                                                   np.array(accepted), emitted_law, target_law.ravel())

    def chain_coupling_optimum(self, root_token: int) -> float:
        """The coupling optimum of a chain drafter in closed form, Σ_k Σ_{x_1..x_k}
        min(P(x_1..x_k), Q(x_1..x_k)) (``bounds.multistep.chain_coupling_optimum``)."""
        if callable(self.branching) or any(int(b) != 1 for b in self.branching):
            raise ValueError("branching: the closed form is for chains, one draw per node at every depth")
        root = (int(root_token),)
        targets, drafts = SequenceLaws(self.target_probs), SequenceLaws(self.draft_probs)
        depths = range(1, len(self.branching) + 1)
        return multistep.chain_coupling_optimum([targets.law(root, k) for k in depths],
                                                [drafts.law(root, k) for k in depths])
