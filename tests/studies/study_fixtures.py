"""Tiny in-process model pairs and prompts for the study tests.

The models are the engine tests' tiny random-weight Qwen2 models (``engine_fixtures``):
vocabulary of 6 tokens (token 0 is EOS), the draft a noisy copy of the target, so that
acceptance is neither 0 nor 1. Prompts are short strings mapped to token ids 1..5.
"""

from __future__ import annotations

import functools

from engine_fixtures import EOS, VOCAB, noisy_copy, tiny_model
from specbound.datasets import Prompt
from specbound.models.pair import ModelPair


def encode(text: str) -> list[int]:
    return [1 + ord(character) % (VOCAB - 1) for character in text]


@functools.cache
def tiny_pair() -> ModelPair:
    target = tiny_model(seed=0)
    draft = noisy_copy(target, seed=1, noise=0.5)
    return ModelPair(
        target=target, draft=draft, vocab_size=VOCAB, eos_token_ids=(EOS,), encode=encode,
        description={"target": "tiny-qwen2 (seed 0)", "draft": "noisy copy (seed 1, noise 0.5)",
                     "dtype": "float32", "vocab_size": VOCAB, "prompt_format": "character codes"},
    )


def tiny_prompts(count: int, dataset: str = "toy") -> list[Prompt]:
    texts = ["ab", "cab", "bcd", "dab", "ace", "ebb", "cde", "bad", "dec", "aaa", "eca", "dbe"]
    return [Prompt(f"{dataset}/{index}", texts[index % len(texts)] * (1 + index // len(texts)), dataset)
            for index in range(count)]
