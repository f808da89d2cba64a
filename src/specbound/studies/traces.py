"""A real generation and the exact (target, draft) distributions along it.

``generate_trace`` samples a continuation with the engine (``specbound.engine.Decoder``):
with a lossless method its law is the target's. ``next_token_probs`` then scores the whole
generated sequence with **one** forward of a model: row t is the model's next-token law
after the prompt and the first t generated tokens, through the same ``Processing`` as the
engine used (the one place logits become probabilities), in float64 and renormalised.
Every exact quantity of the studies is computed from these rows, so "exact" means exact
for the rows of this forward.

The scoring forward runs in float32 (``SCORING_DTYPE``): a bfloat16 model's weights are
exactly representable in float32, the result is the model's function with less rounding,
and on CPUs without native bfloat16 matrix units a long float32 forward is several times
faster (about 4× for the default target over ~270 tokens on the development machine). The
model is cast back afterwards, so the engine keeps running in the model's own dtype, and
the logits are rounded to that dtype, the precision the model's outputs have in the engine
(a bfloat16 model's logits take few distinct values, which the exact RRS-without-
replacement algorithm exploits). The rows differ from the engine's step-by-step
probabilities by the internal rounding of the two forwards (mean TV about 1e-3 per
position for the default pair in bfloat16).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from specbound.engine import CausalLM, Decoder, Method, ModelDrafter, Processing, RunStats
from specbound.studies.pair import ModelPair

SCORING_DTYPE = torch.float32


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


def next_token_probs(model: torch.nn.Module, prompt_ids, tokens, processing: Processing) -> np.ndarray:
    """Row t = law of token t given the prompt and tokens[:t], from one forward over
    prompt + tokens[:-1] (logits kept for the last len(tokens) positions only), computed in
    ``SCORING_DTYPE``, logits rounded to the model's dtype; rows in float64, renormalised.
    # -> [len(tokens), vocab] float64"""
    if not tokens:
        raise ValueError("tokens: expected at least one generated token")
    parameter = next(model.parameters())
    input_ids = torch.tensor([list(prompt_ids) + list(tokens[:-1])], device=parameter.device)
    with torch.no_grad(), computing_in(model, SCORING_DTYPE):
        logits = model(input_ids=input_ids, logits_to_keep=len(tokens)).logits[0]
    logits = logits.to(parameter.dtype).float().cpu()  # the precision the model's outputs have
    probs = processing.probs(logits).to(torch.float64)
    return (probs / probs.sum(dim=-1, keepdim=True)).numpy()


def trace_probs(pair: ModelPair, trace: Trace, processing: Processing) -> tuple[np.ndarray, np.ndarray]:
    """(target rows, draft rows) along the trace, one forward of each model.
    # -> [T, vocab], [T, vocab] float64"""
    target_rows = next_token_probs(pair.target, trace.prompt_ids, trace.tokens, processing)
    draft_rows = next_token_probs(pair.draft, trace.prompt_ids, trace.tokens, processing)
    return target_rows, draft_rows


def checked_generation_settings(temperatures, max_new_tokens, top_k, top_p) -> list[float]:
    """Check a study's generation settings before anything runs; return the temperatures
    as floats. Raises ValueError naming the bad setting."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: expected a positive integer, got {max_new_tokens!r}")
    temperatures = [float(value) for value in temperatures]
    if not temperatures:
        raise ValueError("temperatures: expected at least one temperature")
    for temperature in temperatures:
        Processing(temperature=temperature, top_k=top_k, top_p=top_p)
    return temperatures


def generation_summary(pair: ModelPair, trace: Trace) -> dict:
    """The run record's description of a generation: tokens, text and the engine's counts
    (wall-clock figures left out: they go to the timings file)."""
    engine = {
        key: value for key, value in trace.stats.to_dict().items()
        if key not in ("seconds", "wall_seconds", "tokens_per_second")
    }
    return {
        "prompt_tokens": len(trace.prompt_ids),
        "tokens": trace.tokens,
        "text": pair.decode(trace.tokens),
        "finish_reason": trace.finish_reason,
        "engine": engine,
    }
