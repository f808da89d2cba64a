"""Fixtures of the command-line tests: no test here loads a real model."""

import pytest

from support.cli import ModelWouldLoad


@pytest.fixture
def no_model_loads(monkeypatch):
    """Both ways a pair loads (transformers' ``load_model``, a GGUF file for llama.cpp: ``gguf_file``) raise
    ``ModelWouldLoad``, which the fixture gives; ``load_pair`` looks them up when called."""
    def refuse(*args, **kwargs):
        raise ModelWouldLoad

    monkeypatch.setattr("specbound.models.loading.load_model", refuse)
    monkeypatch.setattr("specbound.models.loading.gguf_file", refuse)
    return ModelWouldLoad
