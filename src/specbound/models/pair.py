"""Loading the (target, draft) model pair (``engine.pair.ModelPair``) from files, on a backend.

``load_pair`` finds each model's files (``models.loading.ModelFiles``: the embedded default
pair, GGUF files or Hugging Face directories) and the backend asked for loads them its way
(``engine.backends.Backend.load``): the torch backend's transformers models, or the GGUF
files as they are on llama.cpp. A pair's tokenizer gives its prompt encoding (the chat
template as one user turn when it has one), its EOS ids and the vocabulary both models share:
one tokenizer, or for a draft with another tokenizer the tokens both share
(``engine.vocabulary``: the draft then drafts over those only).

Float32 twins: on a CPU without bfloat16 matrix units (AVX2 only) a bf16 forward costs
time in proportion to its rows and emulates bf16, so a long prefill is several times faster
in float32, while one decoding step is fastest in bf16. With ``float32_twins`` a study keeps
an exact float32 copy of each bf16 model (``Backend.float32_twin``, on a backend that keeps
twins): it prefills the prompt (``engine.CausalLM(prefill_model=)``) and runs the draft's
scoring forward, and the bf16 model does every decoding step. Costs 4 bytes per parameter
more memory. Where bf16 has matrix units (AVX512-BF16, AMX) a twin prefills more slowly than
bf16, so the decoders prefill with a twin only where a long float32 product is measured
faster than bf16 (``engine.backends.torch.float32_beats_bf16``); the scoring forward, float32
by definition (``studies.traces``), uses the twin everywhere.
"""

from __future__ import annotations

import functools

import torch

from specbound.engine.backends import Backend, get_backend
from specbound.engine.pair import ModelPair, checked_device  # noqa: F401 (the pair's home is the engine)
from specbound.engine.vocabulary import SharedVocabulary
from specbound.models.chat import encode_prompt, stop_token_ids
from specbound.models.loading import ModelFiles, shared_vocabulary


def load_pair(
    target: str,
    draft: str | None,
    dtype: torch.dtype = torch.bfloat16,
    progress: bool = True,
    float32_twins: bool | None = None,
    backend: str | Backend = "torch",
    threads: int | None = None,
) -> ModelPair:
    """Load both models offline on ``backend`` (a name of ``engine.backends.BACKENDS`` or a
    ``Backend``: ``Backend.load``), check their shared vocabulary, and encode prompts as the
    engine's ``chat`` does (the chat template as one user turn when the tokenizer has one — the
    default pair are instruct models). ``dtype``: the weights' dtype on a backend that converts
    them (torch); ``threads``: CPU threads per forward on one that takes a number (llama.cpp).
    ``float32_twins`` (a backend that keeps twins) defaults to True for a bfloat16 pair.
    ``draft=None`` loads the target alone (for autoregressive decoding or prompt lookup)."""
    backend = get_backend(backend) if isinstance(backend, str) else backend
    files = ModelFiles(progress)
    target_model, tokenizer = backend.load(target, files, dtype, threads)
    draft_model, draft_tokenizer = (None, None) if draft is None else backend.load(draft, files, dtype, threads)
    tokenizers = {"target": tokenizer} if draft is None else {"target": tokenizer, "draft": draft_tokenizer}
    models = {"target": target_model, "draft": draft_model}
    vocabulary = None
    if draft is not None and draft_tokenizer.get_vocab() != tokenizer.get_vocab():  # drafts over the shared tokens
        vocabulary = SharedVocabulary.of(tokenizer, draft_tokenizer, backend.logits_size(target_model),
                                         backend.logits_size(draft_model))
        tokenizers = {"target": tokenizer}
    vocab_size = shared_vocabulary(tokenizers, {label: backend.logits_size(models[label]) for label in tokenizers})
    eos_token_ids = tuple(sorted(stop_token_ids(tokenizer) | backend.eos_token_ids(target_model)))
    if float32_twins is None:
        float32_twins = dtype == torch.bfloat16
    float32_twins = bool(float32_twins) and backend.float32_twins
    dtype_name = str(dtype).removeprefix("torch.")
    return ModelPair(
        target=target_model,
        draft=draft_model,
        vocab_size=vocab_size,
        eos_token_ids=eos_token_ids,
        encode=functools.partial(encode_prompt, tokenizer),
        decode=tokenizer.decode,
        tokenize=lambda text: tokenizer(text)["input_ids"],
        description={
            "target": target,
            "draft": draft,
            **backend.settings_description(dtype_name, float32_twins),
            **backend.models_description(target_model, draft_model),
            "vocab_size": vocab_size,
            **({} if vocabulary is None else {"shared_tokens": len(vocabulary.target_ids)}),
            "eos_token_ids": list(eos_token_ids),
            "prompt_format": "chat template, one user turn" if tokenizer.chat_template else "raw text",
        },
        target_twin=backend.float32_twin(target_model) if float32_twins else None,
        draft_twin=backend.float32_twin(draft_model) if float32_twins and draft_model is not None else None,
        backend=backend,
        vocabulary=vocabulary,
    )
