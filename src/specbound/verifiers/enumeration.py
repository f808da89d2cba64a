"""The exact laws of one drafted step by enumeration, for small vocabularies and depths
(SPEC.md §7.3, §7.4).

p = target, q = draft (SPEC.md §0). A ``TreeDrafter`` drafts a tree (``verifiers.tree.
ScoredTree``) from model callables ``prefix -> [vocab]`` as the engine's drafters do: at a
node with prefix h it makes n draws from q(·|h) under a draft scheme (SPEC.md §4.1), and each
distinct token drawn is a child drafted given itself only (SPEC.md §6). Enumerated here:

- ``TreeDrafter.enumerate``: every drafted tree of positive probability, with it — the
  product over internal nodes of the probability of that node's draw sequence (the scheme's
  ``joint_law``);
- ``SequenceLaws``: a model's law of token sequences, P(z_1..z_L | prefix) =
  Π_k P(z_k | prefix, z_<k), as a dense array ``[vocab] * L``;
- on both, the multi-step optimum's rungs (SPEC.md §7.4): the best lossless verifier of the
  drafted tree and the coupling bound (LPs of ``specbound.bounds.multistep``), and a chain's
  closed form Σ_k Σ_{x_1..x_k} min(P(x_1..x_k), Q(x_1..x_k)).

Exponential in the tree's size (``MAX_ENUMERATED_TREES``): for tests and the studies' ladder
where V and the depth are small; real vocabularies are far beyond it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Sequence, Union

import numpy as np
from scipy import sparse

from specbound.bounds import multistep
from specbound.checks import within_limit
from specbound.drafts import get_draft_scheme
from specbound.verifiers.tree import ScoredTree

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
    def enumerate(self, root_token: int) -> list[tuple[float, ScoredTree]]:
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

    def sample(self, root_token: int, rng: np.random.Generator) -> ScoredTree:
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

    def _build(self, subtree: _Subtree, root: Prefix) -> ScoredTree:
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
        return ScoredTree(
            parents=parents,
            tokens=tokens,
            draft_tokens=draft_tokens,
            draft_scheme=self.draft_scheme,
            draft_probs=np.array([self.draft_probs(h) if v in draft_tokens else np.zeros(vocab)
                                  for v, h in enumerate(prefixes)]),
            target_probs=np.array([self.target_probs(h) for h in prefixes]),
        )

    def expectation(self, root_token: int, statistic: Callable[[ScoredTree], float]) -> float:
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
