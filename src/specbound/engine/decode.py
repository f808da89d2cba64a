"""The decoding loop: draft a tree, score it with one target call, walk it with verifiers.

One step (SPEC.md §6):
1. the drafter builds a draft tree below the last committed token (the root), its depth
   cut so that the step cannot pass ``max_new_tokens``;
2. one target forward scores the target's pending tokens and every tree node (tree
   attention), giving p(·|node) for every node;
3. from the root: run the depth's verifier on (p(·|node), q(·|node), the node's drafts);
   if the emitted token y equals a child, emit it and descend into that child; otherwise
   emit y (a residual token: one rejection) and stop. At a leaf that was reached, emit a
   **bonus** token from p(·|leaf);
4. both caches keep the accepted path and drop the rest of the tree.

Lossless whenever the verifiers are: every emitted token has law p given its prefix, so
the generated sequence has the target's law; stopping at the first EOS and cutting at
``max_new_tokens`` are functions of that sequence, so they keep it exact. All randomness
comes from the ``generator`` argument: same seed, same tokens.

``generate(..., record_target_probs=True)`` also returns, for every emitted token, the
target law it was emitted under, p(· | its prefix) — the row the verifier (or the bonus
draw) used — so a study gets the target's exact distributions along a generation without
a second forward.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

import torch

from specbound.engine.drafters import DraftLevel, DraftTree
from specbound.engine.lm import CausalLM
from specbound.engine.methods import Method
from specbound.engine.processing import Processing, sample_tokens
from specbound.engine.stats import RunStats


class Drafter(Protocol):
    vocab_size: int

    def reset(self, prompt_ids: list[int]) -> None: ...

    def draft(
        self, context: list[int], levels: list[DraftLevel], generator: torch.Generator
    ) -> DraftTree: ...

    def commit(self, tree: DraftTree, path: list[int]) -> None: ...


@dataclass
class Generation:
    tokens: list[int]  # the new tokens, EOS included when it ended the sequence
    finish_reason: str  # "eos" or "length"
    stats: RunStats = field(default_factory=RunStats)
    # with record_target_probs: row i = p(· | prompt, tokens[:i]), the law tokens[i] was
    # emitted under  # [len(tokens), vocab] float32
    target_probs: torch.Tensor | None = None


@dataclass
class StepOutcome:
    path: list[int]  # accepted tree nodes, in depth order
    emitted: list[int]  # their tokens, then the residual or bonus token
    rejected: bool  # ended with a residual token
    target_probs: list[torch.Tensor] = field(default_factory=list)  # [1, vocab] per emitted token


class Decoder:
    """Target model + drafter + the shared logits processing; ``generate`` runs a method."""

    def __init__(
        self,
        target: CausalLM,
        drafter: Drafter | None,
        processing: Processing,
        eos_token_ids=(),
    ):
        self.target = target
        self.drafter = drafter
        self.processing = processing
        self.eos_token_ids = frozenset(int(token) for token in eos_token_ids)
        self.vocab_size = processing.vocab_size or target.logits_size
        if processing.vocab_size is not None and processing.vocab_size > target.logits_size:
            raise ValueError(
                f"vocab_size: {processing.vocab_size} exceeds the target's {target.logits_size} logits"
            )
        if drafter is not None and drafter.vocab_size != self.vocab_size:
            raise ValueError(
                f"drafter: draft vocabulary of {drafter.vocab_size} tokens differs from the "
                f"target's {self.vocab_size}; if the difference is only padding rows, set the "
                "processing's vocab_size to the shared tokenizer size"
            )

    def generate(
        self,
        prompt_ids,
        method: Method,
        max_new_tokens: int,
        generator: torch.Generator,
        record_target_probs: bool = False,
    ) -> Generation:
        """Sample up to ``max_new_tokens`` tokens after ``prompt_ids`` with ``method``;
        ``record_target_probs`` keeps the target law of every emitted token
        (``Generation.target_probs``)."""
        prompt = [int(token) for token in prompt_ids]
        if not prompt:
            raise ValueError("prompt_ids: expected at least one token")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: expected a positive integer, got {max_new_tokens!r}")
        if not isinstance(generator, torch.Generator):
            raise ValueError(f"generator: expected a torch.Generator, got {type(generator).__name__}")
        if method.depth > 0 and self.drafter is None:
            raise ValueError(f"method: {method.name} drafts tokens but the decoder has no drafter")

        stats = RunStats()
        started = time.perf_counter()
        with stats.timed("prefill"):
            self.target.reset()
            if len(prompt) > 1:
                self.target.extend(prompt[:-1], last_only=True)
            if method.depth > 0:
                self.drafter.reset(prompt)
        context, new_tokens, finish_reason = list(prompt), [], "length"
        rows: list[torch.Tensor] = []
        while len(new_tokens) < max_new_tokens:
            depth = min(method.depth, max_new_tokens - len(new_tokens) - 1)
            outcome = self._step(context, method, depth, generator, stats)
            emitted = outcome.emitted[: max_new_tokens - len(new_tokens)]
            for index, token in enumerate(emitted):
                if token in self.eos_token_ids:
                    emitted, finish_reason = emitted[: index + 1], "eos"
                    break
            new_tokens += emitted
            context += emitted
            if record_target_probs:
                rows += outcome.target_probs[: len(emitted)]
            if finish_reason == "eos":
                break
        stats.tokens_generated = len(new_tokens)
        stats.wall_seconds = time.perf_counter() - started
        probs = torch.cat(rows) if record_target_probs else None
        return Generation(new_tokens, finish_reason, stats, probs)

    def _step(self, context, method, depth, generator, stats) -> StepOutcome:
        with stats.timed("draft"):
            if depth > 0:
                tree = self.drafter.draft(context, method.levels(depth), generator)
            else:
                tree = DraftTree.root_only(context[-1])
        with stats.timed("target"):
            pending = context[self.target.committed_length :]
            first = self.target.length
            parents = [first - 1 + i for i in range(len(pending))]
            parents += [first + len(pending) - 1 + parent for parent in tree.parents[1:]]
            scores = self.target.extend_tree(pending + tree.tokens[1:], parents)
        outcome = self._walk(tree, scores, len(pending) - 1, method, generator, stats)
        with stats.timed("target"):
            root = first + len(pending) - 1
            self.target.commit(list(range(first, root + 1)) + [root + node for node in outcome.path])
        if depth > 0:
            with stats.timed("draft"):
                self.drafter.commit(tree, outcome.path)
        stats.steps += 1
        stats.target_calls += 1
        stats.draft_calls += tree.forward_calls
        stats.rejections += int(outcome.rejected)
        stats.accepted_lengths.append(len(outcome.path))
        return outcome

    def _walk(self, tree, scores, root_row, method, generator, stats) -> StepOutcome:
        """Verify from the root down; see the module docstring, step 3. Tree node i is
        row ``root_row + i`` of the target's ``scores``."""
        node, path, emitted, rows = 0, [], [], []
        while True:
            with stats.timed("target"):
                logits = scores.logits(root_row + node)  # [1, logits]
            with stats.timed("verify"):
                target_probs = self.processing.probs(logits)  # [1, vocab]
                rows.append(target_probs)
                if node not in tree.draft_tokens:  # a leaf that was reached: bonus token
                    emitted.append(int(sample_tokens(target_probs, generator)[0]))
                    return StepOutcome(path, emitted, rejected=False, target_probs=rows)
                draft_tokens = tree.draft_tokens[node]  # [n]
                verifier = method.verifier_at(tree.depths[node], draft_tokens.shape[0])
                verdict = verifier.verify_torch(
                    target_probs, tree.draft_probs[node][None], draft_tokens[None], generator
                )
            token = int(verdict.tokens[0])
            emitted.append(token)
            child = tree.children[node].get(token)
            stats.record_position(tree.depths[node], child is not None)
            if child is None:
                return StepOutcome(path, emitted, rejected=True, target_probs=rows)
            path.append(child)
            node = child
