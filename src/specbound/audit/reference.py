"""The reference the auditor scores sampled tokens with: the engine's weights run without
speculation, by teacher forcing.

``Reference.logits(prompt_ids, continuation)`` gives, for each continuation token, the
next-token logits of the reference at that position: the prompt's last row by a prefill of
the prompt alone (the forward every engine runs first), then the continuation's positions in
one forward over it, its last token left out (``engine.backends.Entries.chain``). A prompt is
prefilled once for all of its samples; each continuation is rolled back after it is read.

``as_reference(source)`` accepts what the auditor may be handed: a ``Reference``; a model the
engine runs (an ``engine.backends.torch.CausalLM``, an ``engine.backends.llamacpp.LlamaCppLM`` or anything with
their ``reset``/``prefill``/``score``/``commit``); a transformers causal LM; a llama.cpp
``LlamaCppModel``; or a path — a ``.gguf`` file (on llama.cpp when llama-cpp-python is
installed, else dequantised by transformers) or a Hugging Face folder. Prompts are token ids,
so no tokenizer is read: a GGUF file without one works on llama.cpp. ``pair_reference(pair)``
is the target of a loaded pair as our engine runs it (its float32 prefill twin where it has
one). A reference knows the
backend whose kernels it runs on (``Reference.backend``; None for kernels no backend names):
the audit tolerates that backend's rounding (``audit.tolerances``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from specbound.engine.backends import Entries, backend_of


class Reference:
    """Teacher-forced next-token logits of a language model with the engine's protocol
    (module docstring)."""

    def __init__(self, language_model, backend=None):
        self.language_model = language_model
        self.backend = backend  # the ``engine.backends.Backend`` whose kernels it runs on (None: unknown)
        self._prompt: tuple[int, ...] | None = None
        self._first: torch.Tensor | None = None

    @property
    def vocab_size(self) -> int:
        """Logits per row (the model's vocabulary, padding included)."""
        return int(self.language_model.logits_size)

    @property
    def max_positions(self) -> int | None:
        return self.language_model.max_positions

    def logits(self, prompt_ids: list[int], continuation: list[int], room: int = 0) -> torch.Tensor:
        """Next-token logits at each position of ``continuation`` after ``prompt_ids``;
        ``room``: the longest continuation of this prompt to come (the cache is sized for it).
        # -> [len(continuation), logits] float32"""
        lm = self.language_model
        if self._prompt != tuple(prompt_ids):
            self._prompt = None
            lm.reset(1, cells=len(prompt_ids) + max(room, len(continuation)) + 1)
            self._first = lm.prefill(0, list(prompt_ids))[-1:].float()
            self._prompt = tuple(prompt_ids)
        if len(continuation) <= 1:
            return self._first[: len(continuation)]
        scores = lm.score([Entries.chain(continuation[:-1])])
        rest = scores.logits(0).float()
        lm.commit([[]])  # back to the prompt
        return torch.cat([self._first, rest])


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
    """The language model of the file or folder ``path``."""
    if path.is_file() and path.suffix == ".gguf":
        from specbound.engine.backends.llamacpp import LlamaCppLM, LlamaCppModel, llama_cpp_available

        if llama_cpp_available():
            return LlamaCppLM(LlamaCppModel(path))
        from specbound.engine import CausalLM
        from specbound.models.loading import load_model

        return CausalLM(load_model(path, dtype=torch.float32, progress=progress).model)
    if path.is_dir() and (path / "config.json").is_file():
        from transformers import AutoModelForCausalLM

        from specbound.engine import CausalLM

        return CausalLM(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True).eval())
    raise ValueError(f"reference: {str(path)!r} is neither a .gguf file nor a Hugging Face folder with a config.json")
