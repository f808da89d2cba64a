"""Drafters: build the draft tree of one decoding step (SPEC.md §6).

A draft tree's node 0 is the **root**, the last committed token; every other node is a
drafted token. An **internal** node carries the draft law q(·|node's prefix) it was
expanded with and the n draft tokens drawn from exactly that law (in drawn order,
duplicates kept — the verifier sees them all). Duplicate draft tokens share one child
node: the subtree below a child is drafted given that child's token only, independently
of the verifier's randomness, so one shared subtree has the same law as separately
drafted copies and the walk stays lossless; sharing only saves forwards.

Two drafters:
- ``ModelDrafter``: a draft language model; each level of the tree is scored by one
  tree-attention forward and expanded by a draft scheme (SPEC.md §4.1).
- ``PromptLookupDrafter``: copies the continuation of the latest earlier occurrence of
  the context's last n-gram; its draft law is a point mass (deterministic drafts, SPEC.md §6).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specbound.drafts import get_draft_scheme
from specbound.engine.lm import CausalLM
from specbound.engine.processing import PROBS_DTYPE, Processing


@dataclass(frozen=True)
class DraftLevel:
    """How the nodes at one depth are expanded: ``num_drafts`` tokens from ``scheme``."""

    num_drafts: int
    scheme: str


@dataclass
class DraftTree:
    tokens: list[int]  # [nodes]; node 0 is the root (last committed token)
    parents: list[int]  # [nodes]; the root's parent is -1
    depths: list[int]  # [nodes]; the root has depth 0
    children: list[dict[int, int]]  # per node: draft token -> child node
    draft_tokens: dict[int, torch.Tensor] = field(default_factory=dict)  # internal node -> [n]
    draft_probs: dict[int, torch.Tensor] = field(default_factory=dict)  # internal node -> [vocab]
    forward_calls: int = 0  # draft-model forwards spent building the tree

    @classmethod
    def root_only(cls, root_token: int) -> DraftTree:
        return cls(tokens=[root_token], parents=[-1], depths=[0], children=[{}])

    def __len__(self) -> int:
        return len(self.tokens)

    def expand(self, node: int, draft_probs: torch.Tensor, draft_tokens: torch.Tensor) -> list[int]:
        """Record node's draft law and drafts; add one child per distinct token; return
        the new child nodes.  # draft_probs [vocab], draft_tokens [n]"""
        self.draft_probs[node] = draft_probs
        self.draft_tokens[node] = draft_tokens
        new_children = []
        for token in draft_tokens.tolist():
            if token not in self.children[node]:
                self.children[node][token] = len(self.tokens)
                new_children.append(len(self.tokens))
                self.tokens.append(token)
                self.parents.append(node)
                self.depths.append(self.depths[node] + 1)
                self.children.append({})
        return new_children


def draw_drafts(
    level: DraftLevel, draft_probs: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """``level.num_drafts`` tokens from one node's draft law with ``level.scheme``, as many
    as the law allows (``DraftScheme.effective_num_drafts``, ``for_num_drafts``).
    # draft_probs [vocab] -> [num_drafts'] long
    """
    scheme = get_draft_scheme(level.scheme)
    num_drafts = scheme.effective_num_drafts(level.num_drafts, int((draft_probs > 0).sum()))
    return scheme.for_num_drafts(num_drafts).sample_torch(draft_probs[None], num_drafts, generator)[0]


class ModelDrafter:
    """Draft with a small language model, one tree-attention forward per tree level.

    The draft model's cache follows the committed sequence lazily: tokens committed since
    its last forward (at least the last one) are fed at the start of the next tree.
    """

    def __init__(self, lm: CausalLM, processing: Processing):
        self.lm = lm
        self.processing = processing
        self._pending_positions: list[int] = []  # cache positions of the tokens fed last, root last
        self._node_positions: list[int] = []  # cache position of each scored node (0 = root)

    @property
    def vocab_size(self) -> int:
        """Size of the draft probability rows (after dropping vocabulary padding)."""
        return self.processing.vocab_size or self.lm.logits_size

    def reset(self, prompt_ids: list[int]) -> None:
        """Start a sequence: prefill the prompt except its last token."""
        self.lm.reset()
        if len(prompt_ids) > 1:
            self.lm.extend(prompt_ids[:-1], last_only=True)

    def draft(
        self, context: list[int], levels: list[DraftLevel], generator: torch.Generator
    ) -> DraftTree:
        """Draft a tree of depth ``len(levels)`` below the last token of ``context``."""
        tree = DraftTree.root_only(context[-1])
        pending = context[self.lm.committed_length :]
        first = self.lm.length
        parents = [first - 1 + i for i in range(len(pending))]
        logits = self.lm.extend_tree(pending, parents).logits([-1])
        self._pending_positions = list(range(first, first + len(pending)))
        self._node_positions = self._pending_positions[-1:]
        frontier = [0]
        for depth, level in enumerate(levels):
            frontier_probs = self.processing.probs(logits)  # [frontier, vocab]
            new_nodes = []
            for node, draft_probs in zip(frontier, frontier_probs):
                new_nodes += tree.expand(node, draft_probs, draw_drafts(level, draft_probs, generator))
            if depth + 1 == len(levels):
                break
            start = self.lm.length
            logits = self.lm.extend_tree(
                [tree.tokens[node] for node in new_nodes],
                [self._node_positions[tree.parents[node]] for node in new_nodes],
            ).logits()
            self._node_positions += list(range(start, start + len(new_nodes)))
            frontier = new_nodes
        tree.forward_calls = len(levels)
        return tree

    def commit(self, tree: DraftTree, path: list[int]) -> None:
        """Keep the fed tokens and the scored nodes of the accepted ``path`` (the deepest
        level is never scored; it is fed with the next tree)."""
        scored = [self._node_positions[node] for node in path if node < len(self._node_positions)]
        self.lm.commit(self._pending_positions + scored)


class PromptLookupDrafter:
    """Prompt lookup (n-gram copy): find the latest earlier occurrence of the context's
    last n tokens (n from ``max_ngram`` down to ``min_ngram``) and propose the tokens that
    followed it. The proposal is a function of the context, so the draft law at every node
    is a point mass: accept x with probability p(x), else emit from p with x removed
    (SPEC.md §6) — lossless. Chains only; no match means a step without drafts.
    """

    def __init__(self, vocab_size: int, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(
                f"min_ngram, max_ngram: need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}"
            )
        self.vocab_size = vocab_size
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def reset(self, prompt_ids: list[int]) -> None:
        """Nothing to prepare: the drafter reads the context at every step."""

    def propose(self, context: list[int], length: int) -> list[int]:
        """Up to ``length`` tokens that followed the latest earlier copy of the suffix."""
        for ngram in range(min(self.max_ngram, len(context) - 1), self.min_ngram - 1, -1):
            suffix = context[-ngram:]
            for start in range(len(context) - ngram - 1, -1, -1):
                if context[start : start + ngram] == suffix:
                    return context[start + ngram : start + ngram + length]
        return []

    def draft(
        self, context: list[int], levels: list[DraftLevel], generator: torch.Generator
    ) -> DraftTree:
        if any(level.num_drafts != 1 for level in levels):
            raise ValueError(
                "method: prompt lookup proposes a single chain; use a method with one draft "
                "per node (chain, decoding_opt, decoding_uno)"
            )
        tree = DraftTree.root_only(context[-1])
        node = 0
        for token in self.propose(context, len(levels)):
            point_mass = torch.zeros(self.vocab_size, dtype=PROBS_DTYPE)
            point_mass[token] = 1.0
            node = tree.expand(node, point_mass, torch.tensor([token]))[0]
        return tree

    def commit(self, tree: DraftTree, path: list[int]) -> None:
        """Nothing to keep: the drafter has no cache."""
