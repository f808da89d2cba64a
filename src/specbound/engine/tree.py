"""The draft tree of one decoding step (SPEC.md §6).

Node 0 is the **root**, the last committed token; every other node is a drafted token.
An **internal** node carries the draft law q(·|node's prefix) it was expanded with and the
drafts drawn from exactly that law (in drawn order, duplicates kept — the verifier sees
them all), with the scheme that drew them. Duplicate draft tokens share one child node:
the subtree below a child is drafted given that child's token only, independently of the
verifier's randomness, so one shared subtree has the same law as separately drafted copies
and the walk stays lossless; sharing only saves forwards.

Each node also keeps its **reach**, the product of the draft probabilities along its path:
the drafter's estimate of how likely verification gets there, which a budgeted tree uses
to decide how many children a node gets before drawing them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specbound.verifiers.tree import ScoredTree, scored_tree


@dataclass
class DraftTree:
    tokens: list[int]  # [nodes]; node 0 is the root (last committed token)
    parents: list[int]  # [nodes]; the root's parent is -1
    depths: list[int]  # [nodes]; the root has depth 0
    children: list[dict[int, int]]  # per node: draft token -> child node
    reach: list[float]  # [nodes]; product of the draft probabilities along the path
    ranks: list[int]  # [nodes]; position of the node's token among its parent's drafts (0 for the root)
    draft_tokens: dict[int, torch.Tensor] = field(default_factory=dict)  # internal node -> [n]
    draft_probs: dict[int, torch.Tensor] = field(default_factory=dict)  # internal node -> [vocab]
    schemes: dict[int, str] = field(default_factory=dict)  # internal node -> draft scheme name
    forward_calls: int = 0  # draft-model forwards spent building the tree
    shared: torch.Tensor | None = None  # [vocab] bool: the tokens its drafter may propose (None: all;
    # a draft with another tokenizer, engine.vocabulary: the shared ones)

    @classmethod
    def root_only(cls, root_token: int) -> DraftTree:
        return cls(tokens=[root_token], parents=[-1], depths=[0], children=[{}], reach=[1.0], ranks=[0])

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def depth(self) -> int:
        return max(self.depths)

    def expand(self, node: int, draft_probs: torch.Tensor, draft_tokens: torch.Tensor, scheme: str) -> list[int]:
        """Record the node's draft law, drafts and scheme; add one child per distinct token;
        return the new child nodes.  # draft_probs [vocab], draft_tokens [n]"""
        self.draft_probs[node] = draft_probs
        self.draft_tokens[node] = draft_tokens
        self.schemes[node] = scheme
        new_children = []
        values = draft_probs[draft_tokens].tolist()
        for rank, (token, value) in enumerate(zip(draft_tokens.tolist(), values)):
            if token not in self.children[node]:
                self.children[node][token] = len(self.tokens)
                new_children.append(len(self.tokens))
                self.tokens.append(token)
                self.parents.append(node)
                self.depths.append(self.depths[node] + 1)
                self.children.append({})
                self.reach.append(self.reach[node] * value)
                self.ranks.append(rank)
        return new_children

    def scored(self, target_rows: torch.Tensor) -> ScoredTree:
        """This step as the verifiers see it (``verifiers.tree.scored_tree``), with the
        target rows of its nodes. Its draft scheme is that of the nodes with several draws
        (one draw is a draw from q under every scheme).  # target_rows [nodes, vocab]"""
        several = [self.schemes[node] for node, drafts in self.draft_tokens.items() if drafts.numel() > 1]
        scheme = several[0] if several else "with_replacement"
        draft_tokens = {node: drafts.cpu() for node, drafts in self.draft_tokens.items()}
        draft_rows = {node: probs.cpu() for node, probs in self.draft_probs.items()}
        return scored_tree(self.parents, self.tokens, draft_tokens, scheme, draft_rows, target_rows.cpu())
