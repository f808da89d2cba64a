"""The embedded pair on the llama.cpp backend gives the token ids of the torch backend (slow:
real models; the torch side reads its converted copy, converting it first if needed)."""

import pytest

from specbound.datasets import DATASETS, load_prompts
from specbound.engine.backends.llamacpp import llama_cpp_available
from specbound.models.pair import load_pair

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not llama_cpp_available(), reason="llama-cpp-python is not installed")]

BUILT_IN = ["instructions", "summarize", "translate_de_en", "humaneval", "edit"]


def test_both_backends_encode_every_built_in_prompt_alike():
    llama = load_pair("default-target", None, backend="llama.cpp", progress=False)
    torch_pair = load_pair("default-target", None, float32_twins=False, progress=False)
    assert llama.eos_token_ids == torch_pair.eos_token_ids
    assert llama.vocab_size == torch_pair.vocab_size
    for name in BUILT_IN:
        assert name in DATASETS
        for prompt in load_prompts(name):
            assert llama.encode(prompt.text) == torch_pair.encode(prompt.text), prompt.id
