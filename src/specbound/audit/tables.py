"""Bigram tables: language models cheap enough for the thousands of samples that measure the
auditor's power (the test suite and ``benchmarks/audit/bench_audit.py --sections power``).

A bigram model is a table of logits by the last token (``TableModel``): next-token logits
depend on the last token only, so a row costs an index, not a forward. ``TableReference`` is
the auditor's reference over it; ``laws`` its processed next-token laws (one row per last
token), from which the samplers draw in numpy. p = target, q = draft (SPEC.md §0).
"""

from __future__ import annotations

import numpy as np
import torch

from specbound.audit.reference import Reference
from specbound.engine.processing import Processing

VOCAB = 12


class TableModel:
    """Next-token logits by the last token of the context (a bigram model).  # table [vocab, vocab]"""

    def __init__(self, table: torch.Tensor):
        self.table = table

    def logits(self, contexts: list[list[int]]) -> torch.Tensor:
        """# [rows] contexts -> [rows, vocab]"""
        return self.table[[context[-1] for context in contexts]]


def bigram_pair(seed: int = 0, scale: float = 2.0, noise: float = 0.5, flatten: float = 0.5, vocab: int = VOCAB):
    """(target, draft): random logit tables, the draft a noisy copy of the target scaled by
    ``flatten`` (a flatter, weaker draft: acceptance about 0.7 at T = 0.7)."""
    generator = torch.Generator().manual_seed(seed)
    target = scale * torch.randn(vocab, vocab, generator=generator)
    draft = flatten * (target + noise * scale * torch.randn(vocab, vocab, generator=generator))
    return TableModel(target), TableModel(draft)


class TableReference(Reference):
    """The auditor's reference over a ``TableModel``: every row is exact, no rounding."""

    def __init__(self, model: TableModel):
        self.model = model

    @property
    def vocab_size(self) -> int:
        return self.model.table.shape[1]

    @property
    def max_positions(self):
        return None

    def logits(self, prompt_ids, continuation, room: int = 0) -> torch.Tensor:
        context = list(prompt_ids) + list(continuation)
        return self.model.logits([context[: len(prompt_ids) + i] for i in range(len(continuation))])


def laws(model: TableModel, processing: Processing) -> np.ndarray:
    """The processed next-token law after each last token.  # -> [vocab, vocab] float64"""
    table = processing.probs(model.table).double().numpy()
    return table / table.sum(axis=1, keepdims=True)


def draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One token from ``probs`` by inverse CDF.  # [vocab] -> int"""
    return min(int(np.searchsorted(np.cumsum(probs), rng.random(), side="right")), probs.size - 1)


def shifted_sampler(target_laws: np.ndarray, shift: float):
    """At every position, with probability ``shift`` the reference's most likely token, else a
    draw from its law: the mixture moves mass ``shift`` (1 − p_max) onto the top token."""
    def sample(prompt, max_new_tokens, seed):
        rng = np.random.default_rng(seed)
        context = list(prompt)
        for _ in range(max_new_tokens):
            row = target_laws[context[-1]]
            context.append(int(np.argmax(row)) if rng.random() < shift else draw(row, rng))
        return context[len(prompt):]
    return sample


def prompts(count: int, vocab: int = VOCAB, seed: int = 0) -> list[list[int]]:
    """``count`` random prompts of 3 tokens."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, size=3).tolist() for _ in range(count)]
