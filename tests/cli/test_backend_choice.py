"""Which backend a command runs on, and the one line a user without llama-cpp-python gets."""

import pytest
import torch

from specbound.cli.decoding import missed_fast_backend
from specbound.engine.backends import get_backend
from specbound.models.backends import resolve_backend

TORCH = get_backend("torch")


def test_auto_takes_llama_cpp_for_gguf_models_on_the_cpu(monkeypatch, tmp_path):
    monkeypatch.setattr("specbound.engine.backends.llamacpp.llama_cpp_available", lambda: True)
    folder = tmp_path / "hf"
    folder.mkdir()
    assert resolve_backend("auto", ["default-target", "default-draft"]).name == "llama.cpp"
    assert resolve_backend("auto", ["default-target", str(tmp_path / "user.gguf")]).name == "llama.cpp"
    assert resolve_backend("auto", ["default-target", str(folder)]) is TORCH  # a Hugging Face folder
    assert resolve_backend("auto", ["default-target"], device="cuda") is TORCH
    with pytest.raises(ValueError, match="backend: llama.cpp runs GGUF files"):
        resolve_backend("llama.cpp", [str(folder)])
    with pytest.raises(ValueError, match="backend: this llama.cpp build runs on the CPU"):
        resolve_backend("llama.cpp", ["default-target"], device="cuda")


def test_without_llama_cpp_auto_takes_torch_and_says_what_llama_cpp_would_give(monkeypatch):
    monkeypatch.setattr("specbound.engine.backends.llamacpp.llama_cpp_available", lambda: False)
    assert resolve_backend("auto", ["default-target", "default-draft"]) is TORCH
    with pytest.raises(ValueError, match="pip install"):
        resolve_backend("llama.cpp", ["default-target"])
    line = missed_fast_backend("auto", TORCH, ["default-target", "default-draft"], "cpu")
    assert "llama-cpp-python is not installed" in line and "faster" in line and "pip install" in line
    assert missed_fast_backend("torch", TORCH, ["default-target"], "cpu") is None  # asked for torch: nothing to say
    monkeypatch.setattr("specbound.engine.backends.llamacpp.llama_cpp_available", lambda: True)
    assert missed_fast_backend("auto", TORCH, ["default-target"], "cpu") is None


def test_an_int8_target_is_refused_on_llama_cpp_and_makes_auto_take_torch(no_model_loads, monkeypatch):
    from specbound.api import Speculator

    with pytest.raises(ValueError, match="target_precision"):
        Speculator(backend="llama.cpp", target_precision="int8")
    asked = []
    monkeypatch.setattr("specbound.models.pair.load_pair", lambda *args, **options: asked.append(options["backend"]) or
                        (_ for _ in ()).throw(no_model_loads()))
    with pytest.raises(no_model_loads):
        Speculator(target_precision="int8")
    assert asked == [TORCH]


def test_the_precision_options_name_each_precision_once_and_take_the_old_bf16(capsys):
    from specbound.cli import build_parser
    from specbound.engine.precisions import AS_LOADED, PRECISIONS

    parser = build_parser()
    defaults = parser.parse_args(["generate", "hi"])
    assert defaults.target_precision == AS_LOADED and defaults.draft_precisions == list(PRECISIONS)
    old = parser.parse_args(["generate", "hi", "--target-precision", "bf16", "--draft-precisions", "bf16,int8,as-loaded"])
    assert old.target_precision == AS_LOADED and old.draft_precisions == [AS_LOADED, "int8"]
    with pytest.raises(SystemExit):
        parser.parse_args(["generate", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "{as-loaded,int8,int4}" in shown and "the model itself, at --dtype" in shown
    assert "bf16 is an old name of as-loaded" in shown


def test_an_int8_target_on_cuda_is_refused_before_a_model_loads(no_model_loads, monkeypatch, capsys):
    from specbound.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert main(["generate", "hi", "--target-precision", "int8", "--device", "cuda", "--quiet"]) == 2
    assert "target_precision: int8 runs on CPU kernels only" in capsys.readouterr().err
