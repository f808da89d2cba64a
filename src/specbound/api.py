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

A prompt and ``max_new_tokens`` that do not fit the models' context are refused before any
forward. A long prompt is prefilled in chunks (``engine.lm``); with ``progress`` its
predicted seconds (from this machine's measured forward costs, when they are known) and a
progress bar per model go to standard error.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from specbound.checks import finite_number, positive_int, unicode_text
from specbound.engine import Processing, RunStats, build_method
from specbound.engine.lm import PREFILL_CHUNK
from specbound.engine.planner import Planner
from specbound.models.precisions import AS_LOADED, PRECISIONS


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
    ``target_precision`` (``models.precisions.PRECISIONS``): "as-loaded" (the model itself, at
    ``dtype`` or a GGUF file's own types) or a weight-only "int8"/"int4" copy (CPU only) —
    never changed unless asked; ``draft_precisions``: the draft precisions the planner may
    use, forward by forward ("bf16", their old name for "as-loaded", is accepted);
    ``device``: "cpu" or "cuda"; ``backend``: "llama.cpp" (GGUF files on llama.cpp's kernels,
    as they are: precisions and dtype are the file's), "torch" or "auto" (llama.cpp where it
    applies: ``specbound.models.backends``); ``cache_dir``: where quantised copies and
    measured costs are kept (default ``models.gguf.default_cache_dir``); ``progress``:
    progress bars on standard error while models load and long prompts prefill."""

    def __init__(self, target: str = "default-target", draft: str | None = "default-draft",
                 dtype: torch.dtype = torch.bfloat16, target_precision: str = AS_LOADED,
                 draft_precisions=PRECISIONS, device: str = "cpu", progress: bool = True,
                 drafter: str = "model", pair=None, backend: str = "auto", cache_dir=None):
        from specbound.models.backends import resolve_backend
        from specbound.models.gguf import default_cache_dir
        from specbound.models.pair import checked_device, load_pair
        from specbound.models.precisions import precision_name
        from specbound.models.quantize import quantize

        if drafter not in ("model", "prompt-lookup"):
            raise ValueError(f"drafter: expected 'model' or 'prompt-lookup', got {drafter!r}")
        target_precision = precision_name(target_precision, "target_precision")
        self.draft_precisions = tuple(dict.fromkeys(precision_name(precision, "draft_precisions")
                                                    for precision in draft_precisions))
        device = checked_device(device)  # before any model loads
        if target_precision != AS_LOADED and device.type != "cpu":
            raise ValueError(f"target_precision: {target_precision} runs on CPU kernels only; on {device.type} keep "
                             f"the target {AS_LOADED} (target_precision={AS_LOADED!r}, --target-precision "
                             f"{AS_LOADED})")
        if backend == "auto" and target_precision != AS_LOADED:
            backend = "torch"  # the weight-only int8/int4 copies are torch's
        self.backend = pair.backend if pair is not None else resolve_backend(
            backend, [target, None if drafter == "prompt-lookup" else draft], device)
        if self.backend == "llama.cpp" and target_precision != AS_LOADED:
            raise ValueError(f"target_precision: the llama.cpp backend runs the GGUF file at its own quantisation; "
                             f"{target_precision} needs backend='torch'")
        if drafter == "prompt-lookup":
            draft = None
        elif (pair.draft if pair is not None else draft) is None:
            drafter = None  # the target alone: autoregressive decoding only
        self.drafter = drafter
        self.progress = progress
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.pair = (pair or load_pair(target, draft, dtype, progress=progress, float32_twins=False,
                                       backend=self.backend)).to(device)
        if target_precision != AS_LOADED:  # kept in the cache, as the draft's copies are
            self.pair = self.pair.with_target(quantize(self.pair.target, target_precision, cache_dir=self.cache_dir))
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
        check_context(len(prompt_ids), max_new_tokens, self.pair.max_positions)
        decoder, plan = self.decoder_for(processing, method, method_options)
        if self.progress and len(prompt_ids) > PREFILL_CHUNK:
            print(f"specbound: prefilling {len(prompt_ids):,} prompt tokens{self._prefill_estimate(len(prompt_ids))}",
                  file=sys.stderr)
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
                self._decoders[key] = self.pair.auto_decoder(processing, self.draft_precisions, self.cache_dir)
            else:
                built = build_method(method, **options)
                if built.depth and self.drafter is None:
                    raise ValueError(f"method: {method} drafts, but no draft model was loaded and the drafter is "
                                     "not prompt-lookup")
                self._decoders[key] = (self.pair.decoder(processing, self.drafter if built.depth else None), built)
            decoder = self._decoders[key][0]
            drafts = decoder.drafter.language_models if decoder.drafter is not None else []
            for name, lm in [("target", decoder.target)] + [("draft", lm) for lm in drafts]:
                lm.prefill_progress = PrefillBar(f"prefill {name}") if self.progress else None
        return self._decoders[key]

    def _prefill_estimate(self, tokens: int) -> str:
        """', at least about N s on this machine' for a prefill of ``tokens`` by both models,
        from the measured costs in the cache (``engine.costs.prefill_seconds``), or '' where
        they are unknown."""
        from specbound.engine.costs import CostBook, prefill_seconds

        book = CostBook(self.cache_dir / "costs.json")
        models = [model for model in (self.pair.target, self.pair.draft if self.drafter == "model" else None)
                  if model is not None]
        costs = [book.known(model, self.pair.cost_precision(model), self.pair.device) for model in models]
        if any(cost is None for cost in costs):
            return ""
        seconds = sum(prefill_seconds(cost, tokens) for cost in costs)
        return (f", at least about {seconds:,.{1 if seconds < 10 else 0}f} s on this machine (from its measured "
                "forward costs, which leave out the attention's growth with the prompt)")


class PrefillBar:
    """A progress bar on standard error for a prefill in chunks, told (tokens done,
    tokens) after each (``CausalLM.prefill_progress``): opened at the first, closed at the
    last."""

    def __init__(self, label: str):
        self.label = label
        self.bar = None

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            self.bar = tqdm(total=total, desc=self.label, unit="token", file=sys.stderr, dynamic_ncols=True)
        self.bar.update(done - self.bar.n)
        if done >= total:
            self.bar.close()
            self.bar = None


def check_context(prompt_tokens: int, max_new_tokens: int, max_positions: int | None, prompt: str = "prompt") -> None:
    """Refuse (ValueError naming ``prompt`` or ``max_new_tokens``) a prompt of
    ``prompt_tokens`` tokens and ``max_new_tokens`` that do not fit in ``max_positions``."""
    if max_positions is None or prompt_tokens + max_new_tokens <= max_positions:
        return
    if prompt_tokens >= max_positions:
        raise ValueError(f"{prompt}: {prompt_tokens:,} tokens, and the models' context holds {max_positions:,} "
                         "positions with the new tokens: shorten the prompt")
    raise ValueError(f"max_new_tokens: {max_new_tokens:,} new tokens after the {prompt}'s {prompt_tokens:,} exceed the "
                     f"models' context of {max_positions:,} positions; ask for at most "
                     f"{max_positions - prompt_tokens:,} (--max-new-tokens)")


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
