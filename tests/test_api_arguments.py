"""The Python API refuses every bad argument with a TypeError or ValueError whose message
starts with the argument's name and states the rule, before any model loads; a keyword
that is neither an argument nor an option of the method is refused, never ignored."""

import pytest
import torch

import specbound
from specbound.engine.processing import Processing, Sampling
from specbound.models.tiny import tiny_pair


@pytest.fixture(scope="module")
def speculator():
    return specbound.Speculator(pair=tiny_pair(), progress=False)


@pytest.fixture
def no_loading(monkeypatch):
    def no_load(*arguments, **options):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("specbound.models.pair.load_pair", no_load)


@pytest.mark.parametrize("prompt, error, rule", [
    (5, TypeError, "expected text \\(str\\) or a list of token ids"),
    (None, TypeError, "expected text \\(str\\) or a list of token ids"),
    (b"hello", TypeError, "decode bytes to text first"),
    ([1.7, 2.2], TypeError, "token ids must be ints, got float 1.7"),
    ([1, True], TypeError, "token ids must be ints, got bool"),
    ([], ValueError, "at least one token id"),
    ([3, -1], ValueError, "token ids must be ≥ 0"),
    ([3, 10**6], ValueError, "token ids must lie in \\[0, 6\\)"),
    (torch.tensor([1.0, 2.0]), TypeError, "1-D tensor of integer token ids"),
])
def test_a_prompt_that_is_neither_text_nor_token_ids_is_refused_naming_prompt(speculator, prompt, error, rule):
    with pytest.raises(error, match=f"^prompt: .*{rule}"):
        speculator.generate(prompt, max_new_tokens=2, method="chain")


def test_token_ids_in_any_integer_container_are_taken(speculator):
    tokens = speculator.generate([1, 2, 3], max_new_tokens=2, method="chain", seed=3).tokens
    assert speculator.generate(torch.tensor([1, 2, 3]), max_new_tokens=2, method="chain", seed=3).tokens == tokens
    assert speculator.generate((1, 2, 3), max_new_tokens=2, method="chain", seed=3).tokens == tokens


@pytest.mark.parametrize("seed, error", [("x", TypeError), (1.5, TypeError), (True, TypeError),
                                         (2**70, ValueError), (-1, ValueError)])
def test_a_seed_that_is_not_a_63_bit_natural_number_is_refused(speculator, seed, error):
    with pytest.raises(error, match=r"^seed: expected an integer in \[0, 9223372036854775807\]"):
        speculator.generate("hi", max_new_tokens=2, method="chain", seed=seed)


@pytest.mark.parametrize("method, options, message", [
    ("auto", {"max_new_token": 3}, "^max_new_token: generate\\(\\) takes no argument 'max_new_token', and method "
                                   "'auto' takes no options"),
    ("chain", {"gama": 3}, "^gama: generate\\(\\) takes no argument 'gama', and method 'chain' takes no such "
                           "option \\(its options: gamma, verifier\\)"),
])
def test_an_unknown_keyword_is_refused_naming_it(speculator, method, options, message):
    with pytest.raises(TypeError, match=message):
        speculator.generate("hi", max_new_tokens=2, method=method, **options)


@pytest.mark.parametrize("arguments, error, message", [
    ({"temperature": float("nan")}, ValueError, "^temperature: expected a finite number >= 0"),
    ({"temperature": "0.7"}, ValueError, "^temperature: expected a finite number >= 0"),
    ({"top_k": 2.5}, ValueError, "^top_k: expected a positive integer or None"),
    ({"top_p": 0}, ValueError, "^top_p: expected a number in \\(0, 1\\] or None"),
    ({"max_new_tokens": 0}, ValueError, "^max_new_tokens: expected a positive integer"),
    ({"method": 3}, TypeError, "^method: expected 'auto' or a method's name"),
    ({"method": "chains"}, ValueError, "^method: unknown method 'chains'"),
    ({"streamer": print}, TypeError, "^streamer: expected an object with put\\(\\) and end\\(\\)"),
    ({"chat": "yes"}, TypeError, "^chat: expected True or False"),
])
def test_every_other_generate_argument_is_checked_naming_it(speculator, arguments, error, message):
    with pytest.raises(error, match=message):
        speculator.generate("hi", **{"max_new_tokens": 2, "method": "chain", **arguments})


@pytest.mark.parametrize("arguments, error, message", [
    ({"target": 5}, TypeError, "^target: expected an embedded model's name, a .gguf file or a Hugging Face folder"),
    ({"target": ""}, ValueError, "^target: .* got an empty string"),
    ({"draft": 3.0}, TypeError, "^draft: expected an embedded model's name"),
    ({"device": "tpu"}, ValueError, "^device: expected one of cpu, cuda, got 'tpu'"),
    ({"device": 0}, TypeError, "^device: expected one of cpu, cuda"),
    ({"dtype": "float16"}, ValueError, "^dtype: expected one of bfloat16, float32"),
    ({"dtype": torch.float16}, ValueError, "^dtype: expected torch.bfloat16 or torch.float32"),
    ({"dtype": 16}, TypeError, "^dtype: expected torch.bfloat16 or torch.float32"),
    ({"target_precision": 8}, TypeError, "^target_precision: expected one of as-loaded, int8, int4"),
    ({"draft_precisions": "int8"}, TypeError, "^draft_precisions: expected a list of precision names"),
    ({"draft_precisions": []}, ValueError, "^draft_precisions: expected at least one"),
    ({"drafter": "lookup"}, ValueError, "^drafter: expected one of 'model', 'prompt-lookup'"),
    ({"progress": "no"}, TypeError, "^progress: expected True or False"),
    ({"cache_dir": 5}, TypeError, "^cache_dir: expected a folder"),
    ({"backend": "vllm"}, ValueError, "^backend: expected one of"),
    ({"pair": "default"}, TypeError, "^pair: expected a ModelPair"),
])
def test_speculator_checks_every_argument_before_any_model_loads(no_loading, arguments, error, message):
    with pytest.raises(error, match=message):
        specbound.Speculator(**arguments)


@pytest.mark.parametrize("arguments, error, message", [
    ({"prompt": 5}, TypeError, "^prompt: "),
    ({"prompt": "hi", "seed": "x"}, TypeError, "^seed: "),
    ({"prompt": "hi", "max_new_token": 3}, TypeError, "^max_new_token: "),
    ({"prompt": "hi", "top_p": 2.0}, ValueError, "^top_p: "),
])
def test_generate_checks_its_arguments_before_the_models_load(no_loading, arguments, error, message):
    with pytest.raises(error, match=message):
        specbound.generate(**arguments)


def test_generate_refuses_new_tokens_beyond_the_models_context_before_they_load(no_loading, tmp_path):
    """The models' context as their files say it (here a config of 64 positions) is read
    without loading them: 64 new tokens after any prompt cannot fit."""
    (tmp_path / "config.json").write_text('{"model_type": "qwen2", "max_position_embeddings": 64}')
    with pytest.raises(ValueError, match="^max_new_tokens: 64 new tokens after a prompt .* context of 64 positions"):
        specbound.generate("hi", max_new_tokens=64, target=str(tmp_path), draft=str(tmp_path))


def test_sampling_settings_are_checked_once_and_carried_as_one_value():
    sampling = Sampling(0.5, 3, 0.9)
    processing = Processing.of(sampling, 6)
    assert processing == Processing(0.5, 3, 0.9, 6)
    with pytest.raises(ValueError, match="^temperature: "):
        Processing(-1.0)
    with pytest.raises(ValueError, match="^top_k: "):
        Sampling(top_k=True)


def test_a_request_s_sampling_travels_down_to_the_decoder_s_processing(speculator):
    """The caller hands down a ``Sampling``; the processing with the models' vocabulary is
    made below it, once per setting, and nothing else is taken."""
    decoder, _ = speculator.decoder_for(Sampling(0.25, top_k=2), "chain", {"gamma": 2})
    assert decoder.processing == Processing(0.25, 2, None, speculator.pair.vocab_size)
    assert speculator.decoder_for(Sampling(0.25, top_k=2), "chain", {"gamma": 2})[0] is decoder
    speculator.release_decoder(Sampling(0.25, top_k=2), "chain", {"gamma": 2})
    assert speculator.decoder_for(Sampling(0.25, top_k=2), "chain", {"gamma": 2})[0] is not decoder
    with pytest.raises(TypeError, match="^sampling: expected a Sampling"):
        speculator.decoder_for(Processing(0.25, 2), "chain", {"gamma": 2})


def test_a_method_written_with_its_options_decodes_as_the_keywords_do(speculator):
    """'chain:gamma=3', as the command line, the server and the auditor write it, is the
    method chain with gamma=3: same tokens, same decoder."""
    written = speculator.generate([1, 2, 3], max_new_tokens=6, method="chain:gamma=3", seed=5)
    keywords = speculator.generate([1, 2, 3], max_new_tokens=6, method="chain", gamma=3, seed=5)
    assert written.tokens == keywords.tokens
    mixed = speculator.generate([1, 2, 3], max_new_tokens=6, method="chain:gamma=3", verifier="single", seed=5)
    assert mixed.tokens == keywords.tokens
    assert (speculator.decoder_for(Sampling(), "chain:gamma=3")[0]
            is speculator.decoder_for(Sampling(), "chain", {"gamma": 3})[0])


@pytest.mark.parametrize("method, options, error, message", [
    ("chain:gamma=3", {"gamma": 4}, ValueError, "^gamma: given twice, in method='chain:gamma=3' and as gamma=4"),
    ("chain:gamma=3", {"gamma": 3}, ValueError, "^gamma: given twice"),
    ("chain:gamma=3:gamma=4", {}, ValueError, "^method: 'chain:gamma=3:gamma=4' gives 'gamma' twice"),
    ("chain:gama=3", {}, ValueError, "^method: 'chain' takes no option 'gama'"),
    ("chain:gamma", {}, ValueError, "^method: expected KEY=VALUE after 'chain', got 'gamma'"),
    ("chains:gamma=3", {}, ValueError, "^method: unknown method 'chains'"),
    ("auto:gamma=3", {}, ValueError, "^method: 'auto' takes no option 'gamma'"),
])
def test_a_method_written_with_options_is_checked_as_the_command_line_checks_it(speculator, method, options, error,
                                                                                 message):
    with pytest.raises(error, match=message):
        speculator.generate("hi", max_new_tokens=2, method=method, **options)


def test_the_acceptance_gap_a_request_returns_is_never_negative(speculator):
    for seed in range(3):
        result = speculator.generate([1, 2, 3], max_new_tokens=8, method="chain:gamma=3", seed=seed)
        summary = result.stats.optimum.summary()
        assert summary["computed"] > 0 and summary["acceptance_gap"] >= 0
        assert summary["optimal_acceptance"] >= summary["expected_acceptance"]
