"""What one decoding run measured: counts, acceptance and wall-clock per phase (SPEC.md §6).

Vocabulary: a **step** is one round of draft → one target call → verification. It emits
the accepted draft tokens plus one more token: a **residual** token after a rejection
(the step counts as one rejection) or a **bonus** token from the target at a leaf that
was reached. Prefill forwards over the prompt are not counted as calls; their time is
the ``prefill`` phase.

Phases: ``draft`` (draft forwards, draft processing and sampling, draft cache upkeep),
``target`` (the target forward, its output head at the visited nodes, its cache upkeep),
``verify`` (target logits → probabilities at the visited nodes, the verifier calls, the
bonus draw).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from specbound.engine.optimum import OptimumTally

PHASES = ("prefill", "draft", "target", "verify")


@dataclass
class RunStats:
    tokens_generated: int = 0
    steps: int = 0
    target_calls: int = 0
    draft_calls: int = 0
    rejections: int = 0
    accepted_lengths: list[int] = field(default_factory=list)  # accepted drafts per step
    tree_sizes: list[int] = field(default_factory=list)  # drafted nodes per step
    expected_lengths: list[float] = field(default_factory=list)  # exact E[accepted | tree] per step, if recorded
    attempts_by_position: list[int] = field(default_factory=list)  # verifications at depth k
    accepts_by_position: list[int] = field(default_factory=list)  # ... that descended
    accepts_by_rank: list[list[int]] = field(default_factory=list)  # [depth][rank]: descents into the rank-th draft
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    wall_seconds: float = 0.0
    model_seconds: float = 0.0  # inside the target's and the draft's forwards and heads, prefill excluded
    optimum: OptimumTally = field(default_factory=OptimumTally)  # acceptance and α* per verified position (timed:
    # which positions are computed depends on the clock, so ``to_dict`` leaves it out; ``optimum.summary()`` gives it)

    @contextmanager
    def timed(self, phase: str):
        """Add the wall-clock time of the ``with`` body to ``phase``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - start

    def record_step(self, drafted_nodes: int, draft_calls: int, accepted: int, rejected: bool) -> None:
        """One step: one target call, a tree of ``drafted_nodes`` built by ``draft_calls``
        draft forwards, ``accepted`` drafts kept, ending with a residual token if
        ``rejected`` (else a bonus token)."""
        self.steps += 1
        self.target_calls += 1
        self.draft_calls += draft_calls
        self.rejections += int(rejected)
        self.accepted_lengths.append(accepted)
        self.tree_sizes.append(drafted_nodes)

    def record_position(self, depth: int, accepted: bool, rank: int | None = None) -> None:
        """One verification at ``depth``; ``rank``: position among the node's drafts of the
        child it descended into."""
        while len(self.attempts_by_position) <= depth:
            self.attempts_by_position.append(0)
            self.accepts_by_position.append(0)
            self.accepts_by_rank.append([])
        self.attempts_by_position[depth] += 1
        self.accepts_by_position[depth] += int(accepted)
        if accepted and rank is not None:
            ranks = self.accepts_by_rank[depth]
            ranks.extend([0] * (rank + 1 - len(ranks)))
            ranks[rank] += 1

    def merge(self, other: RunStats) -> RunStats:
        """The statistics of both runs together (e.g. over several prompts)."""
        return RunStats(
            tokens_generated=self.tokens_generated + other.tokens_generated,
            steps=self.steps + other.steps,
            target_calls=self.target_calls + other.target_calls,
            draft_calls=self.draft_calls + other.draft_calls,
            rejections=self.rejections + other.rejections,
            accepted_lengths=self.accepted_lengths + other.accepted_lengths,
            tree_sizes=self.tree_sizes + other.tree_sizes,
            expected_lengths=self.expected_lengths + other.expected_lengths,
            attempts_by_position=_add(self.attempts_by_position, other.attempts_by_position),
            accepts_by_position=_add(self.accepts_by_position, other.accepts_by_position),
            accepts_by_rank=[_add(*pair) for pair in zip(*_padded(self.accepts_by_rank, other.accepts_by_rank))],
            seconds={phase: self.seconds[phase] + other.seconds[phase] for phase in PHASES},
            wall_seconds=self.wall_seconds + other.wall_seconds,
            model_seconds=self.model_seconds + other.model_seconds,
            optimum=self.optimum.merge(other.optimum),
        )

    @property
    def tokens_per_target_call(self) -> float:
        """Emitted tokens (bonus included) per target forward, prefill excluded."""
        return self.tokens_generated / self.target_calls if self.target_calls else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_generated / self.wall_seconds if self.wall_seconds else 0.0

    @property
    def decoding_tokens_per_second(self) -> float:
        """Tokens per second of decoding, the prefill left out (what the planner predicts)."""
        decoding = self.wall_seconds - self.seconds["prefill"]
        return self.tokens_generated / decoding if decoding > 0 else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        """P(the verifier descends | a verification happened at depth k), k = 0, 1, ..."""
        return [
            taken / tried if tried else 0.0
            for tried, taken in zip(self.attempts_by_position, self.accepts_by_position)
        ]

    @property
    def acceptance_rate(self) -> float:
        """Accepted verifications over all verifications (every depth pooled)."""
        tried = sum(self.attempts_by_position)
        return sum(self.accepts_by_position) / tried if tried else 0.0

    @property
    def outside_models(self) -> float:
        """Share of the decoding time (prefill excluded) not spent inside a model: masks,
        processing, sampling, verification, bookkeeping."""
        decoding = self.wall_seconds - self.seconds["prefill"]
        return (decoding - self.model_seconds) / decoding if decoding > 0 else 0.0

    @property
    def accepted_length_histogram(self) -> list[int]:
        """Entry k: number of steps that accepted exactly k draft tokens."""
        histogram = [0] * (max(self.accepted_lengths, default=-1) + 1)
        for length in self.accepted_lengths:
            histogram[length] += 1
        return histogram

    def to_dict(self) -> dict:
        return {
            "tokens_generated": self.tokens_generated,
            "steps": self.steps,
            "target_calls": self.target_calls,
            "draft_calls": self.draft_calls,
            "rejections": self.rejections,
            "tokens_per_target_call": self.tokens_per_target_call,
            "tokens_per_second": self.tokens_per_second,
            "acceptance_rate": self.acceptance_rate,
            "acceptance_by_position": self.acceptance_by_position,
            "accepted_length_histogram": self.accepted_length_histogram,
            "seconds": dict(self.seconds),
            "wall_seconds": self.wall_seconds,
            "model_seconds": self.model_seconds,
            "outside_models": self.outside_models,
        }


def _padded(first: list, second: list) -> tuple[list, list]:
    longest = max(len(first), len(second))
    return first + [[]] * (longest - len(first)), second + [[]] * (longest - len(second))


def _add(first: list[int], second: list[int]) -> list[int]:
    """Element-wise sum of two count lists of possibly different lengths."""
    longest = max(len(first), len(second))
    padded = [counts + [0] * (longest - len(counts)) for counts in (first, second)]
    return [a + b for a, b in zip(*padded)]
