"""The (target, draft) model pair a study runs on, with its tokenizer.

A study needs the two models, the vocabulary size their probability rows are cut to (the
shared tokenizer's, so that a token id means the same string in both), the token ids that
end a sequence, and a way to turn a prompt's text into ids. ``load_pair`` builds it from
``specbound.models`` (embedded default pair, GGUF files or Hugging Face directories);
tests build one from tiny in-process models.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specbound.engine.chat import encode_prompt, stop_token_ids


@dataclass(frozen=True)
class ModelPair:
    target: torch.nn.Module
    draft: torch.nn.Module
    vocab_size: int  # probability rows keep the first vocab_size logits
    eos_token_ids: tuple[int, ...]
    encode: Callable[[str], list[int]]  # prompt text -> token ids the target is given
    decode: Callable[[list[int]], str] = lambda tokens: " ".join(map(str, tokens))
    description: dict = field(default_factory=dict)  # model names, dtype: for the report


def load_pair(target: str, draft: str, dtype: torch.dtype = torch.bfloat16, progress: bool = True) -> ModelPair:
    """Load both models offline (``specbound.models.load_model``), check their shared
    vocabulary, and encode prompts as the engine's ``chat`` does (the chat template as one
    user turn when the tokenizer has one — the default pair are instruct models)."""
    from specbound.models import check_shared_vocabulary, load_model

    target_loaded = load_model(target, dtype=dtype, progress=progress)
    draft_loaded = load_model(draft, dtype=dtype, progress=progress)
    vocab_size = check_shared_vocabulary(target_loaded, draft_loaded)
    tokenizer = target_loaded.tokenizer
    eos_token_ids = tuple(sorted(stop_token_ids(tokenizer, target_loaded.model)))
    return ModelPair(
        target=target_loaded.model,
        draft=draft_loaded.model,
        vocab_size=vocab_size,
        eos_token_ids=eos_token_ids,
        encode=functools.partial(encode_prompt, tokenizer),
        decode=tokenizer.decode,
        description={
            "target": target,
            "draft": draft,
            "dtype": str(dtype).removeprefix("torch."),
            "vocab_size": vocab_size,
            "eos_token_ids": list(eos_token_ids),
            "prompt_format": "chat template, one user turn" if tokenizer.chat_template else "raw text",
        },
    )
