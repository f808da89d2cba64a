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
forward. A long prompt is prefilled in chunks (``engine.backends.torch``); with ``progress`` its
predicted seconds (from this machine's measured forward costs, when they are known) and a
progress bar per model go to standard error.
"""

from __future__ import annotations

import numbers
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
from tqdm import tqdm

from specbound.checks import positive_int, seed_value, unicode_text
from specbound.engine import RunStats, build_method
from specbound.engine.assembly import assemble
from specbound.engine.backends import PREFILL_CHUNK
from specbound.engine.method_text import parse_method
from specbound.engine.methods import method_options
from specbound.engine.optimum import BUDGET as OPTIMUM_BUDGET
from specbound.engine.pair import ModelPair, checked_device
from specbound.engine.precisions import AS_LOADED, PRECISIONS, precision_name
from specbound.engine.processing import Processing, Sampling
from specbound.models import DTYPES as DTYPE_NAMES
from specbound.paths import default_cache_dir

DRAFTERS = ("model", "prompt-lookup", "suffix")
DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}  # the models' dtypes, by their names in torch


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
    ``drafter``: "model" (the draft model), "prompt-lookup" (n-grams of the prompt and the
    text so far) or "suffix" (suffix decoding: trees of what followed the context's suffix in
    the prompt, the text so far and the earlier outputs of the same method and sampling
    settings, ``engine.suffix``); neither of the last two loads a draft model; ``dtype``: the
    models' floating dtype, ``torch.bfloat16`` or ``torch.float32`` (or their names);
    ``target_precision`` (``engine.precisions.PRECISIONS``): "as-loaded" (the model itself, at
    ``dtype`` or a GGUF file's own types) or a weight-only "int8"/"int4" copy (CPU only) —
    never changed unless asked; ``draft_precisions``: the draft precisions the planner may
    use, forward by forward ("bf16", their old name for "as-loaded", is accepted);
    ``device``: "cpu" or "cuda"; ``backend``: "llama.cpp" (GGUF files on llama.cpp's kernels,
    as they are: precisions and dtype are the file's), "torch" or "auto" (llama.cpp where it
    applies: ``specbound.models.backends``); ``cache_dir``: where quantised copies and
    measured costs are kept (default ``paths.default_cache_dir``); ``progress``:
    progress bars on standard error while models load and long prompts prefill.

    Every argument is checked before any model loads: a TypeError or ValueError names it."""

    def __init__(self, target: str = "default-target", draft: str | None = "default-draft",
                 dtype: torch.dtype = torch.bfloat16, target_precision: str = AS_LOADED,
                 draft_precisions=PRECISIONS, device: str = "cpu", progress: bool = True,
                 drafter: str = "model", pair=None, backend: str = "auto", cache_dir=None):
        from specbound.models.backends import resolve_backend

        if pair is not None and not isinstance(pair, ModelPair):
            raise TypeError(f"pair: expected a ModelPair (specbound.models.pair.load_pair) or None, got "
                            f"{type(pair).__name__}")
        if pair is None:
            model_source("target", target)
            if draft is not None:
                model_source("draft", draft)
        dtype = checked_dtype(dtype)
        if drafter not in DRAFTERS:
            raise ValueError(f"drafter: expected one of {', '.join(map(repr, DRAFTERS))}, got {drafter!r}")
        target_precision = precision_name(target_precision, "target_precision")
        if isinstance(draft_precisions, (str, bytes)) or not isinstance(draft_precisions, (list, tuple, set, frozenset)):
            raise TypeError(f"draft_precisions: expected a list of precision names (of {', '.join(PRECISIONS)}), "
                            f"got {type(draft_precisions).__name__}")
        if not draft_precisions:
            raise ValueError(f"draft_precisions: expected at least one of {', '.join(PRECISIONS)}")
        self.draft_precisions = tuple(dict.fromkeys(precision_name(precision, "draft_precisions")
                                                    for precision in draft_precisions))
        device = checked_device(device)  # before any model loads
        if not isinstance(progress, bool):
            raise TypeError(f"progress: expected True or False, got {progress!r}")
        if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
            raise TypeError(f"cache_dir: expected a folder (str or os.PathLike) or None, got {type(cache_dir).__name__}")
        if target_precision != AS_LOADED and device.type != "cpu":
            raise ValueError(f"target_precision: {target_precision} runs on CPU kernels only; on {device.type} keep "
                             f"the target {AS_LOADED} (target_precision={AS_LOADED!r}, --target-precision "
                             f"{AS_LOADED})")
        sources = [target, None if drafter in ("prompt-lookup", "suffix") else draft]
        self.backend = pair.backend if pair is not None else resolve_backend(backend, sources, device,
                                                                             target_precision)
        if target_precision not in self.backend.precisions(device):
            raise ValueError(f"target_precision: the {self.backend.name} backend runs a model "
                             f"{' or '.join(self.backend.precisions(device))} on {device.type}, not "
                             f"{target_precision}: choose another backend")
        if drafter in ("prompt-lookup", "suffix"):
            draft = None
        elif (pair.draft if pair is not None else draft) is None:
            drafter = None  # the target alone: autoregressive decoding only
        self.drafter = drafter
        self.progress = progress
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        from specbound.models.pair import load_pair  # after every check: it imports transformers

        self.pair = (pair or load_pair(target, draft, dtype, progress=progress, float32_twins=False,
                                       backend=self.backend)).to(device)
        if target_precision != AS_LOADED:  # kept in the cache, as the draft's copies are
            self.pair = self.pair.with_target(self.backend.at_precision(self.pair.target, target_precision,
                                                                        self.cache_dir))
        self._decoders = {}

    def generate(self, prompt: str | list[int], max_new_tokens: int = 128, temperature: float = 0.7,
                 top_k: int | None = None, top_p: float | None = None, method: str = "auto", seed: int = 0,
                 streamer=None, chat: bool = True, **method_options) -> Result:
        """Decode ``prompt`` (text, formatted with the chat template when ``chat``, or a list
        of token ids as they are). ``method``: "auto", a method's name, or its name with
        options as the command line writes it ('chain:gamma=3'); ``method_options``: the
        options of ``method`` as keywords (none for "auto"), each given once, in the text or
        as a keyword; any other keyword is refused, naming it."""
        request = check_request(prompt, max_new_tokens, temperature, top_k, top_p, method, seed, streamer, chat,
                                method_options)
        if isinstance(prompt, str):
            prompt_ids = self.pair.encode(prompt) if chat else self.pair.tokenize(prompt)
        else:
            prompt_ids = token_ids(prompt)
            outside = [token for token in prompt_ids if token >= self.pair.vocab_size]
            if outside:
                raise ValueError(f"prompt: token ids must lie in [0, {self.pair.vocab_size}) (the models' vocabulary), "
                                 f"got {outside[0]}")
        check_context(len(prompt_ids), max_new_tokens, self.pair.max_positions)
        decoder, plan = self.decoder_for(request.sampling, request.method, request.options)
        if self.progress and len(prompt_ids) > PREFILL_CHUNK:
            print(f"specbound: prefilling {len(prompt_ids):,} prompt tokens{self._prefill_estimate(len(prompt_ids))}",
                  file=sys.stderr)
        plans_before = plan.plans_made
        generation = decoder.generate(prompt_ids, plan, max_new_tokens, request.generator, streamer=streamer)
        text = self.pair.decode(generation.tokens, skip_special_tokens=True)
        return Result(generation.tokens, text, generation.finish_reason, generation.stats,
                      plan.describe(since=plans_before))

    def decoder_for(self, sampling: Sampling, method: str = "auto", options: dict | None = None):
        """(decoder, plan) for the sampling settings ``sampling`` and ``method`` ("auto": the
        plan is a ``Planner``, kept with its acceptance estimates for the next calls;
        otherwise the built ``Method``); decode with ``decoder.generate(prompt_ids, plan,
        ...)``. ``method`` and ``options`` as ``generate`` takes them: one decoder is kept
        for each setting, however its method is written. The decoder's ``Processing`` is
        made here, with the pair's vocabulary."""
        key = self._key(sampling, method, options)
        sampling, method, options = key[0], key[1], dict(key[2])
        if key not in self._decoders:
            processing = Processing.of(sampling, self.pair.vocab_size)
            built = method if method == "auto" else build_method(method, **options)
            if built != "auto" and built.depth and self.drafter is None:
                raise ValueError(f"method: {method} drafts, but no draft model was loaded and the drafter is not "
                                 "prompt-lookup or suffix")
            # under auto without a draft model the planner chooses between plain decoding and prompt lookup
            self._decoders[key] = assemble(self.pair, processing, built, self.drafter or "model",
                                           self.draft_precisions, self.cache_dir, optimum_budget=OPTIMUM_BUDGET,
                                           prefill_progress=PrefillBar if self.progress else None)
        return self._decoders[key]

    def release_decoder(self, sampling: Sampling, method: str = "auto", options: dict | None = None) -> None:
        """Forget the decoder ``decoder_for`` keeps for these arguments (its caches and, under
        "auto", its planner's estimates); the next ``decoder_for`` builds a new one. No-op
        where none is kept."""
        self._decoders.pop(self._key(sampling, method, options), None)

    @staticmethod
    def _key(sampling: Sampling, method, options: dict | None) -> tuple:
        """(sampling, method's name, its options sorted): what a kept decoder is found by."""
        if not isinstance(sampling, Sampling):
            raise TypeError(f"sampling: expected a Sampling, got {type(sampling).__name__}")
        method, options = method_and_options(method, options or {})
        return sampling, method, tuple(sorted(options.items()))

    def _prefill_estimate(self, tokens: int) -> str:
        """', at least about N s on this machine' for a prefill of ``tokens`` by both models,
        from the measured costs in the cache (``engine.costs.prefill_seconds``), or '' where
        they are unknown."""
        from specbound.engine.cost_book import CostBook
        from specbound.engine.costs import prefill_seconds

        book = CostBook(self.cache_dir / "costs.json")
        models = [model for model in (self.pair.target, self.pair.draft if self.drafter == "model" else None)
                  if model is not None]
        costs = [book.known(model, self.pair.backend.cost_precision(model), self.pair.device) for model in models]
        if any(cost is None for cost in costs):
            return ""
        seconds = sum(prefill_seconds(cost, tokens) for cost in costs)
        return (f", at least about {seconds:,.{1 if seconds < 10 else 0}f} s on this machine (from its measured "
                "forward costs, which leave out the attention's growth with the prompt)")


def model_source(name: str, source) -> str | os.PathLike:
    """``source`` (an embedded model's name, a ``.gguf`` file or a folder), refused
    (TypeError naming ``name``) unless it is a non-empty str or an os.PathLike."""
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"{name}: expected an embedded model's name, a .gguf file or a Hugging Face folder (str or "
                        f"os.PathLike), got {type(source).__name__}")
    if not str(source).strip():
        raise ValueError(f"{name}: expected an embedded model's name, a .gguf file or a Hugging Face folder, got an "
                         "empty string")
    return source


def checked_dtype(dtype) -> torch.dtype:
    """``dtype`` (a torch dtype or its name) as one of ``DTYPES``, else a TypeError or
    ValueError naming ``dtype``."""
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {', '.join(DTYPES)} (or torch.bfloat16, torch.float32), "
                             f"got {dtype!r}")
        return DTYPES[dtype]
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype: expected torch.bfloat16 or torch.float32 (or their names), got {type(dtype).__name__}")
    if dtype not in DTYPES.values():
        raise ValueError(f"dtype: expected torch.bfloat16 or torch.float32 (or their names), got {dtype}")
    return dtype


def token_ids(prompt) -> list[int]:
    """A prompt given as token ids, as a list of ints ≥ 0; anything else (bytes, floats,
    bools, a number alone) is a TypeError or ValueError naming ``prompt``."""
    if isinstance(prompt, (bytes, bytearray, memoryview)):
        raise TypeError(f"prompt: expected text (str) or a list of token ids (ints), got {type(prompt).__name__}; "
                        "decode bytes to text first")
    if torch.is_tensor(prompt):
        if prompt.dim() != 1 or prompt.dtype.is_floating_point or prompt.dtype.is_complex or prompt.dtype == torch.bool:
            raise TypeError(f"prompt: expected a 1-D tensor of integer token ids, got {prompt.dim()}-D {prompt.dtype}")
        prompt = prompt.tolist()
    if not isinstance(prompt, (list, tuple, range)):
        raise TypeError(f"prompt: expected text (str) or a list of token ids (ints), got {type(prompt).__name__}")
    if not prompt:
        raise ValueError("prompt: expected at least one token id")
    for token in prompt:
        if isinstance(token, bool) or not isinstance(token, numbers.Integral):
            raise TypeError(f"prompt: token ids must be ints, got {type(token).__name__} {token!r}")
        if token < 0:
            raise ValueError(f"prompt: token ids must be ≥ 0, got {token}")
    return [int(token) for token in prompt]


def method_and_options(method, options: dict) -> tuple[str, dict]:
    """``method`` — "auto", a method's name, or its name with options as the command line
    writes it ('chain:gamma=3', ``engine.method_text``) — and the keyword ``options`` as
    (name, options), checked and the method built: a keyword the method does not take is a
    TypeError naming it, an option given both in the text and as a keyword a ValueError."""
    if not isinstance(method, str):
        raise TypeError(f"method: expected 'auto' or a method's name (str), got {type(method).__name__}")
    name, *written = [part.strip() for part in method.split(":")]
    taken = [] if name == "auto" else method_options(name)  # an unknown method: ValueError naming it
    unknown = sorted(set(options) - set(taken))
    if unknown:
        raise TypeError(f"{unknown[0]}: generate() takes no argument {unknown[0]!r}, and method {name!r} takes "
                        + (f"no such option (its options: {', '.join(taken)})" if taken else "no options"))
    twice = sorted({pair.partition("=")[0].strip() for pair in written} & set(options))
    if twice:
        raise ValueError(f"{twice[0]}: given twice, in method={method!r} and as {twice[0]}={options[twice[0]]!r}; "
                         "give each option once")
    return parse_method(method, options)


class Request(NamedTuple):
    sampling: Sampling
    generator: torch.Generator  # seeded with the request's seed
    method: str  # "auto" or a method's name
    options: dict  # the method's options, from its text and the keywords


def check_request(prompt, max_new_tokens, temperature, top_k, top_p, method, seed, streamer, chat,
                  options: dict) -> Request:
    """Every argument of one ``generate`` call, checked before anything is encoded or
    loaded. A TypeError or ValueError names the argument at fault; ``options`` are the
    method's keywords (none for "auto"; ``method_and_options``)."""
    if isinstance(prompt, str):
        unicode_text("prompt", prompt)
    else:
        token_ids(prompt)
    positive_int("max_new_tokens", max_new_tokens)
    sampling = Sampling(temperature, top_k, top_p)
    method, options = method_and_options(method, options)
    seed = seed_value("seed", seed)
    if streamer is not None and not (callable(getattr(streamer, "put", None)) and callable(getattr(streamer, "end", None))):
        raise TypeError(f"streamer: expected an object with put() and end() (transformers' streamer interface), got "
                        f"{type(streamer).__name__}")
    if not isinstance(chat, bool):
        raise TypeError(f"chat: expected True or False, got {chat!r}")
    return Request(sampling, torch.Generator().manual_seed(seed), method, options)


class PrefillBar:
    """A progress bar on standard error for a prefill in chunks of the model of ``role``
    ("target", "draft"), told (tokens done, tokens) after each (``CausalLM.prefill_progress``):
    opened at the first, closed at the last."""

    def __init__(self, role: str):
        self.label = f"prefill {role}"
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
    keep a ``Speculator`` to decode several prompts). Every argument is checked before the
    models load, ``max_new_tokens`` against their context where their files say it
    (``models.context``)."""
    from specbound.models.context import check_fits_context

    check_request(prompt, max_new_tokens, temperature, top_k, top_p, method, seed, streamer, True, options)
    model_source("target", target)
    if draft is not None:
        model_source("draft", draft)
    check_fits_context(max_new_tokens, [target] + ([draft] if draft is not None else []))
    return Speculator(target, draft).generate(prompt, max_new_tokens, temperature, top_k, top_p, method, seed,
                                              streamer, **options)
