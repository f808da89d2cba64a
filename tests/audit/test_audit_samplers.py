"""Other engines as the auditor's samplers on the tiny models: transformers' assisted
generation and llama-cpp-python's prompt-lookup and draft-model modes pass the audit."""

import pytest

from support.models import EOS, noisy_copy, tiny_model
from specbound.audit import audit
from specbound.audit.samplers import ModelDraft, llama_cpp_sampler, transformers_sampler

PROMPTS = [[1, 2, 3], [4, 5], [2, 2, 1, 3]]


@pytest.fixture(scope="module")
def tiny_models():
    target = tiny_model(seed=0)
    return target, noisy_copy(target, seed=1, noise=0.7)


def audit_transformers(target, draft):
    sampler = transformers_sampler(target, 0.5, top_k=3, assistant_model=draft, eos_token_ids=(EOS,))
    return audit(sampler, target, PROMPTS, temperature=0.5, top_k=3, max_new_tokens=3, samples=192, seed=0)


def test_transformers_assisted_generation_passes_with_top_k(tiny_models):
    result = audit_transformers(*tiny_models)
    assert result.passed, result.p_value


def test_transformers_fails_when_its_candidate_q_is_not_the_law_drafted_from(tiny_models, monkeypatch):
    """transformers#47932's bug, in transformers' own speculative sampling: the candidate
    generator hands over the assistant's raw logits (before temperature and top-k) as q, while
    the drafts were drawn from the processed ones."""
    target, draft = tiny_models
    generate = draft.generate

    def raw_logits_as_scores(*args, **kwargs):
        kwargs["generation_config"].output_logits = True
        output = generate(*args, **kwargs)
        output.scores = output.logits
        return output

    monkeypatch.setattr(draft, "generate", raw_logits_as_scores)
    result = audit_transformers(target, draft)
    assert not result.passed and result.p_value < 1e-6


@pytest.fixture(scope="module")
def gguf_files(tiny_models, tmp_path_factory):
    pytest.importorskip("llama_cpp")
    from specbound.models.tiny import write_gguf

    folder = tmp_path_factory.mktemp("gguf")
    return [str(write_gguf(model, folder / f"{name}.gguf")) for name, model in zip(("target", "draft"), tiny_models)]


def llama(path, draft=None):
    from llama_cpp import Llama

    return Llama(path, n_ctx=64, n_threads=1, draft_model=draft, verbose=False)


def speculative_sampler(gguf_files, mode: str):
    """llama-cpp-python drafting by prompt lookup or with the draft GGUF file."""
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    draft = LlamaPromptLookupDecoding(num_pred_tokens=3) if mode == "prompt-lookup" else ModelDraft(llama(gguf_files[1]))
    return llama_cpp_sampler(llama(gguf_files[0], draft), 0.8)


@pytest.mark.parametrize("mode", ["prompt-lookup", "draft-model"])
def test_llama_cpp_python_sampler_is_seeded_and_returns_new_token_ids(gguf_files, mode):
    sampler = speculative_sampler(gguf_files, mode)
    first = sampler([1, 2, 3], 5, 0)
    assert len(first) == 5 and all(0 <= token < 6 for token in first)
    assert sampler([1, 2, 3], 5, 0) == first


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["prompt-lookup", "draft-model"])
def test_llama_cpp_python_speculative_modes_pass(gguf_files, mode):
    """Marked slow: llama-cpp-python's generate costs far more per sample than the tiny
    models' forwards."""
    result = audit(speculative_sampler(gguf_files, mode), gguf_files[0], PROMPTS, temperature=0.8, max_new_tokens=6,
                   samples=96, seed=0)
    assert result.passed, result.p_value
