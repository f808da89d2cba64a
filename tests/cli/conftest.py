"""Fixtures of the command-line tests: no test here loads a real model."""

import pytest

from cli_fixtures import ModelWouldLoad


@pytest.fixture
def no_model_loads(monkeypatch):
    """Both ways a pair loads (transformers' ``load_model``, llama.cpp's pair) raise
    ``ModelWouldLoad``, which the fixture gives; ``load_pair`` looks them up when called."""
    def refuse(*args, **kwargs):
        raise ModelWouldLoad

    monkeypatch.setattr("specbound.models.loading.load_model", refuse)
    monkeypatch.setattr("specbound.models.pair.load_llamacpp_pair", refuse)
    return ModelWouldLoad
