"""Fixtures of the command-line tests: no test here loads a real model."""

import pytest


class ModelWouldLoad(BaseException):
    """Raised where a command would load a model: every value before it was accepted (a
    BaseException, as KeyboardInterrupt is, so that no error handling of the command takes it)."""


@pytest.fixture
def no_model_loads(monkeypatch):
    """Both ways a pair loads (transformers' ``load_model``, llama.cpp's pair) raise
    ``ModelWouldLoad``, which the fixture gives; ``load_pair`` looks them up when called."""
    def refuse(*args, **kwargs):
        raise ModelWouldLoad

    monkeypatch.setattr("specbound.models.loading.load_model", refuse)
    monkeypatch.setattr("specbound.models.pair.load_llamacpp_pair", refuse)
    return ModelWouldLoad
