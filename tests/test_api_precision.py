"""``Speculator``'s precisions: one name each ("bf16", the old name of "as-loaded", taken); an
int8/int4 target is refused on a GPU before anything loads or is quantised, and is
quantised once into the cache, as the draft's copies are."""

import pytest
import torch

from support.models import EOS, VOCAB, noisy_copy, tiny_model
from specbound.api import Speculator
from specbound.engine.backends.torch_quantize import Int8Linear
from specbound.engine.precisions import AS_LOADED, PRECISIONS
from specbound.models.pair import ModelPair


def tiny_pair() -> ModelPair:
    target = tiny_model(seed=0)
    return ModelPair(target, noisy_copy(target, seed=1, noise=0.5), VOCAB, (EOS,), encode=lambda text: [1, 2])


def test_precisions_have_one_name_and_bf16_is_taken_for_as_loaded():
    assert Speculator(pair=tiny_pair()).draft_precisions == PRECISIONS
    speculator = Speculator(pair=tiny_pair(), target_precision="bf16", draft_precisions=("bf16", "int8", AS_LOADED))
    assert speculator.draft_precisions == (AS_LOADED, "int8")
    with pytest.raises(ValueError, match="^target_precision: expected one of as-loaded, int8, int4, got 'fp8'"):
        Speculator(pair=tiny_pair(), target_precision="fp8")


def test_an_int8_target_on_a_gpu_is_refused_before_anything_loads_or_is_quantised(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    done = []
    monkeypatch.setattr("specbound.engine.backends.torch_quantize.quantize", lambda *arguments, **options: done.append("quantised"))
    monkeypatch.setattr("specbound.models.pair.load_pair", lambda *arguments, **options: done.append("loaded"))
    for pair in (None, tiny_pair()):
        with pytest.raises(ValueError, match="^target_precision: int8 runs on CPU kernels only; on cuda keep the "
                           "target as-loaded .*--target-precision as-loaded"):
            Speculator(target_precision="int8", device="cuda", pair=pair)
    assert done == []


def test_an_int8_target_is_quantised_once_into_the_cache(tmp_path, monkeypatch):
    first = Speculator(pair=tiny_pair(), target_precision="int8", cache_dir=tmp_path)
    assert len(list((tmp_path / "quantized").glob("*-int8-*.safetensors"))) == 1
    assert first.pair.description["target_precision"] == "int8"

    def quantise_again(*arguments):
        raise AssertionError("the target was quantised again")

    monkeypatch.setattr(Int8Linear, "from_linear", quantise_again)
    second = Speculator(pair=tiny_pair(), target_precision="int8", cache_dir=tmp_path)
    tokens = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert torch.equal(first.pair.target(input_ids=tokens).logits, second.pair.target(input_ids=tokens).logits)
