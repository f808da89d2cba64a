"""Loading the (target, draft) model pair (``engine.pair.ModelPair``) from files, on a backend.

``load_pair`` builds it from ``specbound.models.loading`` (embedded default pair, GGUF files
or Hugging Face directories) on the backend asked for (``engine.backends``): the torch
backend's transformers models, or the GGUF files as they are on llama.cpp
(``load_llamacpp_pair``). A pair's tokenizer gives its prompt encoding (the chat template
as one user turn when it has one), its EOS ids and the vocabulary both models share.

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
import functools

import torch

from specbound.engine.backends import Backend, get_backend
from specbound.engine.pair import ModelPair, checked_device  # noqa: F401 (the pair's home is the engine)
from specbound.models.chat import encode_prompt, stop_token_ids


def float32_twin(model: torch.nn.Module) -> torch.nn.Module:
    """An exact float32 copy of ``model`` (every bf16/fp16 value is a float32 value)."""
    return copy.deepcopy(model).to(torch.float32).eval()


def load_pair(
    target: str,
    draft: str | None,
    dtype: torch.dtype = torch.bfloat16,
    progress: bool = True,
    float32_twins: bool | None = None,
    backend: str | Backend = "torch",
    threads: int | None = None,
) -> ModelPair:
    """Load both models offline (``specbound.models.loading.load_model``), check their shared
    vocabulary, and encode prompts as the engine's ``chat`` does (the chat template as one
    user turn when the tokenizer has one — the default pair are instruct models).
    ``float32_twins`` defaults to True for a bfloat16 pair. ``draft=None`` loads the target
    alone (for autoregressive decoding or prompt lookup). ``backend`` (a name of
    ``engine.backends.BACKENDS`` or a ``Backend``) loads the files its way (``LOADERS``): on
    llama.cpp the GGUF files as they are (``load_llamacpp_pair``, with ``threads`` per
    forward; ``dtype`` and twins do not apply)."""
    backend = get_backend(backend) if isinstance(backend, str) else backend
    return LOADERS[backend.name](target, draft, dtype, progress, float32_twins, threads)


def load_torch_pair(target: str, draft: str | None, dtype: torch.dtype = torch.bfloat16, progress: bool = True,
                    float32_twins: bool | None = None, threads: int | None = None) -> ModelPair:
    """The pair as transformers models on torch (``load_pair``); ``threads`` does not apply."""
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
        backend=get_backend("torch"),
    )


def _text_functions(tokenizer) -> dict:
    """A pair's encode (a chat turn), decode and plain tokenize, from its tokenizer."""
    return {"encode": functools.partial(encode_prompt, tokenizer), "decode": tokenizer.decode,
            "tokenize": lambda text: tokenizer(text)["input_ids"]}


def _vocabulary_description(tokenizer, vocab_size: int, eos_token_ids) -> dict:
    return {"vocab_size": vocab_size, "eos_token_ids": list(eos_token_ids),
            "prompt_format": "chat template, one user turn" if tokenizer.chat_template else "raw text"}


def load_llamacpp_pair(target: str, draft: str | None, progress: bool = True, threads: int | None = None) -> ModelPair:
    """The pair as GGUF files on llama.cpp (``engine.backends.llamacpp``): each file loaded as it is
    (memory-mapped), the tokenizer transformers reads from the target's file (the same token
    ids as the torch backend), the EOS ids of the tokenizer and of the file's metadata (those
    the torch backend's conversion puts in its generation config). ``threads``: CPU threads
    per forward (default all cores)."""
    from specbound.engine.backends.llamacpp import LlamaCppModel
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
        backend=get_backend("llama.cpp"),
    )


# Each backend's loader of a pair, by the backend's name (``load_pair``).
LOADERS = {
    "torch": load_torch_pair,
    "llama.cpp": lambda target, draft, dtype, progress, float32_twins, threads:
        load_llamacpp_pair(target, draft, progress, threads),
}
