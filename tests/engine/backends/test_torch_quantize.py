"""Weight-only int8/int4 layers compute with the grid they store, the int4 grid search beats
plain min/max rounding, the quantised copies are cached and reload to the same model, and a
quantised draft keeps decoding lossless (its law is the one handed to the verifier). Each
precision has one name, the model itself included (``AS_LOADED``), in the planner, the
language model's variants and the cost book, where a float32 and a bfloat16 load differ."""

import copy
import json

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from support.models import EOS, SIGNIFICANCE, chi_square_pvalue, exact_sequence_law
from specbound.engine import CausalLM, Decoder, ModelDrafter, Processing, build_method
from specbound.engine.assembly import assemble
from specbound.engine.backends import Entries
from specbound.engine.backends.torch_quantize import Int4Linear, Int8Linear, int4_grid, precision_of, quantize
from specbound.engine.cost_book import cost_key
from specbound.engine.pair import ModelPair
from specbound.engine.precisions import AS_LOADED, PRECISIONS, precision_name


def small_model(seed=0):
    """A tiny Qwen2 whose layers are multiples of 32 wide (the int4 kernel's group)."""
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=6, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         tie_word_embeddings=False)
    model = Qwen2ForCausalLM(config).eval().to(torch.bfloat16)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model


@pytest.mark.parametrize("layer_class", [Int8Linear, Int4Linear])
def test_a_quantised_layer_computes_with_its_stored_weight(layer_class):
    linear = torch.nn.Linear(64, 48, bias=True).to(torch.bfloat16)
    layer = layer_class.from_linear(linear)
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    expected = x.float() @ layer.dequantized().float().t() + linear.bias.float()
    torch.testing.assert_close(layer(x).float(), expected, atol=0.05, rtol=0.02)
    assert layer.weight.shape == linear.weight.shape and layer.weight.device.type == "meta"


def test_the_int4_range_search_beats_min_max_rounding():
    weight = torch.randn(64, 256) * torch.linspace(0.1, 3, 256)
    weight[:, ::37] *= 8  # outliers
    scale, zero, levels = int4_grid(weight)
    searched = ((levels.reshape(64, -1, 32).float() - 8) * scale[..., None] + zero[..., None]).reshape(64, 256)
    groups = weight.reshape(64, -1, 32)
    low, high = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
    step = (high - low) / 15
    plain = (torch.round((groups - low) / step) * step + low).reshape(64, 256)
    searched_error, plain_error = ((searched - weight) ** 2).sum(-1), ((plain - weight) ** 2).sum(-1)
    assert bool((searched_error <= plain_error * (1 + 1e-6)).all())  # min/max is one of the candidates
    assert searched_error.sum() < 0.95 * plain_error.sum()  # 0.90 here: outliers waste plain levels


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_quantised_copies_are_cached_and_reload_to_the_same_model(precision, tmp_path):
    model = small_model()
    first, second = quantize(model, precision, cache_dir=tmp_path), quantize(model, precision, cache_dir=tmp_path)
    assert len(list((tmp_path / "quantized").iterdir())) == 1
    tokens = torch.tensor([[1, 2, 3, 4]])
    assert torch.equal(first(input_ids=tokens).logits, second(input_ids=tokens).logits)
    assert quantize(model, "bf16") is model


def test_a_draft_at_two_precisions_in_one_cache_keeps_decoding_lossless():
    """The drafter runs one-row forwards in int4 and larger ones in int8 (as a planner would
    choose by cost); the sequence law is still the target's (χ² at SIGNIFICANCE)."""
    target, draft = small_model(0), small_model(1)
    processing = Processing()
    variants = {"int8": quantize(draft, "int8"), "int4": quantize(draft, "int4")}
    drafter = ModelDrafter(CausalLM(draft, variants=variants), processing,
                           lambda rows: "int4" if rows == 1 else "int8")
    decoder = Decoder(CausalLM(target), drafter, processing, eos_token_ids=[EOS])
    generator = torch.Generator().manual_seed(0)
    method = build_method("sparse", budget=4, depth=2, width=2)
    samples = [tuple(decoder.generate([1], method, 3, generator).tokens) for _ in range(400)]
    assert chi_square_pvalue(samples, exact_sequence_law(target, [1], processing, 3)) > SIGNIFICANCE


def test_each_precision_has_one_name_and_bf16_is_an_old_name_of_as_loaded():
    """"bf16" named the model as loaded even when it was loaded in float32."""
    assert PRECISIONS == (AS_LOADED, "int8", "int4") and "bf16" not in AS_LOADED
    assert precision_name("bf16") == AS_LOADED and precision_name("int4") == "int4"
    with pytest.raises(ValueError, match="^draft_precisions: expected one of as-loaded, int8, int4, got 'bfloat16'"):
        precision_name("bfloat16", "draft_precisions")
    model = small_model()
    assert quantize(model, AS_LOADED) is model and quantize(model, "bf16") is model
    assert precision_of(model) == AS_LOADED
    assert precision_of(quantize(model, "int8")) == "int8" and precision_of(quantize(model, "int4")) == "int4"


def test_the_model_itself_is_the_variant_as_loaded():
    draft = small_model(1)
    lm = CausalLM(draft, variants={"int8": quantize(draft, "int8")})
    assert lm.variants[AS_LOADED] is draft
    lm.prefill(0, [1, 2, 3])
    by_default = lm.score([Entries.chain([4])]).logits(0)
    lm.commit([[]])
    torch.testing.assert_close(lm.score([Entries.chain([4])], AS_LOADED).logits(0), by_default, rtol=0, atol=0)
    with pytest.raises(ValueError, match="variants: 'as-loaded' is the model itself"):
        CausalLM(draft, variants={AS_LOADED: quantize(draft, "int8")})


def pair_of(target, draft) -> ModelPair:
    return ModelPair(target, draft, 6, (EOS,), encode=lambda text: [1])


def test_cost_book_keys_tell_a_float32_load_from_a_bfloat16_one_and_name_quantised_copies():
    bf16 = small_model(0)
    float32 = copy.deepcopy(bf16).float()
    int8 = quantize(bf16, "int8")
    pair = pair_of(bf16, None)
    assert [pair.backend.cost_precision(model) for model in (bf16, float32, int8)] == ["bfloat16", "float32", "int8"]
    keys = {cost_key(model, pair.backend.cost_precision(model)) for model in (bf16, float32, int8)}
    assert len(keys) == 3


def test_the_planner_keys_the_draft_s_precisions_by_their_one_name(tmp_path):
    """Old names are taken; the draft as loaded is keyed ``AS_LOADED`` (it was None), and the
    cost book names it by its dtype, a quantised copy by its precision."""
    pair = pair_of(small_model(0), small_model(1))
    decoder, planner = assemble(pair, Processing(), "auto", draft_precisions=("bf16", "int8"), cache_dir=tmp_path)
    assert set(planner.draft_costs) == {AS_LOADED, "int8"}
    assert set(decoder.drafter.drafters["model"].lm.variants) == {AS_LOADED, "int8"}
    book = json.loads((tmp_path / "costs.json").read_text())
    assert sorted(key.rsplit(" | ", 1)[1] for key in book) == ["bfloat16", "bfloat16", "int8"]
    generation = decoder.generate([1, 2], planner, 4, torch.Generator().manual_seed(0))
    assert len(generation.tokens) <= 4
