"""The (target, draft) model pair a study runs on, with its tokenizer.

A study needs the two models, the vocabulary size their probability rows are cut to (the
shared tokenizer's, so that a token id means the same string in both), the token ids that
end a sequence, and a way to turn a prompt's text into ids. ``load_pair`` builds it from
``specbound.models.loading`` (embedded default pair, GGUF files or Hugging Face directories);
tests build one from tiny in-process models.

Float32 twins: on a CPU without bfloat16 matrix units (AVX2 only) a bf16 forward costs
time in proportion to its rows and emulates bf16, so a long prefill is several times faster
in float32, while one decoding step is fastest in bf16. With ``float32_twins`` a study keeps
an exact float32 copy of each bf16 model: it prefills the prompt
(``engine.CausalLM(prefill_model=)``) and runs the draft's scoring forward, and the bf16
model does every decoding step. Costs 4 bytes per parameter more memory. Where bf16 has
matrix units (AVX512-BF16, AMX) a twin prefills more slowly than bf16, so the decoders
prefill with a twin only where a long float32 product is measured faster than bf16
(``engine.costs.float32_beats_bf16``); the
scoring forward, float32 by definition (``studies.traces``), uses the twin everywhere.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from pathlib import Path
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specbound.models.chat import encode_prompt, stop_token_ids
from specbound.engine.precisions import AS_LOADED, PRECISIONS, precision_name
from specbound.models.quantize import precision_of, quantize


@dataclass(frozen=True)
class ModelPair:
    target: torch.nn.Module
    draft: torch.nn.Module | None  # None: a target alone
    vocab_size: int  # probability rows keep the first vocab_size logits
    eos_token_ids: tuple[int, ...]
    encode: Callable[[str], list[int]]  # prompt text -> token ids the target is given (chat turn)
    decode: Callable[[list[int]], str] = lambda tokens, **options: " ".join(map(str, tokens))
    tokenize: Callable[[str], list[int]] | None = None  # plain text -> token ids, no template
    description: dict = field(default_factory=dict)  # model names, dtype: for the report
    target_twin: torch.nn.Module | None = None  # float32 copies (module docstring)
    draft_twin: torch.nn.Module | None = None
    backend: str = "torch"  # "llama.cpp": target and draft are engine.llamacpp.LlamaCppModel files

    def language_model(self, model, twin=None, variants=None):
        """The engine's language model over ``model`` on this pair's backend: a
        ``CausalLM`` (torch, with its prefill twin where that pays, and its variants) or a
        ``LlamaCppLM``."""
        if self.backend == "llama.cpp":
            from specbound.engine.llamacpp import LlamaCppLM

            return LlamaCppLM(model)
        from specbound.engine import CausalLM

        return CausalLM(model, prefill_model=self.prefill_twin(twin), variants=variants)

    def with_target(self, target: torch.nn.Module) -> ModelPair:
        """The same pair with another target model (e.g. a quantised copy), its precision
        (``models.quantize.precision_of``) in the description."""
        return dataclasses.replace(self, target=target, target_twin=None,
                                   description={**self.description, "target_precision": precision_of(target)})

    @property
    def device(self) -> torch.device:
        return torch.device("cpu") if self.backend == "llama.cpp" else next(self.target.parameters()).device

    @property
    def max_positions(self) -> int | None:
        """The longest sequence (prompt and new tokens) both models take: their position
        embeddings, or a GGUF file's training context on llama.cpp (None if unknown)."""
        if self.backend == "llama.cpp":
            limits = [model.n_ctx_train or None for model in (self.target, self.draft) if model is not None]
        else:
            limits = [getattr(model.config.get_text_config(decoder=True), "max_position_embeddings", None)
                      for model in (self.target, self.draft) if model is not None]
        return min((limit for limit in limits if limit is not None), default=None)

    def to(self, device) -> ModelPair:
        """The pair on ``device`` ("cpu", "cuda", ...)."""
        device = checked_device(device)
        if self.backend == "llama.cpp":
            if device.type != "cpu":
                raise ValueError(f"device: the llama.cpp backend runs on the CPU, not {device}")
            return self
        move = (lambda model: None if model is None else model.to(device))
        return dataclasses.replace(self, target=move(self.target), draft=move(self.draft),
                                   target_twin=move(self.target_twin), draft_twin=move(self.draft_twin))

    @staticmethod
    def prefill_twin(twin: torch.nn.Module | None) -> torch.nn.Module | None:
        """``twin`` where a float32 prefill is measured faster than bf16 on this CPU, else None
        (module docstring)."""
        if twin is None or not isinstance(twin, torch.nn.Module) or next(twin.parameters()).device.type != "cpu":
            return None
        from specbound.engine.costs import float32_beats_bf16

        return twin if float32_beats_bf16() else None

    def decoder(self, processing, drafter: str = "model", stop_at_eos: bool = True):
        """An engine ``Decoder`` on this pair with ``processing``: drafting with the draft
        model (``"model"``), by prompt lookup (``"prompt-lookup"``), or not at all (``None``,
        autoregressive only). The float32 twins, when the pair has them, prefill where that
        is measured to pay (``prefill_twin``)."""
        from specbound.engine import Decoder, ModelDrafter, PromptLookupDrafter

        drafters = {
            "model": lambda: ModelDrafter(self.language_model(self.draft, self.draft_twin), processing),
            "prompt-lookup": lambda: PromptLookupDrafter(self.vocab_size, device=self.device),
            None: lambda: None,
        }
        if drafter not in drafters:
            raise ValueError(f"drafter: expected one of {[key for key in drafters if key]}, got {drafter!r}")
        if drafter == "model" and self.draft is None:
            raise ValueError("drafter: this pair was loaded without a draft model")
        target = self.language_model(self.target, self.target_twin)
        return Decoder(target, drafters[drafter](), processing, self.eos_token_ids if stop_at_eos else ())

    def auto_decoder(self, processing, draft_precisions=PRECISIONS, cache_dir=None, stop_at_eos: bool = True,
                     candidates=None):
        """A decoder whose method is chosen step by step by a ``Planner`` from this machine's
        measured forward costs (kept in ``<cache>/costs.json``) and the acceptance seen:
        returns (decoder, planner); decode with ``decoder.generate(..., planner, ...)``. The
        candidates draft with the draft model (when the pair has one) or by prompt lookup,
        whose drafts cost no forward. On torch on the CPU the draft runs each forward at the
        precision of ``draft_precisions`` (``engine.precisions.PRECISIONS``) measured fastest for
        its rows (its quantised copies are kept in the cache); elsewhere as loaded."""
        from specbound.engine import Decoder, ModelDrafter, PromptLookupDrafter
        from specbound.engine.costs import CostBook
        from specbound.engine.drafters import DrafterChoice
        from specbound.engine.planner import Planner, default_candidates
        from specbound.paths import default_cache_dir

        cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        book = CostBook(cache / "costs.json")
        device = self.device
        target_costs = book.costs(self.target, self.cost_precision(self.target), device)
        draft_costs, variants = {}, {}
        if self.draft is not None:
            quantizable = self.backend == "torch" and device.type == "cpu"  # llama.cpp: the file's own type
            named = {precision_name(precision, "draft_precisions") for precision in draft_precisions}
            chosen = named if quantizable else {AS_LOADED}
            variants = {precision: quantize(self.draft, precision, cache_dir=cache)
                        for precision in PRECISIONS if precision in chosen - {AS_LOADED}}
            models = {AS_LOADED: self.draft} | variants
            draft_costs = {precision: book.costs(model, self.cost_precision(model), device)
                           for precision, model in models.items() if precision in chosen}
        planner = Planner(target_costs, draft_costs, default_candidates(lookup=True) if candidates is None else candidates)
        eos = self.eos_token_ids if stop_at_eos else ()
        target = self.language_model(self.target, self.target_twin)
        batch_heads = target_costs(16) <= 2 * target_costs(1)  # rows nearly free: one head call per step
        drafters = {"lookup": PromptLookupDrafter(self.vocab_size, device=device)}
        if self.draft is not None:
            draft = self.language_model(self.draft, self.draft_twin, variants)
            drafters["model"] = ModelDrafter(draft, processing, planner.variant_for_rows)
        return Decoder(target, DrafterChoice(drafters), processing, eos, batch_heads), planner

    def cost_precision(self, model) -> str:
        """What the cost book keys ``model``'s costs by (``engine.costs.cost_key``): a
        quantised copy's precision ("int8", "int4"), else the dtype it was loaded in
        ("bfloat16", "float32") or "gguf" (a llama.cpp file's own types): a float32 load and a
        bfloat16 load, both ``AS_LOADED``, are measured apart."""
        if self.backend == "llama.cpp":
            return "gguf"
        precision = precision_of(model)
        return str(next(model.parameters()).dtype).removeprefix("torch.") if precision == AS_LOADED else precision


DEVICES = ("cpu", "cuda")


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


def float32_twin(model: torch.nn.Module) -> torch.nn.Module:
    """An exact float32 copy of ``model`` (every bf16/fp16 value is a float32 value)."""
    return copy.deepcopy(model).to(torch.float32).eval()


def load_pair(
    target: str,
    draft: str | None,
    dtype: torch.dtype = torch.bfloat16,
    progress: bool = True,
    float32_twins: bool | None = None,
    backend: str = "torch",
    threads: int | None = None,
) -> ModelPair:
    """Load both models offline (``specbound.models.loading.load_model``), check their shared
    vocabulary, and encode prompts as the engine's ``chat`` does (the chat template as one
    user turn when the tokenizer has one — the default pair are instruct models).
    ``float32_twins`` defaults to True for a bfloat16 pair. ``draft=None`` loads the target
    alone (for autoregressive decoding or prompt lookup). ``backend="llama.cpp"``: the GGUF
    files as they are on llama.cpp (``load_llamacpp_pair``, with ``threads`` per forward;
    ``dtype`` and twins do not apply)."""
    if backend == "llama.cpp":
        return load_llamacpp_pair(target, draft, progress, threads)
    from specbound.models.loading import check_shared_vocabulary, load_model  # transformers' model classes: slow

    target_loaded = load_model(target, dtype=dtype, progress=progress)
    if draft is None:
        draft_loaded = None
        vocab_size = target_loaded.model.get_output_embeddings().weight.shape[0]
    else:
        draft_loaded = load_model(draft, dtype=dtype, progress=progress)
        vocab_size = check_shared_vocabulary(target_loaded, draft_loaded)
    tokenizer = target_loaded.tokenizer
    eos_token_ids = tuple(sorted(stop_token_ids(tokenizer, target_loaded.model)))
    if float32_twins is None:
        float32_twins = dtype == torch.bfloat16
    return ModelPair(
        target=target_loaded.model,
        draft=None if draft_loaded is None else draft_loaded.model,
        vocab_size=vocab_size,
        eos_token_ids=eos_token_ids,
        **_text_functions(tokenizer),
        description={
            "target": target,
            "draft": draft,
            "dtype": str(dtype).removeprefix("torch."),
            **_vocabulary_description(tokenizer, vocab_size, eos_token_ids),
            "float32_twins": bool(float32_twins),
        },
        target_twin=float32_twin(target_loaded.model) if float32_twins else None,
        draft_twin=float32_twin(draft_loaded.model) if float32_twins and draft_loaded else None,
    )



def _text_functions(tokenizer) -> dict:
    """A pair's encode (a chat turn), decode and plain tokenize, from its tokenizer."""
    return {"encode": functools.partial(encode_prompt, tokenizer), "decode": tokenizer.decode,
            "tokenize": lambda text: tokenizer(text)["input_ids"]}


def _vocabulary_description(tokenizer, vocab_size: int, eos_token_ids) -> dict:
    return {"vocab_size": vocab_size, "eos_token_ids": list(eos_token_ids),
            "prompt_format": "chat template, one user turn" if tokenizer.chat_template else "raw text"}


def load_llamacpp_pair(target: str, draft: str | None, progress: bool = True, threads: int | None = None) -> ModelPair:
    """The pair as GGUF files on llama.cpp (``engine.llamacpp``): each file loaded as it is
    (memory-mapped), the tokenizer transformers reads from the target's file (the same token
    ids as the torch backend), the EOS ids of the tokenizer and of the file's metadata (those
    the torch backend's conversion puts in its generation config). ``threads``: CPU threads
    per forward (default all cores)."""
    from specbound.engine.llamacpp import LlamaCppModel
    from specbound.models.loading import gguf_file, load_gguf_tokenizer

    target_path, target_sha = gguf_file(target, progress=progress)
    target_model = LlamaCppModel(target_path, threads, fingerprint=target_sha[:16])
    draft_model = None
    if draft is not None:
        draft_path, draft_sha = gguf_file(draft, progress=progress)
        draft_model = LlamaCppModel(draft_path, threads, fingerprint=draft_sha[:16])
    tokenizer = load_gguf_tokenizer(target_path, target_sha, progress=progress)
    if draft_model is not None:
        draft_tokenizer = load_gguf_tokenizer(draft_path, draft_sha, progress=progress)
        if draft_tokenizer.get_vocab() != tokenizer.get_vocab():
            raise ValueError("draft: its tokenizer differs from the target's; speculative decoding needs one shared "
                             "vocabulary")
    vocab_size = target_model.n_vocab if draft_model is None else min(target_model.n_vocab, draft_model.n_vocab)
    if len(tokenizer) > vocab_size:
        raise ValueError(f"target: {vocab_size} logits per row, fewer than the tokenizer's {len(tokenizer)} tokens")
    eos_token_ids = tuple(sorted(stop_token_ids(tokenizer, None) | set(target_model.eos_token_ids)))
    return ModelPair(
        target=target_model,
        draft=draft_model,
        vocab_size=vocab_size,
        eos_token_ids=eos_token_ids,
        **_text_functions(tokenizer),
        description={
            "target": target,
            "draft": draft,
            "backend": "llama.cpp",
            "target_file": f"{target_path.name}: {target_model.description}",
            "draft_file": None if draft_model is None else f"{draft_path.name}: {draft_model.description}",
            **_vocabulary_description(tokenizer, vocab_size, eos_token_ids),
            "threads": target_model.threads,
        },
        backend="llama.cpp",
    )
