"""Drafters: build the draft tree of one decoding step for every sequence of a batch
(SPEC.md §6; the tree itself: ``engine.tree``).

- ``ModelDrafter``: a draft language model; each depth of the trees of all sequences is
  scored by one tree-attention forward and expanded node by node: the method's shape says
  how many children a node gets (``engine.methods``), the depth's draft scheme draws them
  (SPEC.md §4.1) from the very law later handed to the verifier.
- ``PromptLookupDrafter``: copies the continuation of the latest earlier occurrence of the
  context's last n-gram; its draft law is a point mass (deterministic drafts, SPEC.md §6).
- ``DrafterChoice``: both, each step's trees drafted by the one the step's method names
  (``Method.drafter``), so that ``auto`` can choose between them step by step.

Every sequence draws from its own ``torch.Generator``, in the same order as when it is
decoded alone: a sequence's tokens do not depend on the batch it is in.
"""

from __future__ import annotations

import torch

from specbound.checks import positive_int
from specbound.drafts import get_draft_scheme
from specbound.engine.backends import Entries, LanguageModel
from specbound.engine.methods import Levels
from specbound.engine.precisions import AS_LOADED
from specbound.engine.processing import PROBS_DTYPE, Processing
from specbound.engine.tree import DraftTree


def draw_drafts(scheme_name: str, num_drafts: int, draft_probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``num_drafts`` tokens from one node's draft law with the scheme ``scheme_name``, as
    many as the law allows (``DraftScheme.effective_num_drafts``, ``for_num_drafts``).
    # draft_probs [vocab] -> [num_drafts'] long"""
    scheme = get_draft_scheme(scheme_name)
    count = num_drafts
    if num_drafts > 1 and scheme.needs_distinct_support:  # the support matters only then (a pass over the vocabulary)
        count = scheme.effective_num_drafts(num_drafts, int((draft_probs > 0).sum()))
    return scheme.for_num_drafts(count).sample_torch(draft_probs[None], count, generator)[0]


class ModelDrafter:
    """Draft with a small language model, one tree-attention forward per depth for the
    whole batch. The draft model's cache follows each committed sequence lazily: tokens
    committed since its last forward (at least the last one) are fed at the start of the
    next tree.

    ``variant_for_rows(rows)`` names the variant of the draft model (``CausalLM.variants``:
    the same model at another precision) that runs a forward of that many rows — the one
    measured fastest for it (``engine.planner``); by default ``AS_LOADED``, the model
    itself. Each row is prefilled when the drafter first drafts for it (``reset``)."""

    def __init__(self, lm: LanguageModel, processing: Processing, variant_for_rows=None):
        self.lm = lm
        self.processing = processing
        self.variant_for_rows = variant_for_rows or (lambda rows: AS_LOADED)
        self._fed: list[int] = []  # per row: tokens fed as pending at the start of this step
        self._entries: list[dict[int, int]] = []  # per row: tree node -> pending entry of the draft cache

    @property
    def vocab_size(self) -> int:
        """Size of the draft probability rows (after dropping vocabulary padding)."""
        return self.processing.vocab_size or self.lm.logits_size

    @property
    def language_models(self) -> list:
        return [self.lm]

    def reset(self, prompts: list[list[int]], cells: int | None = None) -> None:
        """Start a batch of sequences (``cells``: the cache entries the batch may need at
        most, as ``CausalLM.reset`` takes it). A row is prefilled when it is first drafted
        for, so a batch that never drafts with the model (``auto`` choosing plain decoding
        or prompt lookup) never runs it."""
        self.lm.reset(len(prompts), cells)

    def draft(self, contexts: list[list[int]], method, depths: list[int], generators: list[torch.Generator],
              processings: list[Processing] | None = None) -> list[DraftTree]:
        """Draft one tree per sequence, at most ``depths[b]`` deep, below the last token of
        ``contexts[b]``, its draft law ``processings[b]``'s (None: the drafter's
        ``processing`` for every row)."""
        trees = [DraftTree.root_only(context[-1]) for context in contexts]
        processings = processings or [self.processing] * len(contexts)
        rows = [b for b, depth in enumerate(depths) if depth > 0]
        self._fed = [0] * len(contexts)
        self._entries = [{} for _ in contexts]
        if not rows:
            return trees
        entries = [Entries([], []) for _ in contexts]
        for b in rows:
            if self.lm.lengths[b] == 0 and len(contexts[b]) > 1:  # first drafted for: its prefill
                self.lm.prefill(b, contexts[b][:-1])
            pending = contexts[b][self.lm.lengths[b]:]
            entries[b] = Entries.chain(pending)
            self._fed[b] = len(pending)
            self._entries[b][0] = len(pending) - 1
        scores = self._score(entries, [[self._fed[b] - 1] if b in rows else [] for b in range(len(contexts))])
        frontier = {b: [0] for b in rows}
        logit_rows = {b: [self._fed[b] - 1] for b in rows}
        for depth in range(max(depths)):
            pairs = [(b, entry) for b in frontier for entry in logit_rows[b]]
            probs = _probs_by_row(scores.logits_of(pairs), [processings[b] for b, _ in pairs])  # [frontier, V]
            offset, grown = 0, {}
            for b, nodes in frontier.items():
                tree = trees[b]
                row_probs = probs[offset : offset + len(nodes)]
                offset += len(nodes)
                counts = method.shape.counts(depth, [tree.reach[node] for node in nodes], row_probs, len(tree) - 1)
                scheme = method.scheme_at(depth)
                new_nodes = []
                for node, draft_probs, count in zip(nodes, row_probs, counts):
                    if count:
                        new_nodes += tree.expand(node, draft_probs, draw_drafts(scheme, count, draft_probs, generators[b]),
                                                 scheme)
                tree.forward_calls = depth + 1
                if new_nodes and depth + 1 < depths[b]:
                    grown[b] = new_nodes
            if not grown:
                break
            entries = [Entries([], []) for _ in contexts]
            for b, new_nodes in grown.items():
                tree, known = trees[b], self._entries[b]
                base = self._fed[b] + len(known) - 1
                entries[b] = Entries([tree.tokens[node] for node in new_nodes],
                                     [known[tree.parents[node]] for node in new_nodes])
                for index, node in enumerate(new_nodes):
                    known[node] = base + index
            scores = self._score(entries)
            frontier = grown
            logit_rows = {b: list(range(len(nodes))) for b, nodes in grown.items()}
        return trees

    def _score(self, entries: list[Entries], outputs=None):
        """One draft forward; ``outputs``: per row, the new entries whose logits are read
        (None: all; the fed tokens before the last one are never read)."""
        return self.lm.score(entries, self.variant_for_rows(sum(len(row.tokens) for row in entries)), outputs)

    def commit(self, trees: list[DraftTree], paths: list[list[int]]) -> None:
        """Keep the fed tokens and the scored nodes of each accepted path (the deepest
        level is never scored; it is fed with the next tree)."""
        kept = []
        for b, path in enumerate(paths):
            scored = [self._entries[b][node] for node in path if node in self._entries[b]]
            kept.append(list(range(self._fed[b])) + scored)
        self.lm.commit(kept)

    def select_rows(self, rows: list[int]) -> None:
        self.lm.select_rows(rows)


def _probs_by_row(logits: torch.Tensor, processings: list[Processing]) -> torch.Tensor:
    """Row i's probabilities by ``processings[i]``; rows that share a processing are
    processed together (every step of ``Processing.probs`` is row by row, so a row's
    probabilities do not depend on the others). # [rows, model_vocab] -> [rows, vocab]"""
    first = processings[0]
    if all(processing == first for processing in processings):
        return first.probs(logits)
    rows_of: dict[Processing, list[int]] = {}
    for row, processing in enumerate(processings):
        rows_of.setdefault(processing, []).append(row)
    parts = {processing: processing.probs(logits[rows]) for processing, rows in rows_of.items()}
    probs = torch.empty((logits.shape[0], parts[first].shape[1]), dtype=PROBS_DTYPE, device=logits.device)
    for processing, rows in rows_of.items():
        probs[rows] = parts[processing]
    return probs


class PromptLookupDrafter:
    """Prompt lookup (n-gram copy): find the latest earlier occurrence of the context's
    last n tokens (n from ``max_ngram`` down to ``min_ngram``) and propose the tokens that
    followed it. The proposal is a function of the context, so the draft law at every node
    is a point mass: accept x with probability p(x), else emit from p with x removed
    (SPEC.md §6) — lossless. Chains only; no match means a step without drafts.
    """

    def __init__(self, vocab_size: int, max_ngram: int = 3, min_ngram: int = 1, device="cpu"):
        positive_int("min_ngram", min_ngram)
        self.device = torch.device(device)
        if not min_ngram <= max_ngram:
            raise ValueError(
                f"min_ngram, max_ngram: need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}"
            )
        self.vocab_size = vocab_size
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    language_models: list = []  # none: the drafts come from the context

    def reset(self, prompts: list[list[int]], cells: int | None = None) -> None:
        """Nothing to prepare: the drafter reads the context at every step."""

    def propose(self, context: list[int], length: int) -> list[int]:
        """Up to ``length`` tokens that followed the latest earlier copy of the suffix."""
        for ngram in range(min(self.max_ngram, len(context) - 1), self.min_ngram - 1, -1):
            suffix = context[-ngram:]
            for start in range(len(context) - ngram - 1, -1, -1):
                if context[start : start + ngram] == suffix:
                    return context[start + ngram : start + ngram + length]
        return []

    def draft(self, contexts, method, depths, generators, processings=None) -> list[DraftTree]:
        """The drafts are point masses whatever the sampling: ``processings`` changes nothing."""
        return [self.draft_one(context, method, depth) for context, depth in zip(contexts, depths)]

    def draft_one(self, context: list[int], method, depth: int) -> DraftTree:
        if depth and not (isinstance(method.shape, Levels) and set(method.shape.branching) == {1}):
            raise ValueError(
                "method: prompt lookup proposes a single chain; use a method with one draft "
                "per node (chain, decoding_opt, decoding_uno)"
            )
        tree = DraftTree.root_only(context[-1])
        node = 0
        for token in self.propose(context, depth):
            point_mass = torch.zeros(self.vocab_size, dtype=PROBS_DTYPE, device=self.device)
            point_mass[token] = 1.0
            node = tree.expand(node, point_mass, torch.tensor([token], device=self.device), "with_replacement")[0]
        return tree

    def commit(self, trees, paths) -> None:
        """Nothing to keep: the drafter has no cache."""

    def select_rows(self, rows: list[int]) -> None:
        """Nothing to drop: the drafter has no cache."""


class DrafterChoice:
    """Several drafters behind one: each step drafts with ``drafters[method.drafter]`` and
    commits to the same one; every drafter starts and drops rows with the batch. A model
    drafter that sat out steps feeds the tokens committed meanwhile with its next tree."""

    def __init__(self, drafters: dict):
        if not drafters:
            raise ValueError("drafters: expected at least one drafter")
        sizes = {drafter.vocab_size for drafter in drafters.values()}
        if len(sizes) != 1:
            raise ValueError(f"drafters: their vocabularies differ ({sorted(sizes)})")
        self.drafters = dict(drafters)
        self.vocab_size = sizes.pop()
        self._last = None

    @property
    def language_models(self) -> list:
        return [lm for drafter in self.drafters.values() for lm in drafter.language_models]

    def reset(self, prompts: list[list[int]], cells: int | None = None) -> None:
        for drafter in self.drafters.values():
            drafter.reset(prompts, cells)
        self._last = None

    def draft(self, contexts, method, depths, generators, processings=None) -> list[DraftTree]:
        if method.drafter not in self.drafters:
            raise ValueError(f"method: {method.name} drafts with {method.drafter!r}; this decoder has "
                             f"{', '.join(self.drafters)}")
        self._last = self.drafters[method.drafter]
        return self._last.draft(contexts, method, depths, generators, processings)

    def commit(self, trees, paths) -> None:
        self._last.commit(trees, paths)

    def select_rows(self, rows: list[int]) -> None:
        for drafter in self.drafters.values():
            drafter.select_rows(rows)
