"""The (target, draft) model pair the engine decodes, as plain data.

A pair is two models one backend loaded (``engine.backends``), the vocabulary size their
probability rows are cut to (the shared tokenizer's, so that a token id means the same
string in both; for a draft with another tokenizer, the target's, and the tokens both share
as ``vocabulary``), the token ids that end a sequence, and the tokenizer's functions.
``models.pair.load_pair`` loads one from files; tests build one from tiny in-process models;
``engine.assembly.assemble`` makes a decoder of it. What differs between backends is asked
of ``backend``, never by its name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specbound.engine.backends import Backend, get_backend
from specbound.engine.vocabulary import SharedVocabulary

DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class ModelPair:
    target: object  # a model ``backend`` loaded: a torch module, a llama.cpp GGUF file
    draft: object | None  # the same kind of model; None: a target alone
    vocab_size: int  # probability rows keep the first vocab_size logits
    eos_token_ids: tuple[int, ...]
    encode: Callable[[str], list[int]]  # prompt text -> token ids the target is given (chat turn)
    decode: Callable[[list[int]], str] = lambda tokens, **options: " ".join(map(str, tokens))
    tokenize: Callable[[str], list[int]] | None = None  # plain text -> token ids, no template
    description: dict = field(default_factory=dict)  # model names, dtype: for the report
    target_twin: torch.nn.Module | None = None  # float32 copies (``models.pair``'s docstring)
    draft_twin: torch.nn.Module | None = None
    backend: Backend = field(default_factory=lambda: get_backend("torch"))  # a name is taken for its Backend
    vocabulary: SharedVocabulary | None = None  # a draft with another tokenizer: the tokens both share
    # (engine.vocabulary); None: one tokenizer, a token id means the same string in both

    def __post_init__(self):
        if isinstance(self.backend, str):
            object.__setattr__(self, "backend", get_backend(self.backend))

    @property
    def device(self) -> torch.device:
        return self.backend.device(self.target)

    @property
    def max_positions(self) -> int | None:
        """The longest sequence (prompt and new tokens) both models take (None if unknown)."""
        limits = [self.backend.max_positions(model) for model in (self.target, self.draft) if model is not None]
        return min((limit for limit in limits if limit is not None), default=None)

    def with_target(self, target) -> ModelPair:
        """The same pair with another target model (e.g. a quantised copy), its precision
        (``Backend.cost_precision``) in the description."""
        return dataclasses.replace(self, target=target, target_twin=None,
                                   description={**self.description,
                                                "target_precision": self.backend.precision_of(target)})

    def to(self, device) -> ModelPair:
        """The pair on ``device`` ("cpu", "cuda", ...)."""
        device = checked_device(device)
        move = (lambda model: None if model is None else self.backend.to(model, device))
        return dataclasses.replace(self, target=move(self.target), draft=move(self.draft),
                                   target_twin=move(self.target_twin), draft_twin=move(self.draft_twin))


def checked_device(device) -> torch.device:
    """``device`` ("cpu", "cuda", "cuda:1" or a torch device of those types) as a torch
    device, refused (TypeError or ValueError naming it) where it is none or torch cannot use it."""
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device: expected one of {', '.join(DEVICES)} (str or torch.device), got {type(device).__name__}")
    try:
        device = torch.device(device)
    except RuntimeError:
        raise ValueError(f"device: expected one of {', '.join(DEVICES)}, got {device!r}") from None
    if device.type not in DEVICES:
        raise ValueError(f"device: expected one of {', '.join(DEVICES)}, got {str(device)!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: cuda asked for, but torch sees no CUDA device on this machine")
    return device
