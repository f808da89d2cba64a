"""One call from a prompt to text: ``specbound.generate``, in the conventions of transformers'
``generate`` where they fit (``max_new_tokens``, ``temperature``, ``top_k``, ``top_p``, a
streamer with ``put``/``end``).

    from specbound import Speculator
    speculator = Speculator()                       # the embedded Qwen2.5-Coder pair
    result = speculator.generate("Write a haiku about rain.", max_new_tokens=64)
    print(result.text, result.stats.tokens_per_second)

``Speculator`` loads the pair once (``specbound.models.pair``), measures this machine's
forward costs once (kept in the cache) and keeps the planner's acceptance estimates across
calls; ``method="auto"`` (the default) lets the planner choose the method step by step, any
name of ``specbound.engine.METHODS`` with its options fixes it. Decoding is lossless: the
text has the target model's law under the sampling settings.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbound.checks import finite_number, positive_int, unicode_text
from specbound.engine import Processing, RunStats, build_method
from specbound.engine.planner import Planner


@dataclass
class Result:
    tokens: list[int]  # the new tokens
    text: str  # their text
    finish_reason: str  # "eos" or "length"
    stats: RunStats  # counts, acceptance, seconds
    plan: str = ""  # with method="auto": the plans chosen and their predicted tokens/s


class Speculator:
    """A loaded (target, draft) pair ready to decode (module docstring).

    ``target``/``draft``: embedded model names, ``.gguf`` files or Hugging Face folders
    (``draft=None``: the target alone, for ``autoregressive`` or prompt lookup);
    ``drafter``: "model" (the draft model) or "prompt-lookup" (n-grams of the prompt and the
    text so far; no draft model is loaded); ``dtype``: the models' floating dtype;
    ``target_precision``: "bf16" (as loaded) or a weight-only "int8"/"int4" target — never
    changed unless asked; ``draft_precisions``: the draft variants the planner may use,
    forward by forward; ``device``: "cpu" or "cuda"; ``backend``: "llama.cpp" (GGUF files on
    llama.cpp's kernels, as they are: precisions and dtype are the file's), "torch" or "auto"
    (llama.cpp where it applies: ``specbound.models.backends``)."""

    def __init__(self, target: str = "default-target", draft: str | None = "default-draft",
                 dtype: torch.dtype = torch.bfloat16, target_precision: str = "bf16",
                 draft_precisions=("bf16", "int8", "int4"), device: str = "cpu", progress: bool = True,
                 drafter: str = "model", pair=None, backend: str = "auto"):
        from specbound.models.backends import resolve_backend
        from specbound.models.pair import checked_device, load_pair
        from specbound.models.quantize import quantize

        if drafter not in ("model", "prompt-lookup"):
            raise ValueError(f"drafter: expected 'model' or 'prompt-lookup', got {drafter!r}")
        checked_device(device)  # before any model loads
        if backend == "auto" and target_precision != "bf16":
            backend = "torch"  # the weight-only int8/int4 copies are torch's
        self.backend = pair.backend if pair is not None else resolve_backend(
            backend, [target, None if drafter == "prompt-lookup" else draft], device)
        if self.backend == "llama.cpp" and target_precision != "bf16":
            raise ValueError(f"target_precision: the llama.cpp backend runs the GGUF file at its own quantisation; "
                             f"{target_precision} needs backend='torch'")
        if drafter == "prompt-lookup":
            draft = None
        elif (pair.draft if pair is not None else draft) is None:
            drafter = None  # the target alone: autoregressive decoding only
        self.drafter = drafter
        self.pair = pair or load_pair(target, draft, dtype, progress=progress, float32_twins=False,
                                      backend=self.backend)
        if target_precision != "bf16":
            self.pair = self.pair.with_target(quantize(self.pair.target, target_precision))
        self.pair = self.pair.to(device)
        self.draft_precisions = tuple(draft_precisions)
        self._decoders = {}

    def generate(self, prompt: str | list[int], max_new_tokens: int = 128, temperature: float = 0.7,
                 top_k: int | None = None, top_p: float | None = None, method: str = "auto", seed: int = 0,
                 streamer=None, chat: bool = True, **method_options) -> Result:
        """Decode ``prompt`` (text, formatted with the chat template when ``chat``, or token
        ids as they are)."""
        if isinstance(prompt, str):
            unicode_text("prompt", prompt)
        positive_int("max_new_tokens", max_new_tokens)
        finite_number("temperature", temperature, 0.0)
        processing = Processing(temperature, top_k, top_p, self.pair.vocab_size)
        prompt_ids = self.pair.encode(prompt) if isinstance(prompt, str) and chat else (
            self.pair.tokenize(prompt) if isinstance(prompt, str) else [int(token) for token in prompt])
        decoder, plan = self.decoder_for(processing, method, method_options)
        generation = decoder.generate(prompt_ids, plan, max_new_tokens, torch.Generator().manual_seed(seed),
                                      streamer=streamer)
        text = self.pair.decode(generation.tokens, skip_special_tokens=True)
        described = plan.describe() if isinstance(plan, Planner) else ""
        return Result(generation.tokens, text, generation.finish_reason, generation.stats, described)

    def decoder_for(self, processing: Processing, method: str = "auto", options: dict | None = None):
        """(decoder, plan) for these sampling settings and ``method`` ("auto": the plan is a
        ``Planner``, kept with its acceptance estimates for the next calls; otherwise the
        built ``Method``); decode with ``decoder.generate(prompt_ids, plan, ...)``."""
        options = options or {}
        key = (processing, method, tuple(sorted(options.items())))
        if key not in self._decoders:
            if method == "auto":  # without a draft model it plans between plain decoding and prompt lookup
                self._decoders[key] = self.pair.auto_decoder(processing, self.draft_precisions)
            else:
                built = build_method(method, **options)
                if built.depth and self.drafter is None:
                    raise ValueError(f"method: {method} drafts, but no draft model was loaded and the drafter is "
                                     "not prompt-lookup")
                self._decoders[key] = (self.pair.decoder(processing, self.drafter if built.depth else None), built)
        return self._decoders[key]


def generate(prompt, max_new_tokens: int = 128, temperature: float = 0.7, top_k: int | None = None,
             top_p: float | None = None, method: str = "auto", seed: int = 0, streamer=None,
             target: str = "default-target", draft: str | None = "default-draft", **options) -> Result:
    """``Speculator(target, draft).generate(prompt, ...)`` in one call (loads the models:
    keep a ``Speculator`` to decode several prompts)."""
    if isinstance(prompt, str):
        unicode_text("prompt", prompt)  # before the models load
    positive_int("max_new_tokens", max_new_tokens)
    return Speculator(target, draft).generate(prompt, max_new_tokens, temperature, top_k, top_p, method, seed,
                                              streamer, **options)
