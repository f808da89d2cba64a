"""Which backend runs given models (``models.backends``): the one named, or ``auto``'s choice,
which also asks for the precision the target is to run at."""

import pytest

from specbound.engine.backends import get_backend
from specbound.engine.precisions import AS_LOADED
from specbound.models.backends import resolve_backend


def test_auto_chooses_the_first_backend_that_runs_the_precision_asked_for(monkeypatch):
    llama = get_backend("llama.cpp")
    monkeypatch.setattr(type(llama), "available", lambda self: True)
    gguf = ["default-target", "draft.gguf"]
    assert resolve_backend("auto", gguf) is llama
    assert resolve_backend("auto", gguf, "cpu", AS_LOADED) is llama
    assert resolve_backend("auto", gguf, "cpu", "int8") is get_backend("torch")  # llama.cpp runs the file's types
    assert resolve_backend("auto", ["folder"], "cpu", "int4") is get_backend("torch")
    # none runs int8 on a GPU: the first that runs the models; the caller refuses the precision
    assert resolve_backend("auto", gguf, "cuda", "int8") is get_backend("torch")
    # a backend named is taken as named: the caller checks its precisions (naming target_precision)
    assert resolve_backend("llama.cpp", gguf, "cpu", "int8") is llama
    with pytest.raises(ValueError, match="^backend: llama.cpp runs GGUF files; folder is not one"):
        resolve_backend("llama.cpp", ["folder"], "cpu")
