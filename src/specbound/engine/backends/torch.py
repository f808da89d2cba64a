"""The torch backend: a transformers causal language model with its KV cache
(``torch_cache``), for a batch of sequences each made of a committed prefix plus pending
speculative entries.

Per row (sequence) b the cache holds
- the **committed** prefix, positions ``0 .. L_b − 1``: an ordinary causal sequence;
- **pending** entries scored since the last ``commit``, each with a parent: the row's
  last committed token (parent −1) or an earlier pending entry. A pending entry attends
  to the committed prefix, its pending ancestors and itself — tree attention — and its
  position id is its parent's plus one, so a node at depth k of a tree sees exactly the
  context it would see in a plain sequential forward.

``score`` runs one forward over every row's new entries (rows padded to the longest);
``commit`` then keeps one path of pending entries per row as committed and drops the rest
(rollback). When every row's entries form one causal chain right after its committed
prefix (plain decoding and chains with a single sequence), no mask is built at all: the
model's own causal attention is exactly tree attention there. Otherwise a 4D additive mask
``[batch, 1, new, columns]`` says who sees whom (transformers uses it as given, for the
eager and the SDPA attention alike).

The output head (vocabulary × hidden: for a small model the largest matrix) is applied
only to the rows that are read (``Scores.logits``): verification visits one path of a tree,
so the head's cost on the other nodes is saved. This needs the model's logits to be
``head(base_model(x))``, which is checked once per model; other models get their full
logits from every forward.

Optional **variants** (the same model at other precisions, ``torch_quantize``; the model
itself is the variant ``engine.precisions.AS_LOADED``) share the one cache: a forward can
run on any of them (``score(..., variant=name)``), so a drafter picks, forward by forward,
the precision that is fastest for that many rows. The cache's keys and values then come
from several precisions; that changes the draft's law a little, never losslessness (the
verifier is handed the law the drafts were drawn from).

An optional **prefill twin** (the same architecture and weights in a wider dtype, e.g.
``copy.deepcopy(model).float()``) runs a long first prefill of a row: on a CPU without
native bfloat16 units a bfloat16 forward costs time linear in its rows, so a long prompt
is several times faster in float32, while one-token decoding is fastest in bfloat16. The
twin's keys and values are converted to the model's dtype into the cache, its last hidden
states go through the model's own head, and every later forward is the model's own.

A **long prefill** runs in forwards of ``prefill_chunk`` tokens, each attending to the
chunks before it through the cache: the cache and logits are those of one forward (up to
the rounding of products of other sizes), and ``prefill_progress(done, total)``, when set,
is told the tokens done after each chunk.

Written against the transformers 5.x cache API (``torch_cache``).

``TorchBackend`` (``BACKEND``) is what the rest of the package knows of it: a transformers
model loaded from its files, its float32 twin, the language model over it, a plain forward
over a sequence, its device and context, its int8/int4 copies on the CPU, its cost key.
"""

from __future__ import annotations

import copy
import functools
import inspect
import time
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch

from specbound.checks import positive_int
from specbound.engine.backends import PREFILL_CHUNK, Backend, BaseLM, Entries, Rounding
from specbound.engine.backends.torch_cache import SpeculativeCache
from specbound.engine.machine import hardware_key, model_fingerprint
from specbound.engine.precisions import AS_LOADED, PRECISIONS


class Scores:
    """Next-token logits of the entries of one forward, the output head applied on demand.
    Entry (row, i) is the row's i-th new entry of that forward. The head's time is added to
    the model's (``lm.model_seconds``)."""

    def __init__(self, states: torch.Tensor, head, counts: list[int], lm: CausalLM | None = None):
        self._states = states  # [batch, new, hidden] (or [batch, new, logits] with head = identity)
        self._head = head
        self.counts = counts  # new entries per row
        self._lm = lm
        self._computed: dict[tuple[int, int], torch.Tensor] = {}  # (row, entry) -> [logits], from prefetch

    def prefetch(self, pairs: list[tuple[int, int]]) -> None:
        """Apply the head once to the (row, entry) pairs that will be asked for, so that a
        batch pays one head call per step, not one per row (the head is a 151,936 × hidden
        matrix: one call reads it whole, whatever its rows)."""
        pairs = [pair for pair in dict.fromkeys(pairs) if pair not in self._computed]
        if pairs:
            for pair, logits in zip(pairs, self.logits_of(pairs)):
                self._computed[pair] = logits

    def logits(self, row: int = 0, entries=None) -> torch.Tensor:
        """Logits of ``entries`` of ``row`` (a non-negative index, a list of them or a slice;
        None = all of the row's new entries); prefetched ones are not computed again.
        # -> [k, logits] float32"""
        if self._computed:
            if entries is None or isinstance(entries, slice):
                wanted = list(range(self.counts[row]))[entries or slice(None)]
            else:
                many = hasattr(entries, "__len__") and not (torch.is_tensor(entries) and entries.dim() == 0)
                wanted = [int(entry) for entry in entries] if many else [int(entries)]
            if all((row, entry) in self._computed for entry in wanted):
                return torch.stack([self._computed[row, entry] for entry in wanted])
        states = self._states[row, : self.counts[row]] if entries is None else self._states[row, entries]
        if states.ndim == 1:
            states = states[None]
        return self._apply_head(states)

    def _apply_head(self, states: torch.Tensor) -> torch.Tensor:
        started = time.perf_counter()
        with torch.no_grad():
            logits = self._head(states).float()
        if self._lm is not None:
            self._lm.model_seconds += time.perf_counter() - started
        return logits

    def logits_of(self, pairs: list[tuple[int, int]]) -> torch.Tensor:
        """Logits of (row, entry) pairs, the head applied once to all of them.  # -> [k, logits]"""
        rows = torch.tensor([row for row, _ in pairs], dtype=torch.long)
        entries = torch.tensor([entry for _, entry in pairs], dtype=torch.long)
        return self._apply_head(self._states[rows, entries])


class CausalLM(BaseLM):
    """Wrap a transformers causal LM (``model(input_ids, ...) -> .logits``) and a batched
    cache (module docstring). ``forward_calls`` counts model forwards since the last
    ``reset`` (a row's prefill counts as one); ``model_seconds`` is the wall time spent
    inside the model (its forwards and its head) since then — the rest of a step is the
    engine's own. ``prefill_progress``: None, or called with (tokens done, tokens) after each
    chunk of a prefill longer than ``prefill_chunk`` tokens."""

    def __init__(
        self,
        model: torch.nn.Module,
        prefill_model: torch.nn.Module | None = None,
        prefill_min_tokens: int = 16,
        variants: dict[str, torch.nn.Module] | None = None,
        prefill_chunk: int = PREFILL_CHUNK,
    ):
        self.prefill_min_tokens = positive_int("prefill_min_tokens", prefill_min_tokens)
        self.prefill_chunk = positive_int("prefill_chunk", prefill_chunk)
        self.prefill_progress: Callable[[int, int], None] | None = None
        self.model = model.eval()
        self._cache_argument = _cache_argument(model)
        self._head = model.get_output_embeddings()
        self._num_layers = model.config.get_text_config(decoder=True).num_hidden_layers
        _check_full_attention(model)
        self._factorized = _logits_are_head_of_base_model(model)
        self.variants = {AS_LOADED: self.model}
        for name, variant in (variants or {}).items():
            if name == AS_LOADED:
                raise ValueError(f"variants: {AS_LOADED!r} is the model itself")
            _check_twin(model, variant, "variants")
            if not _logits_are_head_of_base_model(variant.eval()) and self._factorized:
                raise ValueError(f"variants: {name!r} does not compute its logits as the model's head does")
            self.variants[name] = variant
        if prefill_model is not None:
            _check_twin(model, prefill_model)
            prefill_model = prefill_model.eval()
        self.prefill_model = prefill_model
        self.reset()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def logits_size(self) -> int:
        """Number of logits per position (the model's vocabulary, padding included)."""
        return self._head.weight.shape[0]

    @property
    def max_positions(self) -> int | None:
        """The longest sequence the model's position embeddings cover (None if unknown)."""
        return getattr(self.model.config.get_text_config(decoder=True), "max_position_embeddings", None)

    def reset(self, batch_size: int = 1, cells: int | None = None) -> None:
        """Forget everything: an empty cache for ``batch_size`` rows. ``cells``: the entries
        the batch may hold at most (a hint for backends with a fixed-size cache; this one
        grows by doubling and needs none)."""
        self.batch_size = positive_int("batch_size", batch_size)
        self.cache = SpeculativeCache(self._num_layers)
        self.lengths = [0] * self.batch_size  # committed entries per row
        self.forward_calls = 0
        self.model_seconds = 0.0
        self._pending: list[list[_Pending]] = [[] for _ in range(self.batch_size)]

    # -- the batched interface ----------------------------------------------------------------
    def prefill_rows(self, prompts: dict[int, list[int]]) -> None:
        """Commit each prompt of ``prompts`` (row -> tokens) as the whole prefix of its empty
        row (``prefill``, one row after the other); no logits."""
        for row, tokens in prompts.items():
            self.prefill(row, tokens)

    def prefill(self, row: int, token_ids, last_only: bool = True) -> torch.Tensor:
        """Commit ``token_ids`` as the whole prefix of the empty row ``row`` (scored alone, by
        the twin when the prompt is long enough, in chunks of ``prefill_chunk`` tokens: module
        docstring); return the next-token logits of the last token (all tokens with
        ``last_only=False``).  # -> [1 or n, logits_size] float32"""
        if self.lengths[row] or self._pending[row]:
            raise ValueError(f"prefill: row {row} is not empty")
        tokens = self.checked_tokens(token_ids)
        twin = self.prefill_model if self.prefill_model is not None and len(tokens) >= self.prefill_min_tokens else None
        scorer = twin or self.model
        cache = SpeculativeCache(self._num_layers)
        started = time.perf_counter()
        pieces = []  # [chunk, hidden] (or [chunk or 1, logits] unfactorized)
        for start in range(0, len(tokens), self.prefill_chunk):
            chunk = tokens[start : start + self.prefill_chunk]
            arguments = {"input_ids": chunk[None].to(_device_of(scorer)), "use_cache": True,
                         _cache_argument(scorer): cache}
            with torch.no_grad():
                if self._factorized:
                    piece = scorer.base_model(**arguments).last_hidden_state[0]
                else:
                    if last_only:
                        arguments["logits_to_keep"] = 1
                    piece = scorer(**arguments).logits[0]
            pieces = [piece] if last_only else pieces + [piece]
            if self.prefill_progress is not None and len(tokens) > self.prefill_chunk:
                self.prefill_progress(start + len(chunk), len(tokens))
        self.cache.write_row(row, self.batch_size, (
            (layer.keys.to(device=self.device, dtype=self.dtype), layer.values.to(device=self.device, dtype=self.dtype))
            for layer in cache.layers
        ))
        self.lengths[row] = len(tokens)
        self.forward_calls += 1
        states = torch.cat(pieces).to(device=self.device, dtype=self.dtype)
        if last_only:
            states = states[-1:]
        with torch.no_grad():
            logits = (self._head(states) if self._factorized else states).float()
        self.model_seconds += time.perf_counter() - started
        return logits

    def score(self, entries: list[Entries], variant: str = AS_LOADED, outputs=None) -> Scores:
        """One forward over every row's new entries (``entries[b]`` for row b; an empty
        Entries for a row that adds nothing), by the model's ``variant`` (``AS_LOADED``: the
        model itself). They stay pending until ``commit``. ``outputs[b]``: the entries of row
        b whose logits may be read (None: any); here the head is applied on demand, so
        reading any entry works."""
        model = self.variants[variant]
        counts = self.check_entries(entries)  # everything checked before anything changes
        width = max(counts)
        start = self.cache.length
        tokens = torch.zeros((self.batch_size, width), dtype=torch.long)
        for b, row in enumerate(entries):
            if row.tokens:
                tokens[b, : len(row.tokens)] = torch.as_tensor(row.tokens, dtype=torch.long)
        for b, row in enumerate(entries):
            for index, parent in enumerate(row.parents):
                self._pending[b].append(_Pending.below(self._pending[b], parent, start + index, self.lengths[b]))
        causal = self._causal(counts, start)
        arguments = {
            "input_ids": tokens.to(self.device),
            "use_cache": True,
            self._cache_argument: self.cache,
        }
        if not causal:
            arguments["attention_mask"] = self._mask(counts, start, width)
            positions = torch.zeros((self.batch_size, width), dtype=torch.long)
            for b, count in enumerate(counts):
                if count:
                    positions[b, :count] = torch.tensor([entry.position for entry in self._pending[b][-count:]])
                positions[b, count:] = self.lengths[b]  # padding: any valid position
            arguments["position_ids"] = positions.to(self.device)
        started = time.perf_counter()
        with torch.no_grad():
            if self._factorized:
                states = model.base_model(**arguments).last_hidden_state
            else:
                states = model(**arguments).logits
        if states.device.type == "cuda":
            torch.cuda.synchronize(states.device)
        self.model_seconds += time.perf_counter() - started
        self.forward_calls += 1
        head = model.get_output_embeddings() if self._factorized else torch.nn.Identity()
        return Scores(states, head, counts, self)

    def commit(self, paths: list[list[int]]) -> None:
        """Keep, per row, the pending entries ``paths[b]`` (a chain starting below the last
        committed token) as committed, and drop every other pending entry. An empty path
        rolls the row back to its committed prefix."""
        self.check_paths(paths)
        columns = [[self._pending[b][entry].column for entry in path] for b, path in enumerate(paths)]
        new_lengths = [length + len(path) for length, path in zip(self.lengths, paths)]
        start = min(self.lengths)
        end = max(new_lengths)
        in_place = all(column == self.lengths[b] + i for b, row in enumerate(columns) for i, column in enumerate(row))
        if in_place:
            self.cache.keep(torch.zeros((self.batch_size, 0), dtype=torch.long), start, end)
        else:
            source = torch.arange(start, end).repeat(self.batch_size, 1)  # [batch, end − start]
            for b, row in enumerate(columns):
                for i, column in enumerate(row):
                    source[b, self.lengths[b] - start + i] = column
            self.cache.keep(source.to(self.device), start, end)
        self.lengths = new_lengths
        self._pending = [[] for _ in range(self.batch_size)]

    def select_rows(self, rows: list[int]) -> None:
        """Keep only the rows ``rows`` (in that order); the others leave the batch."""
        self.check_nothing_pending("select_rows", rows)
        self.cache.select_rows(torch.tensor(rows, dtype=torch.long, device=self.device))
        self.lengths = [self.lengths[row] for row in rows]
        self.batch_size = len(rows)
        self._pending = [[] for _ in rows]

    # -- internals ---------------------------------------------------------------------------
    def pending_parents(self, row: int) -> list[int]:
        return [entry.parent for entry in self._pending[row]]

    def _causal(self, counts: list[int], start: int) -> bool:
        """Whether the model's own causal attention is exactly tree attention here: every
        row's pending entries form one chain starting right after its committed prefix, in
        consecutive columns ending at the new ones, with the same count in every row."""
        for b, pending in enumerate(self._pending):
            if counts[b] != counts[0] or self.lengths[b] + len(pending) != start + counts[b]:
                return False
            for index, entry in enumerate(pending):
                if entry.parent != index - 1 or entry.column != self.lengths[b] + index:
                    return False
        return True

    def _mask(self, counts: list[int], start: int, width: int) -> torch.Tensor:
        """Additive mask [batch, 1, width, start + width] in the model's dtype."""
        sees = torch.zeros((self.batch_size, width, start + width), dtype=torch.bool)
        for b, count in enumerate(counts):
            sees[b, :, : self.lengths[b]] = True
            for query, entry in enumerate(self._pending[b][len(self._pending[b]) - count :]):
                sees[b, query, entry.ancestors] = True
            for query in range(count, width):  # padding sees itself only
                sees[b, query, start + query] = True
        mask = torch.zeros(sees.shape, dtype=self.dtype).masked_fill(~sees, torch.finfo(self.dtype).min)
        return mask[:, None].to(self.device)

    def add_row(self, cells: int | None = None) -> int:
        """Append an empty row to a batch of at least one row (a sequence joining between
        steps) and return its index; ``prefill`` fills it. ``cells``: the entries the row
        may hold at most, as ``reset`` takes it. Its cache columns start as a copy of row 0's
        (``select_rows``), hidden from its entries by its committed length of 0 until
        ``prefill`` overwrites them."""
        if not self.batch_size:
            raise ValueError("add_row: the batch is empty; reset it for the new rows")
        self.check_nothing_pending("add_row")
        self.cache.select_rows(torch.tensor(list(range(self.batch_size)) + [0], dtype=torch.long, device=self.device))
        self.lengths.append(0)
        self._pending.append([])
        self.batch_size += 1
        return self.batch_size - 1



def _logits_are_head_of_base_model(model: torch.nn.Module) -> bool:
    tokens = torch.tensor([[0, 1]], device=_device_of(model))
    with torch.no_grad():
        full = model(input_ids=tokens, use_cache=False).logits
        split = model.get_output_embeddings()(model.base_model(input_ids=tokens, use_cache=False).last_hidden_state)
    return full.shape == split.shape and bool(torch.equal(full, split))


@dataclass(frozen=True)
class _Pending:
    """A pending entry of one row: its parent, buffer column, position id and the columns it
    attends to among the pending ones (its ancestors and itself)."""

    parent: int
    column: int
    position: int
    ancestors: list[int]

    @classmethod
    def below(cls, pending: list[_Pending], parent: int, column: int, committed: int) -> _Pending:
        if parent < 0:
            return cls(parent, column, committed, [column])
        above = pending[parent]
        return cls(parent, column, above.position + 1, above.ancestors + [column])


def _device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _cache_argument(model: torch.nn.Module) -> str:
    """The cache keyword's name: transformers renamed ``past_key_values`` to ``cache`` in 5.x."""
    parameters = inspect.signature(model.base_model.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def _check_full_attention(model: torch.nn.Module) -> None:
    """Tree rollback keeps and drops arbitrary columns: every layer must attend to the whole
    prefix (no sliding window, no linear attention)."""
    config = model.config.get_text_config(decoder=True)
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"} or getattr(config, "use_sliding_window", False):
        raise ValueError(
            f"model: layer types {sorted(kinds)} (sliding window: {getattr(config, 'use_sliding_window', False)}); "
            "tree attention and rollback need full attention in every layer"
        )


def _check_twin(model: torch.nn.Module, twin: torch.nn.Module, name: str = "prefill_model") -> None:
    """A prefill twin or a variant must be the model's architecture: same config class,
    output head shape (vocabulary × hidden) and number of layers."""
    if type(twin.config) is not type(model.config):
        raise ValueError(
            f"{name}: config {type(twin.config).__name__} differs from the model's "
            f"{type(model.config).__name__}"
        )
    twin_head = tuple(twin.get_output_embeddings().weight.shape)
    model_head = tuple(model.get_output_embeddings().weight.shape)
    if twin_head != model_head:
        raise ValueError(
            f"{name}: output head shape {twin_head} (vocabulary × hidden) differs from "
            f"the model's {model_head}"
        )
    twin_layers = twin.config.get_text_config(decoder=True).num_hidden_layers
    model_layers = model.config.get_text_config(decoder=True).num_hidden_layers
    if twin_layers != model_layers:
        raise ValueError(f"{name}: {twin_layers} layers, the model has {model_layers}")


class TorchBackend(Backend):
    """A transformers module in a floating dtype on torch, on the CPU or a GPU: float32
    prefill twins of a bf16 model, weight-only int8/int4 copies on the CPU
    (``torch_quantize``)."""

    name = "torch"
    float32_twins = True
    rounding = Rounding(mean_tv=0.01, row_tv=0.08, score_drift=0.03, score_variance=0.03)  # bf16, CPU: 0.0054, 0.061,
    # 0.0165, 0.0071 measured

    def holds(self, model) -> bool:
        return isinstance(model, torch.nn.Module)

    def load(self, source, files, dtype: torch.dtype, threads: int | None = None, tokenizer: bool = True) -> tuple:
        """The transformers model in ``dtype`` (a GGUF file dequantised once and cached:
        ``models.loading``); ``threads`` does not apply."""
        return tuple(files.transformers(source, dtype, tokenizer))

    def logits_size(self, model) -> int:
        return model.get_output_embeddings().weight.shape[0]

    def eos_token_ids(self, model) -> set[int]:
        """Every EOS id of the model's generation config."""
        configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        if configured is None:
            return set()
        return {configured} if isinstance(configured, int) else {int(token) for token in configured}

    def float32_twin(self, model: torch.nn.Module) -> torch.nn.Module:
        """Every bf16/fp16 value is a float32 value: the copy computes the model's function
        exactly, more slowly per row and faster in a long prefill on a CPU without bf16 units."""
        return copy.deepcopy(model).to(torch.float32).eval()

    def sequence_logits(self, model, token_ids: list[int], last: int, dtype: torch.dtype | None = None,
                        twin=None) -> torch.Tensor:
        parameter = next(model.parameters())
        input_ids = torch.tensor([list(token_ids)], device=parameter.device)
        scoring = nullcontext(twin) if twin is not None else computing_in(model, dtype or parameter.dtype)
        with torch.no_grad(), scoring as scorer:
            logits = scorer(input_ids=input_ids, logits_to_keep=last).logits[0]
        return logits.to(parameter.dtype).float().cpu()  # the precision the model's outputs have

    def language_model(self, model, twin=None, variants: dict | None = None) -> CausalLM:
        """A ``CausalLM`` over ``model``, prefilled by ``twin`` where that pays
        (``prefill_twin``), with its ``variants``."""
        return CausalLM(model, prefill_model=prefill_twin(twin), variants=variants)

    def settings_description(self, dtype: str, float32_twins: bool) -> dict:
        return {"dtype": dtype, "float32_twins": float32_twins}

    def device(self, model) -> torch.device:
        return _device_of(model)

    def max_positions(self, model) -> int | None:
        return getattr(model.config.get_text_config(decoder=True), "max_position_embeddings", None)

    def to(self, model, device: torch.device):
        return model.to(device)

    def precisions(self, device: torch.device) -> tuple[str, ...]:
        return PRECISIONS if torch.device(device).type == "cpu" else (AS_LOADED,)

    def at_precision(self, model, precision: str, cache_dir):
        from specbound.engine.backends.torch_quantize import quantize

        return model if precision == AS_LOADED else quantize(model, precision, cache_dir=cache_dir)

    def precision_of(self, model) -> str:
        from specbound.engine.backends.torch_quantize import precision_of

        return precision_of(model)

    def cost_precision(self, model) -> str:
        """A quantised copy's precision ("int8", "int4"), else the dtype the model was loaded
        in ("bfloat16", "float32"): a float32 and a bfloat16 load, both ``AS_LOADED``, are
        measured apart."""
        precision = self.precision_of(model)
        return str(next(model.parameters()).dtype).removeprefix("torch.") if precision == AS_LOADED else precision

    def cost_key(self, model, precision: str, device) -> str:
        return f"{machine_key(device)} | {model_fingerprint(model)} | {precision}"


def machine_key(device: torch.device | str = "cpu") -> str:
    """What makes torch timings comparable: the hardware (``engine.machine.hardware_key``), the
    torch version and the number of threads."""
    return f"{hardware_key(device)} | torch {torch.__version__} | {torch.get_num_threads()} threads"


@contextmanager
def computing_in(model: torch.nn.Module, dtype: torch.dtype):
    """Cast ``model`` to ``dtype`` for the ``with`` body and back to its own dtype after
    (lossless when ``dtype`` holds every value of the model's dtype, e.g. bf16 -> fp32)."""
    original = next(model.parameters()).dtype
    if original == dtype:
        yield model
        return
    model.to(dtype)
    try:
        yield model
    finally:
        model.to(original)


def prefill_twin(twin: torch.nn.Module | None) -> torch.nn.Module | None:
    """``twin`` where a float32 prefill is measured faster than bf16 on this CPU
    (``float32_beats_bf16``), else None: on a GPU, or where bf16 has matrix units."""
    if twin is None or _device_of(twin).type != "cpu":
        return None
    return twin if float32_beats_bf16() else None


@functools.cache
def float32_beats_bf16(rows: int = 256, width: int = 1536, repeats: int = 3) -> bool:
    """Whether a long forward runs faster in float32 than in bf16 on this CPU, measured: one
    [rows × width] by [width × 4·width] product in each dtype (a prefill's MLP layer), the
    minimum over ``repeats``; float32 wins when bf16 takes over 1.25× as long. True on an
    AVX2-only CPU (bf16 is emulated there), False with AVX512-BF16 or AMX (native bf16
    units). Measured once per process."""
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn((rows, width), generator=generator)
    weight = torch.randn((4 * width, width), generator=generator)

    def seconds(dtype: torch.dtype) -> float:
        x, w = inputs.to(dtype), weight.to(dtype)
        best = float("inf")
        with torch.no_grad():
            torch.nn.functional.linear(x, w)  # first call: kernel selection
            for _ in range(repeats):
                started = time.perf_counter()
                torch.nn.functional.linear(x, w)
                best = min(best, time.perf_counter() - started)
        return best

    return seconds(torch.bfloat16) > 1.25 * seconds(torch.float32)


BACKEND = TorchBackend()
