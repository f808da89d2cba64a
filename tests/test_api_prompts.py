"""``specbound.generate`` and ``Speculator.generate`` refuse a prompt that is not text
(a lone surrogate: what Python makes of bytes that are not UTF-8) before the tokenizer sees
it, and ``specbound.generate`` before any model loads."""

import pytest

import specbound
from specbound.models.chat import encode_prompt
from specbound.models.tiny import tiny_pair

NOT_TEXT = "hi \udcff"


def test_speculator_refuses_a_prompt_that_is_not_unicode_text():
    speculator = specbound.Speculator(pair=tiny_pair())
    with pytest.raises(ValueError, match="prompt: not valid Unicode text"):
        speculator.generate(NOT_TEXT, max_new_tokens=2, method="chain")


def test_generate_refuses_a_prompt_that_is_not_unicode_text_before_loading(monkeypatch):
    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("specbound.models.pair.load_pair", no_load)
    with pytest.raises(ValueError, match="prompt: not valid Unicode text"):
        specbound.generate(NOT_TEXT)


def test_encode_prompt_refuses_text_that_is_not_unicode_before_the_tokenizer():
    with pytest.raises(ValueError, match="text: not valid Unicode text"):
        encode_prompt(object(), NOT_TEXT)
