"""The llama.cpp backend: the engine's language-model protocol on llama.cpp's kernels
(llama-cpp-python's low-level API).

A GGUF file runs as it is: ``LlamaCppModel`` loads it once (weights memory-mapped, no
conversion, no bf16 copy) and ``LlamaCppLM`` holds one llama.cpp context of it with the
same batched interface as ``backends.torch.CausalLM`` — reset for a batch, prefill a row, score
entries with parents, read the logits of the entries asked for, commit one path per row,
select rows — so the decoder, the drafters and the planner run on it unchanged.

**Tree attention through sequence membership.** llama.cpp's KV cache stores each token once,
in a cell that belongs to a *set* of sequence ids, and a token of a forward attends to the
cells of its (first) sequence at positions up to its own. So each row b owns a main sequence
holding its committed prefix, positions 0 .. L_b − 1, and every root-to-leaf branch of its
pending entries is one more sequence: the cells of the committed prefix and of a branch's
nodes belong to it, a node shared by several branches belongs to all of theirs. A pending
node then sees exactly its row's committed prefix, its ancestors and itself — at the
position id its parent's plus one — as in ``backends.torch``. A branch that grows below a node
scored in an earlier forward reuses that node's sequence while the node is its tip, else
starts a new sequence holding the node's path (``llama_memory_seq_cp`` up to its position:
membership only, no keys or values are copied).

**Logits only where read.** llama.cpp computes the output head for the entries marked as
outputs, so ``score`` takes, per row, the entries whose logits will be read (None: all) and
``LlamaScores`` holds exactly those rows.

**Shared prompt prefixes.** A batch's prompts (``prefill_rows``) decode a prefix they share
once, as batch entries that belong to the sequence of every row starting with it (a llama.cpp
batch entry may belong to several sequences), and go several rows to a forward; a prompt also
joins the cells of the longest prefix a row outside the call has committed (the same
``llama_memory_seq_cp``). So prompts that start with one chat template's system turn compute it
once per batch. Shared cells were computed in one forward and round as it did (below).

**Rollback.** ``commit`` moves the kept path's cells into the row's main sequence and removes
every branch sequence; a cell that belongs to no sequence is free again.

**Not batch-invariant.** llama.cpp's matrix products tile by the number of rows, so a row
scored inside a k-row forward differs from the same row scored alone by rounding (how much:
``benchmarks/llamacpp/bench_llamacpp_invariance.py``). Verification is exact for
the rows the verification forward computed — the law sampled is the target's as that
forward computes it, as in llama.cpp's own loop — and ``generate_batch`` gives the tokens of
solo runs only where the forward is invariant.

``LlamaCppBackend`` (``BACKEND``) is what the rest of the package knows of it: GGUF files on
the CPU, at their own quantisation, with AMX kernels where this build's pass the probe
(``llamacpp_amx``).
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from specbound.checks import positive_int
from specbound.engine.backends import Backend, BaseLM, Entries, Rounding
from specbound.engine.backends.interrupts import hear_swallowed_interrupts
from specbound.engine.backends.llamacpp_amx import use_extra_buffers
from specbound.engine.machine import file_fingerprint, hardware_key
from specbound.engine.precisions import AS_LOADED

MAX_SEQUENCES = 256  # llama.cpp's LLAMA_MAX_SEQ: sequence ids one context may use
DEFAULT_CONTEXT = 8192  # KV cells of a context (all rows and branches together)
BATCH_TOKENS = 512  # tokens per llama_decode call (longer inputs are split)
CELL_STEP = 256  # llama.cpp rounds a context's cells up to a multiple of this

INSTALL = "pip install 'specbound[llamacpp]'  (builds llama.cpp from source: needs a C compiler and cmake)"

_backend_lock = threading.Lock()
_quiet_log = None  # the log callback, kept alive while llama.cpp holds its pointer
_LOG_ERROR = 4  # ggml_log_level: 1 debug, 2 info, 3 warn, 4 error


def llama_cpp_available() -> bool:
    """Whether llama-cpp-python can be imported here."""
    try:
        import llama_cpp  # noqa: F401
    except (ImportError, OSError):  # OSError: the shared library failed to load
        return False
    return True


def llama_cpp_version() -> str:
    """llama-cpp-python's version (it pins the llama.cpp it was built from)."""
    return getattr(_llama(), "__version__", "unknown")


def _llama():
    """The llama_cpp module, its backend initialised once and its log cut to errors."""
    global _quiet_log
    try:
        import llama_cpp
    except ImportError as error:
        raise ImportError(f"the llama.cpp backend needs llama-cpp-python: {INSTALL}") from error
    with _backend_lock:
        if _quiet_log is None:
            llama_cpp.llama_backend_init()
            _quiet_log = llama_cpp.llama_log_callback(_drop_below_errors)
            llama_cpp.llama_log_set(_quiet_log, ctypes.c_void_p(0))
            hear_swallowed_interrupts()  # a Ctrl-C that lands in the callback
    return llama_cpp


def _drop_below_errors(level: int, text: bytes, user_data) -> None:
    if level == _LOG_ERROR:
        os.write(2, text)



class LlamaCppModel:
    """A GGUF file loaded by llama.cpp (weights memory-mapped), from which ``LlamaCppLM``
    contexts are made. ``threads``: CPU threads of every forward (default: all cores).
    ``extra_buffers``: whether llama.cpp may re-lay the weights in its extra buffer types
    (AMX, repacked layouts), False where this build's AMX kernels fail (``llamacpp_amx``)."""

    def __init__(self, path: str | os.PathLike, threads: int | None = None, fingerprint: str | None = None):
        llama_cpp = _llama()
        self.path = Path(path)
        if not self.path.is_file():
            raise ValueError(f"model: {str(self.path)!r} is not a GGUF file")
        self.threads = positive_int("threads", threads or os.cpu_count() or 1)
        parameters = llama_cpp.llama_model_default_params()
        parameters.n_gpu_layers = 0
        self.extra_buffers = use_extra_buffers()  # not where this build's AMX kernels fail
        parameters.use_extra_bufts = self.extra_buffers
        self._model = llama_cpp.llama_model_load_from_file(str(self.path).encode(), parameters)
        if not self._model:
            raise ValueError(f"model: llama.cpp could not load {str(self.path)!r}")
        vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(vocab))
        self.n_ctx_train = int(llama_cpp.llama_model_n_ctx_train(self._model))
        buffer = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(self._model, buffer, len(buffer))
        self.description = buffer.value.decode(errors="replace")
        self.size_bytes = int(llama_cpp.llama_model_size(self._model))
        self.fingerprint = fingerprint or file_fingerprint(self.path)
        self._scorer: LlamaCppLM | None = None

    def scorer(self) -> LlamaCppLM:
        """The model's context for whole-sequence scoring (``LlamaCppLM.sequence_logits``),
        made on first use and kept: a study scores every unit with one forward, and a new
        context would pay its KV allocation and llama.cpp's graph reservation each time.
        (It holds the model and the model holds it; ``__del__`` frees its context first.)"""
        if self._scorer is None:
            self._scorer = LlamaCppLM(self)
        return self._scorer

    def metadata(self, key: str) -> str | None:
        """The file's metadata value ``key`` as text (llama.cpp's reading of it, already in
        memory: no second parse of the file), None where the file has no such key."""
        llama_cpp = _llama()
        size = 256
        while True:
            buffer = ctypes.create_string_buffer(size)
            length = int(llama_cpp.llama_model_meta_val_str(self._model, key.encode(), buffer, size))
            if length < 0:
                return None
            if length < size:
                return buffer.value.decode(errors="replace")
            size = length + 1

    @property
    def eos_token_ids(self) -> list[int]:
        """The EOS id the file's metadata names (``tokenizer.ggml.eos_token_id``), if any."""
        value = self.metadata("tokenizer.ggml.eos_token_id")
        return [] if value is None else [int(value)]

    def new_context(self, n_ctx: int, n_seq_max: int, n_batch: int, unified: bool = True):
        """A llama.cpp context of this model. ``unified``: one KV store for every sequence
        (``LlamaCppLM``'s: tree branches share their prefix's cells); False: one store of
        n_ctx / n_seq_max cells per sequence, whose attention then spans its own cells only."""
        llama_cpp = _llama()
        parameters = llama_cpp.llama_context_default_params()
        parameters.n_ctx = n_ctx
        parameters.n_batch = n_batch
        parameters.n_ubatch = n_batch
        parameters.n_seq_max = n_seq_max
        parameters.n_outputs_max = max(n_batch, n_seq_max)  # llama.cpp reserves an output per sequence
        parameters.n_threads = self.threads
        parameters.n_threads_batch = self.threads
        parameters.kv_unified = unified
        parameters.no_perf = True
        context = llama_cpp.llama_init_from_model(self._model, parameters)
        if not context:
            raise MemoryError(f"llama.cpp could not create a context of {n_ctx} cells for {self.path.name}")
        return context

    def __del__(self):
        scorer = getattr(self, "_scorer", None)
        if scorer is not None:  # its context before the model it was made from
            scorer.close()
        model = getattr(self, "_model", None)
        if model:
            try:
                _llama().llama_model_free(model)
            except Exception:  # interpreter shutdown
                pass
            self._model = None


@dataclass
class _Node:
    """A pending entry of one row: its parent (−1: the committed tip), position id, and
    the sequences whose branches pass through it (the first one masks its attention)."""

    token: int
    parent: int
    position: int
    sequences: list[int]
    is_tip: bool = True  # a leaf whose sequence no later branch has taken: the next branch below it may


@dataclass
class _Row:
    sequence: int  # the main sequence: the committed prefix
    committed: list[int] = field(default_factory=list)  # its tokens (to replay them into a larger context)
    pending: list[_Node] = field(default_factory=list)
    branches: list[int] = field(default_factory=list)  # sequences of pending branches, the main one excepted
    main_open: bool = True  # no pending branch has taken the main sequence yet


class LlamaScores:
    """Logits of the entries of one forward that were asked for (``score(outputs=)``).
    Entry (row, i) is the row's i-th new entry of that forward."""

    def __init__(self, logits: torch.Tensor, index: dict[tuple[int, int], int], counts: list[int]):
        self._logits = logits  # [outputs, vocab] float32
        self._index = index  # (row, entry) -> output row
        self.counts = counts

    def prefetch(self, pairs) -> None:
        """Nothing to do: llama.cpp applied the head in the forward."""

    def logits(self, row: int = 0, entries=None) -> torch.Tensor:
        """Logits of ``entries`` of ``row`` (an index, a list of them, a slice; None = all).
        # -> [k, vocab] float32"""
        if entries is None or isinstance(entries, slice):
            wanted = list(range(self.counts[row]))[entries or slice(None)]
        elif isinstance(entries, (list, tuple)) or (torch.is_tensor(entries) and entries.dim() > 0):
            wanted = [int(entry) for entry in entries]
        else:
            wanted = [int(entries)]
        return self.logits_of([(row, entry) for entry in wanted])

    def logits_of(self, pairs) -> torch.Tensor:
        """Logits of (row, entry) pairs.  # -> [k, vocab]"""
        try:
            rows = [self._index[pair] for pair in pairs]
        except KeyError as error:
            raise ValueError(f"entries: {error.args[0]} was not asked for as an output of this forward") from None
        if rows and rows == list(range(rows[0], rows[0] + len(rows))):
            return self._logits[rows[0]: rows[0] + len(rows)]  # a view (the readers never write to logits): no copy
        return self._logits[rows]


class LlamaCppLM(BaseLM):
    """One llama.cpp context of ``model`` with the batched interface of ``backends.torch.CausalLM``
    (module docstring). ``context_cells``: KV cells shared by every row and branch, rounded
    up to llama.cpp's step of 256; a larger context is made when ``reset`` or ``add_row`` is
    told the batch needs more.
    ``forward_calls`` and ``model_seconds`` count as ``CausalLM``'s do; ``prefill_progress``,
    as ``CausalLM``'s, is told the tokens done after each ``batch_tokens`` of a longer
    prefill."""

    device = torch.device("cpu")

    def __init__(self, model: LlamaCppModel, context_cells: int = DEFAULT_CONTEXT, batch_tokens: int = BATCH_TOKENS):
        self.model = model
        self._llama = _llama()
        self._cells = positive_int("context_cells", context_cells)
        self._batch_tokens = positive_int("batch_tokens", batch_tokens)
        self.prefill_progress: Callable[[int, int], None] | None = None
        self._context = None
        self._open_context(self._cells)
        self.reset()

    def _open_context(self, cells: int) -> None:
        if self._context:
            self._llama.llama_batch_free(self._batch)
            self._llama.llama_free(self._context)
        cells = -(-max(cells, CELL_STEP) // CELL_STEP) * CELL_STEP  # llama.cpp pads its context to CELL_STEP
        self._batch_tokens = min(self._batch_tokens, cells)
        self._context = self.model.new_context(cells, MAX_SEQUENCES, self._batch_tokens)
        self._cells = cells
        self._memory = self._llama.llama_get_memory(self._context)
        self._batch = self._llama.llama_batch_init(self._batch_tokens, 0, MAX_SEQUENCES)

    def close(self) -> None:
        """Free the context (the object is unusable after)."""
        context = getattr(self, "_context", None)
        if context:
            self._context = None
            try:
                self._llama.llama_batch_free(self._batch)
                self._llama.llama_free(context)
            except Exception:  # interpreter shutdown
                pass

    def __del__(self):
        self.close()

    @property
    def logits_size(self) -> int:
        return self.model.n_vocab

    @property
    def max_positions(self) -> int | None:
        return self.model.n_ctx_train or None

    @property
    def lengths(self) -> list[int]:
        return [len(row.committed) for row in self._rows]

    def pending_parents(self, row: int) -> list[int]:
        return [node.parent for node in self._rows[row].pending]

    def reset(self, batch_size: int = 1, cells: int | None = None) -> None:
        """Forget everything: an empty cache for ``batch_size`` rows. ``cells``: the KV
        entries the batch may hold at most; a context too small for them is replaced by
        one twice as large or as large as needed (the cache is empty, nothing is lost)."""
        self.batch_size = positive_int("batch_size", batch_size)
        if self.batch_size >= MAX_SEQUENCES:
            raise ValueError(f"batch_size: llama.cpp holds at most {MAX_SEQUENCES} sequences, {batch_size} rows asked")
        if cells is not None and cells > self._cells:
            self._open_context(max(cells, 2 * self._cells))
        self._llama.llama_memory_clear(self._memory, True)
        self._rows = [_Row(sequence) for sequence in range(self.batch_size)]
        self._free = list(range(MAX_SEQUENCES - 1, self.batch_size - 1, -1))  # popped from the end: lowest first
        self.forward_calls = 0
        self.model_seconds = 0.0

    # -- the batched interface ----------------------------------------------------------------
    def prefill(self, row: int, token_ids, last_only: bool = True, last: int | None = None) -> torch.Tensor:
        """Commit ``token_ids`` as the whole prefix of the empty row ``row``; return the
        next-token logits of the last token (all tokens with ``last_only=False``, the last
        ``last`` when given). The longest prefix it shares with another row's committed
        tokens (a chat template's system turn, say), up to the first token whose logits are
        read, joins that row's cells (``llama_memory_seq_cp``: membership, no copy) instead
        of being computed again; the rest is decoded.  # -> [1 | n | last, vocab] float32"""
        tokens = self.checked_tokens(token_ids).tolist()
        count = len(tokens)
        first_read = max(0, count - (last if last is not None else 1 if last_only else count))
        pieces = self._commit_prompts({row: tokens}, first_read)
        return torch.cat([piece for piece in pieces if piece.shape[0]])

    def prefill_rows(self, prompts: dict[int, list[int]]) -> None:
        """Commit each prompt of ``prompts`` (row -> tokens) as the whole prefix of its empty
        row; no logits (the decoder feeds a prompt's last token with its first tree). A
        prefix the prompts share is decoded once: each token of it is one entry of the
        forward, a member of the sequences of every row whose prompt starts with it (a
        llama.cpp batch entry may belong to several sequences); a row's prefix that a row
        outside the call has committed joins that row's cells (``prefill``). The entries go
        in forwards of up to ``batch_tokens``, several rows to a forward, every entry after
        the entries it attends to."""
        self._commit_prompts({row: self.checked_tokens(tokens).tolist() for row, tokens in prompts.items()})

    def _commit_prompts(self, tokens_of: dict[int, list[int]], first_read: int | None = None) -> list[torch.Tensor]:
        """``prefill_rows`` of checked prompts; with ``first_read`` (one prompt) the logits of
        its tokens from that place on, which no joined prefix reaches. # -> [[outputs, vocab]]"""
        for row in tokens_of:
            if self._rows[row].committed or self._rows[row].pending:
                raise ValueError(f"prefill: row {row} is not empty")
        self._room_for(sum(len(tokens) for tokens in tokens_of.values()))
        items, index_of = [], {}  # [token, position, sequences, read]; (the entry before, token) -> its index
        for row, tokens in tokens_of.items():
            sequence = self._rows[row].sequence
            reads_from = len(tokens) if first_read is None else first_read
            source, shared = self._longest_shared_prefix(tokens, reads_from)
            if shared:
                self._llama.llama_memory_seq_cp(self._memory, source, sequence, 0, shared)
            before = ("joined", source, shared)
            for position in range(shared, len(tokens)):
                key = (before, tokens[position])
                if key not in index_of:
                    index_of[key] = len(items)
                    items.append((tokens[position], position, [], position >= reads_from))
                items[index_of[key]][2].append(sequence)
                before = index_of[key]
        started = time.perf_counter()
        pieces = []
        for start in range(0, len(items), self._batch_tokens):
            chunk = items[start: start + self._batch_tokens]
            pieces.append(self._decode([(token, position, tuple(sequences), read)
                                        for token, position, sequences, read in chunk]))
            if self.prefill_progress is not None and len(items) > self._batch_tokens:
                self.prefill_progress(start + len(chunk), len(items))
        self.model_seconds += time.perf_counter() - started
        if items:  # none where every prompt joined a committed prefix whole
            self.forward_calls += 1
        for row, tokens in tokens_of.items():
            self._rows[row].committed = tokens
        return pieces

    def _longest_shared_prefix(self, tokens: list[int], limit: int) -> tuple[int, int]:
        """(main sequence, length) of the row whose committed tokens share the longest prefix
        with ``tokens``, at most ``limit`` long; (−1, 0) where none shares a token."""
        best = (-1, 0)
        for state in self._rows:
            committed = state.committed
            length, most = 0, min(limit, len(committed))
            while length < most and committed[length] == tokens[length]:
                length += 1
            if length > best[1]:
                best = (state.sequence, length)
        return best

    def score(self, entries: list[Entries], variant: str = AS_LOADED, outputs=None) -> LlamaScores:
        """One forward over every row's new entries (``entries[b]`` for row b); they stay
        pending until ``commit``. ``outputs[b]``: the new entries of row b whose logits will
        be read (None: all of every row's). The file runs as it is: ``variant`` is
        ``AS_LOADED``."""
        if variant != AS_LOADED:
            raise ValueError(f"variant: the llama.cpp backend has no variant {variant!r}")
        counts = self.check_entries(entries)  # everything checked before anything changes
        needed = sum(self._new_sequences(state, row.parents) for state, row in zip(self._rows, entries))
        if needed > len(self._free):
            raise ValueError(f"entries: the trees of this forward need {needed} new branches; llama.cpp holds "
                             f"{MAX_SEQUENCES} sequences in all ({len(self._free)} free): a smaller tree or batch")
        self._room_for(sum(counts))
        items, index = [], {}
        for b, row in enumerate(entries):
            wanted = set(range(counts[b])) if outputs is None or outputs[b] is None else set(outputs[b])
            for entry, (token, sequences, position) in enumerate(self._place(b, row)):
                if entry in wanted:
                    index[b, entry] = len(index)
                items.append((token, position, sequences, entry in wanted))
        started = time.perf_counter()
        pieces = [self._decode(items[start: start + self._batch_tokens])
                  for start in range(0, len(items), self._batch_tokens)]
        self.model_seconds += time.perf_counter() - started
        self.forward_calls += 1
        return LlamaScores(pieces[0] if len(pieces) == 1 else torch.cat(pieces), index, counts)

    def commit(self, paths: list[list[int]]) -> None:
        """Keep, per row, the pending entries ``paths[b]`` (a chain below the committed
        prefix) as committed and drop every other pending entry; an empty path rolls the
        row back to its committed prefix."""
        self.check_paths(paths)
        llama = self._llama
        for state, path in zip(self._rows, paths):
            length = len(state.committed)
            if path:
                last = state.pending[path[-1]]
                keeper = last.sequences[0]
                if keeper == state.sequence:
                    llama.llama_memory_seq_rm(self._memory, state.sequence, last.position + 1, -1)
                else:
                    llama.llama_memory_seq_rm(self._memory, state.sequence, length, -1)
                    llama.llama_memory_seq_cp(self._memory, keeper, state.sequence, length, last.position + 1)
            elif state.pending:
                llama.llama_memory_seq_rm(self._memory, state.sequence, length, -1)
            for sequence in state.branches:
                llama.llama_memory_seq_rm(self._memory, sequence, -1, -1)
                self._free.append(sequence)
            state.committed = state.committed + [state.pending[entry].token for entry in path]
            state.pending, state.branches, state.main_open = [], [], True

    def select_rows(self, rows: list[int]) -> None:
        """Keep only the rows ``rows`` (in that order); the others leave the batch."""
        self.check_nothing_pending("select_rows", rows)
        kept = set(rows)
        for b, state in enumerate(self._rows):
            if b not in kept:
                for sequence in [state.sequence] + state.branches:
                    self._llama.llama_memory_seq_rm(self._memory, sequence, -1, -1)
                    self._free.append(sequence)
        self._rows = [self._rows[row] for row in rows]
        self.batch_size = len(rows)

    def sequence_logits(self, token_ids, last: int) -> torch.Tensor:
        """Next-token logits at the last ``last`` positions of one forward over ``token_ids``
        alone (the cache reset for it): the full forward a study scores a sequence with.
        # -> [last, vocab] float32"""
        tokens = self.checked_tokens(token_ids).tolist()
        self.reset(1, cells=len(tokens))
        logits = self.prefill(0, tokens, last=last)
        self.reset(1)
        return logits

    def add_row(self, cells: int | None = None) -> int:
        """Append an empty row (a sequence joining between steps) and return its index;
        ``prefill`` fills it. ``cells``: the entries the row may hold at most; a context too
        small for every row's is replaced by a larger one into which the committed rows are
        replayed (rounding may differ from their first forwards: llama.cpp is not
        batch-invariant)."""
        self.check_nothing_pending("add_row")
        if not self._free or len(self._rows) + 1 >= MAX_SEQUENCES:
            raise ValueError(f"add_row: llama.cpp holds at most {MAX_SEQUENCES} sequences")
        needed = sum(len(row.committed) for row in self._rows) + (cells or 0)
        if needed > self._cells:
            self._replay_into(max(needed, 2 * self._cells))
        self._rows.append(_Row(self._free.pop()))
        self.batch_size += 1
        return self.batch_size - 1

    def _replay_into(self, cells: int) -> None:
        """A context of ``cells`` cells holding every row's committed tokens again."""
        rows = self._rows
        self._open_context(cells)
        for state in rows:
            tokens = state.committed
            for start in range(0, len(tokens), self._batch_tokens):
                self._decode([(tokens[i], i, (state.sequence,), False)
                              for i in range(start, min(len(tokens), start + self._batch_tokens))])

    # -- internals ---------------------------------------------------------------------------
    def _place(self, b: int, entries: Entries):
        """Give row b's new entries positions and sequences (module docstring); yields
        (token, sequences, position) per entry, in order."""
        state = self._rows[b]
        known = len(state.pending)
        parents = entries.parents
        children = [[] for _ in parents]
        for index, parent in enumerate(parents):
            if parent >= known:
                children[parent - known].append(index)
        leaves_below = [[] for _ in parents]
        for index in range(len(parents) - 1, -1, -1):
            leaves_below[index] = [index] if not children[index] else [
                leaf for child in children[index] for leaf in leaves_below[child]]
        leaf_sequence = {}
        for index, parent in enumerate(parents):
            if parent >= known:
                continue  # inside this forward: its branches come from its attach point
            attach = state.pending[parent] if parent >= 0 else None
            position = len(state.committed) if attach is None else attach.position + 1
            for leaf in leaves_below[index]:
                leaf_sequence[leaf] = self._branch_from(state, attach, position)
        nodes = []
        for index, (token, parent) in enumerate(zip(entries.tokens, parents)):
            position = len(state.committed) if parent < 0 else (
                state.pending[parent].position + 1 if parent < known else nodes[parent - known].position + 1)
            node = _Node(int(token), parent, position, [leaf_sequence[leaf] for leaf in leaves_below[index]],
                         is_tip=not children[index])
            nodes.append(node)
            yield int(token), node.sequences, position
        state.pending += nodes

    @staticmethod
    def _new_sequences(state: _Row, parents: list[int]) -> int:
        """Sequences ``_place`` will take from the free ones for new entries with these
        parents: one per new leaf, less one per attach point whose own sequence continues."""
        known = len(state.pending)
        has_child = [False] * len(parents)
        for parent in parents:
            if parent >= known:
                has_child[parent - known] = True
        attach_points = {parent for parent in parents if parent < known}
        reused = sum(state.main_open if point < 0 else state.pending[point].is_tip for point in attach_points)
        return sum(not flag for flag in has_child) - reused

    def _branch_from(self, state: _Row, attach: _Node | None, position: int) -> int:
        """A sequence for a new branch below ``attach`` (None: the committed tip) whose
        next position is ``position``: the attach point's own while it is its tip, else a
        new one holding the attach point's path."""
        if attach is None:
            if state.main_open:
                state.main_open = False
                return state.sequence
            source = state.sequence
        else:
            if attach.is_tip:
                attach.is_tip = False
                return attach.sequences[0]
            source = attach.sequences[0]
        sequence = self._free.pop()
        self._llama.llama_memory_seq_cp(self._memory, source, sequence, 0, position)
        state.branches.append(sequence)
        return sequence

    def _decode(self, items) -> torch.Tensor:
        """One llama_decode of (token, position, sequences, wants logits) items; returns
        the logits of the items that want them, in order.  # -> [outputs, vocab]"""
        llama, batch = self._llama, self._batch
        for i, (token, position, sequences, output) in enumerate(items):
            batch.token[i] = token
            batch.pos[i] = position
            batch.n_seq_id[i] = len(sequences)
            slots = batch.seq_id[i]
            for j, sequence in enumerate(sequences):
                slots[j] = sequence
            batch.logits[i] = output
        batch.n_tokens = len(items)
        status = llama.llama_decode(self._context, batch)
        if status != 0:
            raise RuntimeError(f"llama_decode failed with status {status} ({len(items)} tokens; "
                               f"{'no KV cell free' if status == 1 else 'see the llama.cpp error above'})")
        outputs = sum(1 for item in items if item[3])
        if not outputs:
            return torch.empty((0, self.logits_size), dtype=torch.float32)
        pointer = llama.llama_get_logits(self._context)
        logits = np.ctypeslib.as_array(pointer, shape=(outputs, self.logits_size))
        return torch.from_numpy(logits.copy())

    def _room_for(self, new_tokens: int) -> None:
        used = sum(len(row.committed) + len(row.pending) for row in self._rows)
        if used + new_tokens > self._cells:
            raise ValueError(f"entries: {used} cached tokens + {new_tokens} new exceed the context's {self._cells} "
                             "KV cells (reset the model with the cells the batch needs)")


class LlamaCppBackend(Backend):
    """GGUF files as they are on llama.cpp's CPU kernels: one precision (the file's own
    types), no twins, a context of the file's training length."""

    name = "llama.cpp"
    rounding = Rounding(mean_tv=0.015, row_tv=0.1, score_drift=0.04, score_variance=0.05)  # Q4_K_M: 0.0092, 0.079,
    # 0.0255, 0.0151 measured
    install = INSTALL
    missing = ("llama-cpp-python is not installed. llama.cpp's kernels run these GGUF files as they are, at their own "
               "quantisation, where torch decodes a dequantised copy, and are usually faster on a CPU (the README's "
               f"speed tables); install it with {INSTALL}")

    def available(self) -> bool:
        return llama_cpp_available()

    def refusal(self, not_gguf: list[str], device: str) -> str | None:
        if not_gguf:
            return f"llama.cpp runs GGUF files; {', '.join(not_gguf)} is not one (use --backend torch)"
        if str(device) != "cpu":
            return f"this llama.cpp build runs on the CPU, not {device} (use --backend torch)"
        return None

    def holds(self, model) -> bool:
        return isinstance(model, LlamaCppModel)

    def load(self, source, files, dtype=None, threads: int | None = None, tokenizer: bool = True) -> tuple:
        """The GGUF file as it is (memory-mapped), ``threads`` per forward (default all cores),
        with the tokenizer transformers reads from the file (the torch backend's token ids);
        ``dtype`` does not apply."""
        path, sha256 = files.gguf(source)
        model = LlamaCppModel(path, threads, fingerprint=sha256[:16])
        return model, files.gguf_tokenizer(path, sha256) if tokenizer else None

    def logits_size(self, model) -> int:
        return model.n_vocab

    def eos_token_ids(self, model) -> set[int]:
        """The EOS id of the file's metadata (the one the torch backend's conversion puts in
        its generation config)."""
        return set(model.eos_token_ids)

    def models_description(self, target, draft) -> dict:
        return {"target_file": f"{target.path.name}: {target.description}",
                "draft_file": None if draft is None else f"{draft.path.name}: {draft.description}",
                "threads": target.threads}

    def sequence_logits(self, model, token_ids: list[int], last: int, dtype=None, twin=None) -> torch.Tensor:
        """The forward at the file's own types (``dtype`` and ``twin`` do not apply), in the
        model's kept scoring context (``LlamaCppModel.scorer``)."""
        return model.scorer().sequence_logits(list(token_ids), last)

    def language_model(self, model, twin=None, variants: dict | None = None) -> LlamaCppLM:
        return LlamaCppLM(model)

    def device(self, model) -> torch.device:
        return torch.device("cpu")

    def max_positions(self, model) -> int | None:
        return model.n_ctx_train or None

    def to(self, model, device: torch.device):
        if torch.device(device).type != "cpu":
            raise ValueError(f"device: the llama.cpp backend runs on the CPU, not {device}")
        return model

    def cost_precision(self, model) -> str:
        return "gguf"  # the file's own types

    def cost_key(self, model, precision: str, device) -> str:
        kernels = "" if model.extra_buffers else " without extra buffers"
        return (f"{hardware_key()} | llama.cpp {llama_cpp_version()}{kernels} | {model.threads} threads | "
                f"{model.fingerprint} | {precision}")

    def weights_description(self, models: dict, files: bool = True) -> str:
        """The llama.cpp backend's settings have no dtype: the GGUF files run as they are."""
        files = files and ", ".join(str(models[key]) for key in ("target_file", "draft_file")
                                    if models.get(key) is not None)
        return f"llama.cpp backend, {models.get('threads', '?')} threads" + (f" ({files})" if files else "")


BACKEND = LlamaCppBackend()
