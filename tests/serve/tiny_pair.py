"""The tiny pair the serve tests serve (``specbound serve --pair-factory tiny_pair:tiny_pair``).

The engine tests' tiny float32 models (``tests/engine/engine_fixtures.py``: 2 layers,
hidden size 16, 64 positions, fixed seeds; the draft a noisy copy of the target) with a
vocabulary of 12 words, a real ``transformers`` tokenizer over them (whitespace-separated
words, ``</s>`` the EOS) and a chat template, wrapped as ``models.pair.load_pair`` wraps a
loaded pair — so the server runs its real path: tokenizer, chat template, engine, decoder.
"""

from __future__ import annotations

import functools

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from engine_fixtures import noisy_copy, tiny_model
from specbound.models.chat import encode_prompt
from specbound.models.pair import ModelPair

WORDS = ["</s>", "<unk>", "user", "assistant", "system", "red", "green", "blue", "cat", "dog", "runs", "sleeps"]
CHAT_TEMPLATE = ("{% for message in messages %}{{ message['role'] }} {{ message['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}assistant{% endif %}")
CONTEXT = 256  # positions the served models take (rotary embeddings: any length; the fixtures say 64)


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.WordLevel({word: index for index, word in enumerate(WORDS)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>", unk_token="<unk>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_pair(eos_token_ids=(0,)) -> ModelPair:
    tokenizer = tiny_tokenizer()
    target = tiny_model(seed=0, vocab_size=len(WORDS), head_scale=4.0)
    draft = noisy_copy(target, seed=1, noise=0.5)
    for model in (target, draft):
        model.config.max_position_embeddings = CONTEXT
    return ModelPair(target, draft, len(WORDS), tuple(eos_token_ids), functools.partial(encode_prompt, tokenizer),
                     decode=tokenizer.decode, tokenize=lambda text: tokenizer(text)["input_ids"],
                     description={"target": "tiny-test-pair"})


def tiny_pair_without_eos() -> ModelPair:
    """The same pair with no EOS: every request runs to its max_tokens, so its length is known."""
    return tiny_pair(eos_token_ids=())
