"""A real generation and the exact (target, draft) distributions along it.

``generate_trace`` samples a continuation with the engine (``specbound.engine.Decoder``):
with a lossless method its law is the target's. ``next_token_probs`` then scores the whole
generated sequence with **one** forward of a model: row t is the model's next-token law
after the prompt and the first t generated tokens, through the same ``Processing`` as the
engine used (the one place logits become probabilities). Every exact quantity of the
studies is computed from these rows, so "exact" means exact for the rows of this forward;
they agree with the engine's step-by-step probabilities up to the model dtype's rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specbound.engine import CausalLM, Decoder, Method, ModelDrafter, Processing, RunStats
from specbound.studies.pair import ModelPair


@dataclass(frozen=True)
class Trace:
    prompt_ids: list[int]
    tokens: list[int]  # generated tokens, EOS included when it ended the sequence
    finish_reason: str  # "eos" or "length"
    stats: RunStats  # the engine's counts for this generation


def generate_trace(
    pair: ModelPair,
    processing: Processing,
    method: Method,
    prompt_ids: list[int],
    max_new_tokens: int,
    generator: torch.Generator,
    stop_at_eos: bool = True,
) -> Trace:
    """One engine generation. ``stop_at_eos=False`` always runs to ``max_new_tokens`` (a
    fixed horizon T, as [YIN]'s Thm 1 and Thm 3 assume)."""
    drafter = ModelDrafter(CausalLM(pair.draft), processing) if method.depth > 0 else None
    eos_token_ids = pair.eos_token_ids if stop_at_eos else ()
    decoder = Decoder(CausalLM(pair.target), drafter, processing, eos_token_ids=eos_token_ids)
    generation = decoder.generate(prompt_ids, method, max_new_tokens, generator)
    return Trace(list(prompt_ids), generation.tokens, generation.finish_reason, generation.stats)


def next_token_probs(model: torch.nn.Module, prompt_ids, tokens, processing: Processing) -> np.ndarray:
    """Row t = law of token t given the prompt and tokens[:t], from one forward over
    prompt + tokens[:-1] (logits kept for the last len(tokens) positions only).
    # -> [len(tokens), vocab] float64"""
    if not tokens:
        raise ValueError("tokens: expected at least one generated token")
    input_ids = torch.tensor([list(prompt_ids) + list(tokens[:-1])], device=next(model.parameters()).device)
    with torch.no_grad():
        logits = model(input_ids=input_ids, logits_to_keep=len(tokens)).logits[0]
    return processing.probs(logits.float().cpu()).numpy()


def trace_probs(pair: ModelPair, trace: Trace, processing: Processing) -> tuple[np.ndarray, np.ndarray]:
    """(target rows, draft rows) along the trace, one forward of each model.
    # -> [T, vocab], [T, vocab] float64"""
    target_rows = next_token_probs(pair.target, trace.prompt_ids, trace.tokens, processing)
    draft_rows = next_token_probs(pair.draft, trace.prompt_ids, trace.tokens, processing)
    return target_rows, draft_rows
