"""The reference the auditor scores sampled tokens with: the engine's weights run without
speculation, by teacher forcing.

``Reference.logits(prompt_ids, continuation, room)`` gives, for each continuation token, the
next-token logits of the reference at that position: the prompt's last row by a prefill of
the prompt alone (the forward every engine runs first), then the continuation's positions in
one forward over it, its last token left out (``engine.backends.Entries.chain``), padded to
``room`` − 1 entries by repeating its last token. A prompt is prefilled once for all of its
samples; each continuation is rolled back after it is read.

``Reference.shape_logits`` gives the same rows at the other batch shapes an engine may use
(``audit.tolerances.SHAPES``): one row a forward and four rows a forward (the last block
padded to four), the first row by the prompt prefilled without its last token and that token
scored alone. Kernels compute a row from its context and the shape of its forward (how many
rows, which one), not from the other rows' tokens; the padding fixes every shape by the
position alone, so each of these rows is a function of its context — what the auditor's
proofs need of them (``audit.pit``). A reference that scores otherwise (a subclass over a
table in the tests) has no ``language_model`` and no shapes: ``shape_logits`` gives None.
Rows are kept (``CACHE_FLOATS`` logits at most) and read again for a continuation sampled twice.

``as_reference(source)`` accepts what the auditor may be handed: a ``Reference``; a model the
engine runs (an ``engine.backends.torch.CausalLM``, an ``engine.backends.llamacpp.LlamaCppLM`` or anything with
their ``reset``/``prefill``/``score``/``commit``); a transformers causal LM; a llama.cpp
``LlamaCppModel``; or a path — a ``.gguf`` file (on llama.cpp when llama-cpp-python is
installed, else dequantised by transformers) or a Hugging Face folder. Prompts are token ids,
so no tokenizer is read: a GGUF file without one works on llama.cpp. ``pair_reference(pair)``
is the target of a loaded pair as our engine runs it (its float32 prefill twin where it has
one). A reference knows the backend whose kernels it runs on (``Reference.backend``; None for
kernels no backend names): where it has no shapes to measure, the audit tolerates that
backend's stated rounding (``audit.tolerances``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from specbound.audit.tolerances import SHAPES
from specbound.engine.backends import Entries, backend_of

CACHE_FLOATS = 1 << 24  # logits kept for continuations sampled again (64 MB of float32)


class Reference:
    """Teacher-forced next-token logits of a language model with the engine's protocol
    (module docstring)."""

    language_model = None  # the engine's protocol (None: a subclass scoring otherwise, no batch shapes)

    def __init__(self, language_model, backend=None):
        self.language_model = language_model
        self.backend = backend  # the ``engine.backends.Backend`` whose kernels it runs on (None: unknown)
        self._prompt: tuple[int, ...] | None = None
        self._first: torch.Tensor | None = None
        self._first_alone: dict[tuple[int, ...], torch.Tensor] = {}  # prompt -> its last row scored alone [1, logits]
        self._kept: dict[tuple, torch.Tensor] = {}
        self._kept_floats = 0

    @property
    def vocab_size(self) -> int:
        """Logits per row (the model's vocabulary, padding included)."""
        return int(self.language_model.logits_size)

    @property
    def max_positions(self) -> int | None:
        return self.language_model.max_positions

    def logits(self, prompt_ids: list[int], continuation: list[int], room: int = 0) -> torch.Tensor:
        """Next-token logits at each position of ``continuation`` after ``prompt_ids``;
        ``room``: the longest continuation of this prompt to come (the forward is padded to it).
        # -> [len(continuation), logits] float32"""
        key = ("reference", tuple(prompt_ids), tuple(continuation), room)
        if key in self._kept:
            return self._kept[key]
        self._prefilled(prompt_ids, room)
        if len(continuation) <= 1:
            return self._first[: len(continuation)]
        rest = self._scored(prompt_ids, continuation[:-1], max(room, len(continuation)) - 1)
        return self._keep(key, torch.cat([self._first, rest]))

    def shape_logits(self, prompt_ids: list[int], continuation: list[int], room: int = 0) -> torch.Tensor | None:
        """The rows of ``logits`` computed at each of ``SHAPES`` (module docstring), None for a
        reference with no batch shapes.  # -> [shapes, len(continuation), logits] float32"""
        if self.language_model is None or not continuation:
            return None
        key = ("shapes", tuple(prompt_ids), tuple(continuation), room)
        if key in self._kept:
            return self._kept[key]
        first = self._alone(prompt_ids, room)
        self._prefilled(prompt_ids, room)
        rows = []
        for size in SHAPES:
            blocks = [first]
            for start in range(0, len(continuation) - 1, size):
                block = continuation[start: min(start + size, len(continuation) - 1)]
                logits = self.language_model.score([Entries.chain(self._padded(prompt_ids, start, block, size),
                                                                  after=start - 1)]).logits(0).float()
                blocks.append(logits[: len(block)])
            self.language_model.commit([[]])  # back to the prompt
            rows.append(torch.cat(blocks))
        return self._keep(key, torch.stack(rows))

    def _prefilled(self, prompt_ids: list[int], room: int) -> None:
        """The prompt prefilled alone (once for all of its samples), its last row in ``_first``."""
        if self._prompt == tuple(prompt_ids):
            return
        self._prompt = None
        self.language_model.reset(1, cells=len(prompt_ids) + room + max(SHAPES) + 1)
        self._first = self.language_model.prefill(0, list(prompt_ids))[-1:].float()
        self._prompt = tuple(prompt_ids)

    def _alone(self, prompt_ids: list[int], room: int) -> torch.Tensor:
        """The prompt's last row as one row scored after the rest of the prompt.  # -> [1, logits]"""
        prompt = tuple(prompt_ids)
        if prompt not in self._first_alone:
            if len(prompt) < 2:
                self._prefilled(prompt_ids, room)
                self._first_alone[prompt] = self._first
            else:
                self._prompt = None
                self.language_model.reset(1, cells=len(prompt) + room + max(SHAPES) + 1)
                self.language_model.prefill(0, list(prompt[:-1]))
                scores = self.language_model.score([Entries.chain(prompt[-1:])])
                self._first_alone[prompt] = scores.logits(0)[-1:].float()
        return self._first_alone[prompt]

    def _scored(self, prompt_ids: list[int], tokens: list[int], entries: int) -> torch.Tensor:
        """The rows of ``tokens`` after the prompt in one forward of ``entries`` entries (padded),
        rolled back.  # -> [len(tokens), logits]"""
        scores = self.language_model.score([Entries.chain(self._padded(prompt_ids, 0, tokens, entries))])
        rows = scores.logits(0)[: len(tokens)].float()
        self.language_model.commit([[]])  # back to the prompt
        return rows

    def _padded(self, prompt_ids: list[int], start: int, tokens: list[int], size: int) -> list[int]:
        """``tokens`` (entries from ``start`` on) padded to ``size`` by repeating the last, within
        the model's positions."""
        limit = self.max_positions
        room = size if limit is None else max(len(tokens), min(size, limit - len(prompt_ids) - start))
        return list(tokens) + [tokens[-1]] * (room - len(tokens))

    def _keep(self, key: tuple, rows: torch.Tensor) -> torch.Tensor:
        if self._kept_floats + rows.numel() <= CACHE_FLOATS:
            self._kept[key] = rows
            self._kept_floats += rows.numel()
        return rows


def as_reference(source, progress: bool = False) -> Reference:
    """A ``Reference`` of ``source`` (module docstring); ValueError naming ``reference`` for
    anything else."""
    if isinstance(source, Reference):
        return source
    if all(hasattr(source, name) for name in ("reset", "prefill", "score", "commit", "logits_size")):
        return Reference(source, _backend_or_none(getattr(source, "model", None)))
    if isinstance(source, (str, Path)):
        language_model = _load(Path(source), progress)
        return Reference(language_model, _backend_or_none(language_model.model))
    backend = _backend_or_none(source)  # a model a backend holds: a transformers causal LM, a LlamaCppModel
    if backend is None:
        raise ValueError(f"reference: expected a .gguf file, a Hugging Face folder or a loaded model, got "
                         f"{type(source).__name__}")
    return Reference(backend.language_model(source), backend)


def pair_reference(pair) -> Reference:
    """The target of an ``engine.pair.ModelPair`` as our engine runs it without speculation:
    on torch, a bf16 target prefilled by its float32 twin as the engine's decoders prefill it."""
    return Reference(pair.backend.language_model(pair.target, pair.target_twin), pair.backend)


def _backend_or_none(model):
    """The backend holding ``model``, None where none does."""
    try:
        return backend_of(model)
    except ValueError:
        return None


def _load(path: Path, progress: bool):
    """The language model of the file or folder ``path``, on the backend ``auto`` chooses for
    it (``models.backends.resolve_backend``), in float32 where the backend converts weights;
    no tokenizer is read."""
    if not (path.is_file() and path.suffix == ".gguf") and not (path.is_dir() and (path / "config.json").is_file()):
        raise ValueError(f"reference: {str(path)!r} is neither a .gguf file nor a Hugging Face folder with a "
                         "config.json")
    from specbound.models.backends import resolve_backend
    from specbound.models.loading import ModelFiles

    backend = resolve_backend("auto", [path])
    model, _ = backend.load(path, ModelFiles(progress), torch.float32, tokenizer=False)
    return backend.language_model(model)
