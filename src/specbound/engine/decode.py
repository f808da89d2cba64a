"""The decoding loop: draft a tree, score it with one target call, verify it.

One step, for every sequence of the batch at once (SPEC.md §6):
1. the drafter builds each sequence's draft tree below its last committed token (the
   root), the depth cut so that the step cannot pass ``max_new_tokens``;
2. one target forward scores every sequence's pending tokens and tree nodes (tree
   attention), giving p(·|node) for every node;
3. per sequence, verification: top-down, at each node the depth's verifier runs on
   (p(·|node), q(·|node), the node's drafts); if the emitted token y equals a child, emit
   it and descend; otherwise emit y (a residual token: one rejection) and stop; at a leaf
   that was reached, emit a **bonus** token from p(·|leaf). A method verified as a whole
   tree (block, traversal) instead hands every node's rows to its tree verifier, which
   returns the accepted path and the next token;
4. both caches keep the accepted path and drop the rest of the tree; sequences that ended
   leave the batch.

Lossless whenever the verifiers are: every emitted token has law p given its prefix, so
the generated sequence has the target's law; stopping at the first EOS and cutting at
``max_new_tokens`` are functions of that sequence, so they keep it exact. All randomness
of a sequence comes from its own ``torch.Generator``, drawn in the same order whatever the
batch: same seed, same tokens, alone or batched.

**Step by step.** ``Decoder.start`` opens a ``Batch``: sequences join it with ``add`` (they
are admitted, their prompts prefilled, at the start of the next ``step``), leave it when
they finish or are ``remove``d (their cache rows freed at once), and ``step`` runs one step
for every sequence in it — what a server's continuous batching needs. ``generate_batch`` is
a loop over it: one decoding path. Since a sequence draws only from its own generator, in
its own order, joining and leaving change no sequence's tokens where the forward is
batch-invariant (float32 torch models; ``engine.backends.llamacpp`` says where it is not).

``record_target_probs=True`` also returns, for every emitted token, the target law it was
emitted under, p(· | its prefix) — the row the verifier (or the bonus draw) used — so a
study gets the target's exact distributions along a generation without a second forward.
``record_expected=True`` records per step the exact expected number of accepted drafts
given the drafted tree (``RunStats.expected_lengths``): averaged over steps it estimates
the accepted length without the sampling noise of the realised counts. It and an
``observer`` see a drafted step through one hook, between steps 2 and 3: the tree and the
target rows of all its nodes (read once, and reused by a whole-tree verifier); neither
draws randomness, so neither changes the tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch

from specbound.checks import positive_int
from specbound.engine.backends import Entries, ForwardScores, LanguageModel
from specbound.engine.methods import Method, Schedule
from specbound.engine.optimum import OptimumRecorder
from specbound.engine.processing import Processing, Sampling, sample_tokens
from specbound.engine.stats import RunStats
from specbound.engine.tree import DraftTree
from specbound.verifiers.tree import ScoredTree, TreeVerifier


class Drafter(Protocol):
    """Builds each step's draft trees. Its ``language_models`` (the models it runs: their
    forward calls and seconds are counted) hold one row per sequence of the batch, in batch
    order; a row may stay empty until the drafter first drafts for it (``ModelDrafter``
    prefills it then), so a sequence joining a running batch is given an empty row in each
    (``Batch``)."""

    vocab_size: int
    language_models: list[LanguageModel]

    def reset(self, prompts: list[list[int]], cells: int | None = None) -> None: ...

    def draft(self, contexts: list[list[int]], method: Method, depths: list[int],
              generators: list[torch.Generator], processings: list[Processing]) -> list[DraftTree]: ...
    # processings: each row's (its sequence's sampling), applied to that row's draft logits

    def commit(self, trees: list[DraftTree], paths: list[list[int]]) -> None: ...

    def select_rows(self, rows: list[int]) -> None: ...


class StepObserver(Protocol):
    """Shown every drafted step of a sequence before it is verified (``generate_batch``'s
    ``observer``): ``index``, the sequence's (its position in ``prompts``, its order of
    joining a ``Batch``), its ``DraftTree`` and the target rows of all its nodes."""

    def __call__(self, index: int, tree: DraftTree, target_rows: torch.Tensor) -> None: ...  # [nodes, vocab]


class Streamer(Protocol):
    """transformers' streamer interface (``TextStreamer`` fits): ``put`` gets the prompt
    once, then the new tokens of every step; ``end`` closes the stream."""

    def put(self, value: torch.Tensor) -> None: ...

    def end(self) -> None: ...


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


@dataclass
class Sequence:
    """One sequence of a batch while it decodes."""

    index: int  # order of joining its batch (for generate_batch: position in the caller's list)
    prompt: list[int]
    max_new_tokens: int
    generator: torch.Generator
    processing: Processing  # its sampling, applied to its target and draft logits alike
    context: list[int] = field(init=False)  # prompt and new tokens
    stats: RunStats = field(default_factory=RunStats)
    new_tokens: list[int] = field(default_factory=list)
    rows: list[torch.Tensor] = field(default_factory=list)
    finish_reason: str = "length"  # "eos", "length", or "removed" (taken out by Batch.remove)
    done: bool = False

    def __post_init__(self):
        self.context = list(self.prompt)

    def emit(self, outcome: StepOutcome, eos_token_ids: frozenset[int], record_target_probs: bool) -> list[int]:
        """Append a step's tokens, up to the first of ``eos_token_ids`` or the length limit;
        return those appended."""
        emitted = outcome.emitted[: self.max_new_tokens - len(self.new_tokens)]
        for index, token in enumerate(emitted):
            if token in eos_token_ids:
                emitted, self.finish_reason = emitted[: index + 1], "eos"
                break
        self.new_tokens += emitted
        self.context += emitted
        if record_target_probs:
            self.rows += outcome.target_probs[: len(emitted)]
        self.done = self.finish_reason == "eos" or len(self.new_tokens) >= self.max_new_tokens
        return emitted

    def cells(self, method) -> int:
        """Cache entries the sequence may need at most (the LMs' ``cells`` hint)."""
        return cells_needed(len(self.prompt), self.max_new_tokens, method)


def cells_needed(prompt_tokens: int, max_new_tokens: int, method: Schedule) -> int:
    """Cache entries a sequence may need at most: its prompt, its new tokens and the
    largest tree ``method`` drafts below them."""
    return prompt_tokens + max_new_tokens + method.max_nodes + 1


@dataclass
class RowStep:
    """One sequence's part of a step. Its row of the target's forward holds the tokens
    committed since the target's last forward (at least the last one), then the tree below
    it: the **root entry** is the last of those tokens, and tree node i is entry
    ``root_entry + i``."""

    row: int  # the sequence's row of the batch: of the caches and of the scores
    sequence: Sequence
    tree: DraftTree
    root_entry: int
    target_rows: torch.Tensor | None = None  # [nodes, vocab] p(·|node) of every node, once read
    _scored: ScoredTree | None = field(default=None, repr=False)

    def entry(self, node: int) -> int:
        return self.root_entry + node

    @property
    def node_entries(self) -> range:
        return range(self.root_entry, self.root_entry + len(self.tree))

    @property
    def has_drafts(self) -> bool:
        return len(self.tree) > 1

    def scored(self) -> ScoredTree:
        """The step as the verifiers see it (``DraftTree.scored``), made once from the
        target rows."""
        if self._scored is None:
            self._scored = self.tree.scored(self.target_rows)
        return self._scored


StepHook = Callable[[RowStep, Method], None]  # what a drafted step saw, before verification


class Decoder:
    """Target model + drafter + the logits processing; ``generate`` and
    ``generate_batch`` run a method, ``start`` opens a ``Batch`` to run it step by step.
    ``processing`` is every sequence's unless ``Batch.add`` gives one its own sampling: a
    sequence's processing is applied to its own target and draft rows, so sequences of
    different sampling settings decode in one batch over the same caches.

    ``batch_heads``: apply the target's output head to every node of a step's tree (of every
    row) in one call right after the target's forward (``Scores.prefetch``), instead of node
    by node as the walk reaches them; a batch of rows always gets its roots in one call. It
    pays where a matrix product of k rows costs about one row's (AVX512-BF16, AMX, a GPU:
    the head, vocabulary × hidden, is read whole by every call), not where the cost is
    linear in rows (AVX2); ``engine.assembly.assemble`` decides it from the measured costs under
    ``auto``."""

    def __init__(self, target: LanguageModel, drafter: Drafter | None, processing: Processing, eos_token_ids=(),
                 batch_heads: bool = False, optimum: OptimumRecorder | None = None):
        self.target = target
        self.batch_heads = batch_heads
        self.drafter = drafter
        self.processing = processing
        self.eos_token_ids = frozenset(int(token) for token in eos_token_ids)
        # each verified position's acceptance and α* (engine.optimum): ``optimum``'s, none without one
        # (``engine.assembly.assemble`` gives the recorder of its ``optimum_budget``)
        self.optimum = optimum if optimum is not None else OptimumRecorder(budget=0.0)
        self.vocab_size = processing.vocab_size or target.logits_size
        if processing.vocab_size is not None and processing.vocab_size > target.logits_size:
            raise ValueError(f"vocab_size: {processing.vocab_size} exceeds the target's {target.logits_size} logits")
        if drafter is not None and drafter.vocab_size != self.vocab_size:
            raise ValueError(
                f"drafter: draft vocabulary of {drafter.vocab_size} tokens differs from the "
                f"target's {self.vocab_size}; if the difference is only padding rows, set the "
                "processing's vocab_size to the shared tokenizer size"
            )

    def generate(self, prompt_ids, method: Schedule, max_new_tokens: int, generator: torch.Generator,
                 record_target_probs: bool = False, record_expected: bool = False,
                 streamer: Streamer | None = None, observer: StepObserver | None = None) -> Generation:
        """Sample up to ``max_new_tokens`` tokens after ``prompt_ids`` with ``method``
        (module docstring); ``streamer`` receives the tokens as they are accepted."""
        return self.generate_batch([prompt_ids], method, max_new_tokens, [generator], record_target_probs,
                                   record_expected, streamer, observer)[0]

    def generate_batch(self, prompts, method: Schedule, max_new_tokens: int, generators,
                       record_target_probs: bool = False, record_expected: bool = False,
                       streamer: Streamer | None = None, observer: StepObserver | None = None) -> list[Generation]:
        """Decode the sequences ``prompts`` together, sequence b drawing its randomness from
        ``generators[b]``: each gets exactly the tokens ``generate`` gives it alone with the
        same generator state. Its ``stats`` hold its own counts; the phase times and the
        wall time are the batch's.

        ``method`` is a ``Schedule``: a fixed ``Method``, or a ``Planner`` (``--method
        auto``) that names the method of every step, re-planning as it learns from the steps
        run.

        ``observer(index, tree, target_rows)``, when given, is called at every step that
        drafted, for sequence ``index`` of ``prompts``, with its ``DraftTree`` and the target
        rows of all its nodes ``[nodes, vocab]`` (node order) — for studies that compare
        verifiers on the same drafted steps; it costs one head and one softmax per node."""
        if not prompts or not all(len(prompt) for prompt in prompts):
            raise ValueError("prompt_ids: expected at least one token per prompt")
        positive_int("max_new_tokens", max_new_tokens)
        if len(generators) != len(prompts):
            raise ValueError(f"generator: expected one torch.Generator per prompt ({len(prompts)})")
        if streamer is not None and len(prompts) != 1:
            raise ValueError("streamer: streams one sequence; use generate")
        batch = self.start(method, record_target_probs, record_expected, observer)
        sequences = [batch.add(prompt, max_new_tokens, generator) for prompt, generator in zip(prompts, generators)]
        if streamer is not None:
            streamer.put(torch.tensor(sequences[0].prompt))
        while batch.sequences:
            for _, emitted in batch.step():
                if streamer is not None and emitted:
                    streamer.put(torch.tensor(emitted))
        if streamer is not None:
            streamer.end()
        return [batch.generation(sequence) for sequence in sequences]

    def start(self, method: Schedule, record_target_probs: bool = False, record_expected: bool = False,
              observer: StepObserver | None = None) -> Batch:
        """An empty ``Batch`` decoding with ``method`` (the options as ``generate_batch``
        takes them); sequences join it with ``Batch.add``. One batch at a time per decoder:
        it owns the decoder's caches."""
        if method.depth > 0 and self.drafter is None:
            raise ValueError(f"method: {method.name} drafts tokens but the decoder has no drafter")
        return Batch(self, method, record_target_probs, record_expected, observer)

    # -- one step ----------------------------------------------------------------------------
    def step(self, active: list[Sequence], method: Method, stats: RunStats,
             saw: StepHook | None = None) -> list[tuple[DraftTree, StepOutcome]]:
        """One speculative step for every sequence of ``active``: the module docstring's
        four steps, in order. ``saw``, when given, is shown every row that drafted, its
        target rows read, after the target call and before verification."""
        depths = [min(method.depth, sequence.max_new_tokens - len(sequence.new_tokens) - 1) for sequence in active]
        trees = self._draft(active, method, depths, stats)
        steps, scores = self._score(active, trees, stats)
        if saw is not None:
            for step in steps:
                if step.has_drafts:
                    self._read_target_rows(step, scores, stats)
                    saw(step, method)
        outcomes = [self._verify(step, scores, method, stats) for step in steps]
        self._commit(steps, outcomes, max(depths) > 0, stats)
        for step, outcome in zip(steps, outcomes):
            step.sequence.stats.record_step(len(step.tree) - 1, step.tree.forward_calls, len(outcome.path),
                                            outcome.rejected)
        return [(step.tree, outcome) for step, outcome in zip(steps, outcomes)]

    def _draft(self, active: list[Sequence], method: Method, depths: list[int], stats: RunStats) -> list[DraftTree]:
        """Step 1: each sequence's draft tree below its last token, at most ``depths[row]``
        deep (the depth that cannot pass its ``max_new_tokens``)."""
        with stats.timed("draft"):
            if max(depths) > 0:
                return self.drafter.draft([sequence.context for sequence in active], method, depths,
                                          [sequence.generator for sequence in active],
                                          [sequence.processing for sequence in active])
            return [DraftTree.root_only(sequence.context[-1]) for sequence in active]

    def _score(self, active: list[Sequence], trees: list[DraftTree],
               stats: RunStats) -> tuple[list[RowStep], ForwardScores]:
        """Step 2: one target forward over every row's pending tokens and tree (tree
        attention: each node sees the committed prefix and its ancestors)."""
        with stats.timed("target"):
            steps, entries = [], []
            for row, (sequence, tree) in enumerate(zip(active, trees)):
                pending = sequence.context[self.target.lengths[row]:]
                step = RowStep(row, sequence, tree, root_entry=len(pending) - 1)
                entries.append(Entries(pending + tree.tokens[1:], [i - 1 for i in range(len(pending))]
                                       + [step.entry(parent) for parent in tree.parents[1:]]))
                steps.append(step)
            scores = self.target.score(entries, outputs=[step.node_entries for step in steps])  # any node may be read
            self._prefetch_heads(scores, steps)
        return steps, scores

    def _prefetch_heads(self, scores: ForwardScores, steps: list[RowStep]) -> None:
        """The head-prefetch policy (class docstring, ``batch_heads``): a batch of rows gets
        the roots every walk starts with in one head call; with ``batch_heads``, every node."""
        if len(steps) > 1 or self.batch_heads:
            nodes = [(step.row, entry) for step in steps for entry in step.node_entries] if self.batch_heads else []
            scores.prefetch([(step.row, step.root_entry) for step in steps] + nodes)

    def _verify(self, step: RowStep, scores: ForwardScores, method: Method, stats: RunStats) -> StepOutcome:
        """Step 3: a whole-tree verifier decides a drafted tree at once; otherwise the walk
        from the root down."""
        if method.tree_verifier is not None and step.has_drafts:
            return self._verify_tree(step, scores, method.tree_verifier, stats)
        return self._walk(step, scores, method, stats)

    def _walk(self, step: RowStep, scores: ForwardScores, method: Method, stats: RunStats) -> StepOutcome:
        """Verify from the root down (module docstring, step 3)."""
        tree, sequence = step.tree, step.sequence
        node, path, emitted, rows = 0, [], [], []
        while True:
            with stats.timed("target"):  # prefetched by _prefetch_heads for batches and batch_heads
                logits = scores.logits(step.row, step.entry(node))  # [1, logits]
            with stats.timed("verify"):
                target_probs = sequence.processing.probs(logits)  # [1, vocab]
                rows.append(target_probs)
                if node not in tree.draft_tokens:  # a leaf that was reached: bonus token
                    emitted.append(int(sample_tokens(target_probs, sequence.generator)[0]))
                    return StepOutcome(path, emitted, rejected=False, target_probs=rows)
                draft_tokens = tree.draft_tokens[node]  # [n]
                verifier = method.verifier_at(tree.depths[node], draft_tokens.shape[0])
                verdict = verifier.verify_torch(target_probs, tree.draft_probs[node][None], draft_tokens[None],
                                                sequence.generator)
                self.optimum.record(sequence.stats.optimum, verifier, target_probs, tree.draft_probs[node][None],
                                    draft_tokens.shape[0], tree.shared)
            token = int(verdict.tokens[0])
            emitted.append(token)
            child = tree.children[node].get(token)
            sequence.stats.record_position(tree.depths[node], child is not None, tree.ranks[child] if child else None)
            if child is None:
                return StepOutcome(path, emitted, rejected=True, target_probs=rows)
            path.append(child)
            node = child

    def _verify_tree(self, step: RowStep, scores: ForwardScores, verifier: TreeVerifier,
                     stats: RunStats) -> StepOutcome:
        """A whole-tree verifier (block, traversal) decides the accepted path at once from
        every node's target row; it draws ``num_uniforms`` float64 uniforms."""
        tree, sequence = step.tree, step.sequence
        target_rows = self._read_target_rows(step, scores, stats)
        with stats.timed("verify"):
            drafted = step.scored()
            uniforms = torch.rand(verifier.num_uniforms(drafted), generator=sequence.generator, dtype=torch.float64,
                                  device=sequence.generator.device)
            node, token = verifier.verify_tree(drafted, uniforms.cpu().numpy())
        path = list(drafted.path_nodes(node))
        for depth, child in enumerate(path):
            sequence.stats.record_position(depth, True, tree.ranks[child])
        rejected = node in tree.draft_tokens  # stopped at a node that had drafts: its token is a residual
        if rejected:
            sequence.stats.record_position(tree.depths[node], False)
        rows = [target_rows[node : node + 1] for node in [0] + path]
        return StepOutcome(path, [tree.tokens[child] for child in path] + [int(token)], rejected, rows)

    def _read_target_rows(self, step: RowStep, scores: ForwardScores, stats: RunStats) -> torch.Tensor:
        """p(·|node) of every node of the step's tree, read once into ``step.target_rows``.
        # -> [nodes, vocab]"""
        if step.target_rows is None:
            with stats.timed("target"):
                logits = scores.logits(step.row, list(step.node_entries))
            with stats.timed("verify"):
                step.target_rows = step.sequence.processing.probs(logits)
        return step.target_rows

    def _commit(self, steps: list[RowStep], outcomes: list[StepOutcome], drafted: bool, stats: RunStats) -> None:
        """Step 4: both caches keep each row's committed tokens, its root and its accepted
        path, and drop the rest of its tree (the drafter's only when it drafted)."""
        with stats.timed("target"):
            self.target.commit([list(range(step.root_entry + 1)) + [step.entry(node) for node in outcome.path]
                                for step, outcome in zip(steps, outcomes)])
        if drafted:
            with stats.timed("draft"):
                self.drafter.commit([step.tree for step in steps], [outcome.path for outcome in outcomes])

    def check_sequence(self, prompt: list[int], max_new_tokens: int, generator: torch.Generator) -> None:
        """Refuse (ValueError naming the argument) a sequence the models cannot decode: no
        prompt, token ids outside the vocabulary, more positions than the model has, a
        generator that is not a ``torch.Generator`` on the models' device."""
        if not prompt:
            raise ValueError("prompt_ids: expected at least one token per prompt")
        positive_int("max_new_tokens", max_new_tokens)
        if not isinstance(generator, torch.Generator):
            raise ValueError("generator: expected one torch.Generator per prompt")
        device = self.target.device
        if generator.device.type != device.type:
            raise ValueError(f"generator: the models run on {device.type}; draw from "
                             f"torch.Generator(device={device.type!r}) so that sampling stays on the device")
        limit = self.target.max_positions
        if limit is not None and len(prompt) + max_new_tokens > limit:
            raise ValueError(
                f"prompt_ids: {len(prompt)} prompt tokens + {max_new_tokens} new tokens exceed the model's {limit} "
                "positions (max_position_embeddings)"
            )
        if max(prompt) >= self.vocab_size or min(prompt) < 0:
            raise ValueError(f"prompt_ids: token ids must lie in [0, {self.vocab_size})")


class Batch:
    """Sequences decoded together, one ``step`` at a time (module docstring, "Step by step").

    ``add`` queues a sequence; the next ``step`` admits every queued one — the first
    admissions into an empty batch reset the caches for them, later ones add a row to each
    (``add_row``), each prompt prefilled alone — then runs one step for every admitted
    sequence. A sequence that ends (EOS, its own ``max_new_tokens``) leaves the batch in the
    step that ended it; ``remove`` takes one out between steps, its cache rows freed at once.
    ``method`` (a ``Schedule``: a fixed ``Method``, or a ``Planner`` that re-plans every few
    of the batch's steps) is the batch's for its life. ``stats`` holds the batch's phase times."""

    def __init__(self, decoder: Decoder, method: Schedule, record_target_probs: bool = False,
                 record_expected: bool = False, observer: StepObserver | None = None):
        self.decoder = decoder
        self.method = method
        self.record_target_probs = record_target_probs
        self.record_expected = record_expected
        self.observer = observer
        self.stats = RunStats()
        self.active: list[Sequence] = []  # the admitted sequences, in cache row order
        self.joining: list[Sequence] = []  # added, admitted at the next step
        self.steps = 0
        self.last_method: Method | None = None  # the method of the last step (the planner's choice under auto)
        self.model_seconds = 0.0  # inside the models during steps (prefill excluded)
        self._drafts = method.depth > 0
        self._added = 0
        self._started = time.perf_counter()

    @property
    def sequences(self) -> list[Sequence]:
        """Every sequence not yet done: admitted, then queued."""
        return self.active + self.joining

    def add(self, prompt_ids, max_new_tokens: int, generator: torch.Generator,
            sampling: Sampling | None = None) -> Sequence:
        """Queue a sequence (checked now: ``Decoder.check_sequence``); it joins at the next
        step. ``sampling``: its own temperature, top-k and top-p, applied to its target and
        draft logits alike (None: the decoder's ``processing``) — sequences of different
        settings share one batch, its caches and its forwards."""
        prompt = [int(token) for token in prompt_ids]
        self.decoder.check_sequence(prompt, max_new_tokens, generator)
        processing = self.decoder.processing if sampling is None else \
            Processing.of(sampling, self.decoder.processing.vocab_size)
        sequence = Sequence(self._added, prompt, max_new_tokens, generator, processing)
        self._added += 1
        self.joining.append(sequence)
        return sequence

    def remove(self, sequence: Sequence) -> None:
        """Take ``sequence`` out of the batch now (between steps); its finish reason becomes
        "removed" unless it had already ended."""
        if not sequence.done:
            sequence.done, sequence.finish_reason = True, "removed"
        if sequence in self.joining:
            self.joining.remove(sequence)
        elif sequence in self.active:
            self._keep([row for row, other in enumerate(self.active) if other is not sequence])

    def step(self) -> list[tuple[Sequence, list[int]]]:
        """Admit the queued sequences, run one step for every admitted one; return each
        one's new tokens (EOS included; cut at its limit). Sequences that ended leave."""
        self._admit()
        if not self.active:
            return []
        decoder = self.decoder
        current = self.method.method_for(self.steps)
        self.last_method = current
        models = self._models()
        model_seconds_before = sum(lm.model_seconds for lm in models)
        saw = self._saw if self.observer is not None or self.record_expected else None
        trees_and_outcomes = decoder.step(self.active, current, self.stats, saw)
        self.model_seconds += sum(lm.model_seconds for lm in models) - model_seconds_before
        if current.depth:
            for tree, outcome in trees_and_outcomes:  # steps that drafted nothing count too (no lookup match)
                self.method.observe(current, tree, outcome.path, outcome.target_probs)
        self.steps += 1
        emitted = [(sequence, sequence.emit(outcome, decoder.eos_token_ids, self.record_target_probs))
                   for sequence, (_, outcome) in zip(self.active, trees_and_outcomes)]
        remaining = [row for row, sequence in enumerate(self.active) if not sequence.done]
        if len(remaining) < len(self.active):
            self._keep(remaining)
        return emitted

    def generation(self, sequence: Sequence) -> Generation:
        """``sequence``'s tokens and statistics: its own counts, the batch's phase times,
        model seconds and wall time so far."""
        stats = sequence.stats
        stats.tokens_generated = len(sequence.new_tokens)
        stats.seconds = dict(self.stats.seconds)
        stats.wall_seconds = time.perf_counter() - self._started
        stats.model_seconds = self.model_seconds
        probs = torch.cat(sequence.rows) if self.record_target_probs and sequence.rows else None
        return Generation(sequence.new_tokens, sequence.finish_reason, stats, probs)

    def _saw(self, step: RowStep, method: Method) -> None:
        """What a drafted step saw before its verification (its tree, every node's target
        row): the one hook of the observer and of the recorded expectations."""
        if self.observer is not None:
            self.observer(step.sequence.index, step.tree, step.target_rows)
        if self.record_expected:
            step.sequence.stats.expected_lengths.append(method.expected_accepted(step.scored()))

    def _models(self) -> list[LanguageModel]:
        return [self.decoder.target] + (self.decoder.drafter.language_models if self._drafts else [])

    def _admit(self) -> None:
        """Give every queued sequence its cache rows: the target's and the drafter's models
        hold each prompt but its last token (the last is fed with the first tree)."""
        if not self.joining:
            return
        joining, self.joining = self.joining, []
        target, drafter = self.decoder.target, self.decoder.drafter
        with self.stats.timed("prefill"):
            if not self.active:
                cells = sum(sequence.cells(self.method) for sequence in joining)
                target.reset(len(joining), cells)
                target.prefill_rows({row: sequence.prompt[:-1] for row, sequence in enumerate(joining)
                                     if len(sequence.prompt) > 1})
                if self._drafts:
                    drafter.reset([sequence.prompt for sequence in joining], cells)
            else:
                for sequence in joining:  # one at a time: each row's cells counted before the next is added
                    row = target.add_row(sequence.cells(self.method))
                    if len(sequence.prompt) > 1:
                        target.prefill_rows({row: sequence.prompt[:-1]})
                    for lm in drafter.language_models if self._drafts else []:
                        lm.add_row(sequence.cells(self.method))  # prefilled when first drafted for
        self.active += joining

    def _keep(self, rows: list[int]) -> None:
        self.decoder.target.select_rows(rows)
        if self._drafts:
            self.decoder.drafter.select_rows(rows)
        self.active = [self.active[row] for row in rows]
