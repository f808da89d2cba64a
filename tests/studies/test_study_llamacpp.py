"""The studies on the llama.cpp backend: the tiny study pair written as GGUF files and run
by llama.cpp gives the same study records, with rows as llama.cpp computes them."""

import numpy as np
import pytest

from specbound.models.tiny import write_gguf
from specbound.engine import Processing
from specbound.models.pair import ModelPair
from specbound.studies.acceptance import AcceptanceStudy, acceptance_summary
from specbound.studies.runner import run_study
from specbound.studies.traces import next_token_probs
from specbound.models.tiny import tiny_pair, tiny_prompts

from specbound.engine.backends import llamacpp  # noqa: E402

if not llamacpp.llama_cpp_available():
    pytest.skip("llama-cpp-python is not installed", allow_module_level=True)


@pytest.fixture(scope="module")
def llamacpp_pair(tmp_path_factory):
    torch_pair, folder = tiny_pair(), tmp_path_factory.mktemp("gguf")
    models = [llamacpp.LlamaCppModel(write_gguf(model, folder / f"{name}.gguf"), threads=1)
              for name, model in (("target", torch_pair.target), ("draft", torch_pair.draft))]
    return ModelPair(target=models[0], draft=models[1], vocab_size=torch_pair.vocab_size,
                     eos_token_ids=torch_pair.eos_token_ids, encode=torch_pair.encode, backend="llama.cpp",
                     description={**torch_pair.description, "backend": "llama.cpp"})


def test_a_scoring_forward_on_llama_cpp_gives_the_torch_model_s_laws(llamacpp_pair):
    """The same weights: llama.cpp's rows agree with the torch model's up to its float16
    keys and values (TV well under 1e-3 here)."""
    processing = Processing(temperature=0.7)
    prompt, tokens = [1, 2, 3], [4, 0, 2, 5]
    rows = next_token_probs(llamacpp_pair.target, prompt, tokens, processing)
    reference = next_token_probs(tiny_pair().target, prompt, tokens, processing)
    assert rows.shape == reference.shape
    assert 0.5 * np.abs(rows - reference).sum(axis=1).max() < 1e-3


def test_the_acceptance_study_runs_on_llama_cpp(llamacpp_pair, tmp_path):
    study = AcceptanceStudy(temperatures=(0.7,), num_drafts=(2,), max_new_tokens=6)
    results = run_study(study, llamacpp_pair, tiny_prompts(2), tmp_path, dataset="toy", progress=False)
    assert len(results.runs) == 2 and results.positions
    summary = acceptance_summary(results)
    assert summary[(0.7, 2, "rrs")][0] <= summary[(0.7, 2, "optimal_with_replacement")][0] + 1e-12
