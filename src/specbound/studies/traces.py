"""A real generation and the exact (target, draft) distributions along it.

``generate_trace`` samples a continuation with the engine (``specbound.engine.Decoder``):
with a lossless method its law is the target's. The engine hands back the target law each
token was emitted under (``record_target_probs``): those are the target rows p_t, the very
distributions the generation sampled from, at no extra cost. ``next_token_probs`` scores
the whole generated sequence with **one** forward of the draft model: row t is its
next-token law after the prompt and the first t generated tokens, through the same
``Processing`` as the engine used (the one place logits become probabilities). Rows are
float64 and renormalised. Every exact quantity of the studies is computed from these rows,
so "exact" means exact for these rows.

The scoring forward runs in float32 (``SCORING_DTYPE``): a bfloat16 model's weights are
exactly representable in float32, the result is the model's function with less rounding,
and on CPUs without native bfloat16 matrix units a long float32 forward is the faster one
(``engine.backends.torch.float32_beats_bf16`` measures which is, on the CPU it runs on). On
torch the model is cast back afterwards (``Backend.sequence_logits``), so the engine keeps
running in the model's own dtype, and
the logits are rounded to that dtype, the precision the model's outputs have in the engine
(a bfloat16 model's logits take few distinct values, which the exact RRS-without-
replacement algorithm exploits). The draft rows differ from the draft's step-by-step
probabilities in the engine by the internal rounding of the two forwards (mean TV about
1e-3 per position for the default pair in bfloat16).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from specbound.checks import positive_int
from specbound.engine import Method, Processing, RunStats
from specbound.engine.backends import backend_of
from specbound.models.pair import ModelPair

SCORING_DTYPE = torch.float32


@dataclass(frozen=True)
class Trace:
    prompt_ids: list[int]
    tokens: list[int]  # generated tokens, EOS included when it ended the sequence
    finish_reason: str  # "eos" or "length"
    stats: RunStats  # the engine's counts for this generation
    # the target law of each token as the engine sampled from it; ``target_rows`` gives it in float64
    target_probs: torch.Tensor | None = None  # [len(tokens), vocab] float32
    seconds: float = 0.0  # wall-clock of the generation (its share of a batch's)

    def target_rows(self) -> np.ndarray:
        """The recorded target laws in float64, each row renormalised: made when a unit is
        scored, not when its batch is decoded, so a batch holds its rows in float32 (half the
        memory) until each unit's turn. # -> [len(tokens), vocab] float64"""
        if self.target_probs is None:
            raise ValueError("trace: it has no recorded target laws (record_target_probs)")
        return _renormalised(self.target_probs)


@dataclass(frozen=True)
class TraceRequest:
    """How a unit's text is generated: units with equal requests decode together."""

    processing: Processing
    method: Method
    max_new_tokens: int
    stop_at_eos: bool = True

    @property
    def key(self) -> tuple:
        return (self.processing, self.method.name, self.max_new_tokens, self.stop_at_eos)


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
    return generate_traces(pair, TraceRequest(processing, method, max_new_tokens, stop_at_eos), [prompt_ids],
                           [generator])[0]


def generate_traces(pair: ModelPair, request: TraceRequest, prompts: list[list[int]],
                    generators: list[torch.Generator]) -> list[Trace]:
    """The generations of several prompts decoded together (``Decoder.generate_batch``):
    each has exactly the tokens it gets alone with its generator; the batch's wall time is
    shared out equally."""
    from specbound.engine.assembly import assemble

    decoder = assemble(pair, request.processing, request.method, stop_at_eos=request.stop_at_eos).decoder
    started = time.perf_counter()
    generations = decoder.generate_batch(prompts, request.method, request.max_new_tokens, generators,
                                         record_target_probs=True)
    share = (time.perf_counter() - started) / len(prompts)
    return [Trace(list(prompt), generation.tokens, generation.finish_reason, generation.stats,
                  generation.target_probs, share)
            for prompt, generation in zip(prompts, generations)]


def _renormalised(probs: torch.Tensor) -> np.ndarray:
    probs = probs.to(torch.float64, copy=True)  # a copy even of float64 rows: divided in place below
    return probs.div_(probs.sum(dim=-1, keepdim=True)).numpy()


def next_token_probs(model, prompt_ids, tokens, processing: Processing, twin=None) -> np.ndarray:
    """Row t = law of token t given the prompt and tokens[:t], from one forward over
    prompt + tokens[:-1] (logits kept for the last len(tokens) positions only) on the
    model's backend (``Backend.sequence_logits``): in ``SCORING_DTYPE`` where the backend
    converts weights (by ``twin``, the model's float32 copy, when given; else by casting the
    model), logits rounded to the model's dtype; a GGUF file at its own types on llama.cpp.
    Rows in float64, renormalised.  # -> [len(tokens), vocab] float64"""
    if not tokens:
        raise ValueError("tokens: expected at least one generated token")
    logits = backend_of(model).sequence_logits(model, list(prompt_ids) + list(tokens[:-1]), len(tokens),
                                               SCORING_DTYPE, twin)
    return _renormalised(processing.probs(logits))


def trace_probs(pair: ModelPair, trace: Trace, processing: Processing) -> tuple[np.ndarray, np.ndarray]:
    """(target rows, draft rows) along the trace: the target laws the engine recorded
    (one scoring forward of the target when the trace has none), one forward of the draft.
    # -> [T, vocab], [T, vocab] float64"""
    check_one_tokenizer(pair)
    if trace.target_probs is not None:
        target_rows = trace.target_rows()
    else:
        target_rows = next_token_probs(pair.target, trace.prompt_ids, trace.tokens, processing, pair.target_twin)
    draft_rows = next_token_probs(pair.draft, trace.prompt_ids, trace.tokens, processing, pair.draft_twin)
    return target_rows, draft_rows


def check_one_tokenizer(pair: ModelPair) -> None:
    """Refuse a pair whose draft has another tokenizer (``pair.vocabulary``): a study scores
    the target's token ids with the draft, so it compares p and q token by token only where a
    token id means the same string in both models."""
    if pair.vocabulary is not None:
        raise ValueError("draft: a study compares p and q token by token and needs the target's tokenizer; "
                         "a draft with another tokenizer drafts in run, generate and serve")


def checked_generation_settings(temperatures, max_new_tokens, top_k, top_p) -> list[float]:
    """Check a study's generation settings before anything runs; return the temperatures
    as floats. Raises ValueError naming the bad setting."""
    positive_int("max_new_tokens", max_new_tokens)
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
        if key not in ("seconds", "wall_seconds", "tokens_per_second", "model_seconds", "outside_models")
    }
    return {
        "prompt_tokens": len(trace.prompt_ids),
        "tokens": trace.tokens,
        "text": pair.decode(trace.tokens),
        "finish_reason": trace.finish_reason,
        "engine": engine,
    }
