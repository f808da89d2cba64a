"""Adding a verifier is one class: registered, it shows up in ``specbound accept``, the
engine, the acceptance study and its report with no other edit."""

import json

import numpy as np
import pytest
import torch

from specbound.cli import main
from specbound.engine import CausalLM, Decoder, ModelDrafter, Processing
from specbound.engine.methods import build_method
from specbound.probability import sample_from, sample_from_torch
from specbound.studies.acceptance import AcceptanceStudy
from specbound.studies.report import write_report
from specbound.studies.runner import run_study
from specbound.verifiers import VERIFIERS, Verifier, register_verifier


class Independent(Verifier):
    """A toy lossless verifier: ignores the drafts and emits y ~ p. It is accepted when y
    happens to be one of the n i.i.d. drafts: α = Σ_y p(y)(1 − (1 − q(y))ⁿ)."""

    name = "toy_independent"
    label = "independent toy verifier"
    scheme = "with_replacement"

    def _verify(self, target, draft, tokens, uniforms):
        return sample_from(target, uniforms[:, -1])

    def _verify_torch(self, target, draft, tokens, uniforms):
        return sample_from_torch(target, uniforms[:, -1])

    def _output_law(self, target, draft, tokens):
        return target.copy()

    def _acceptance_rate(self, target, draft, num_drafts):
        return (target * (1.0 - (1.0 - draft) ** num_drafts)).sum(axis=1)


@pytest.fixture
def toy_verifier():
    register_verifier(Independent)
    yield Independent()
    del VERIFIERS[Independent.name]


def test_a_registered_verifier_is_in_accept_the_engine_the_study_and_the_report(toy_verifier, tmp_path, capsys):
    from specbound.models.tiny import tiny_pair, tiny_prompts

    target, draft = [0.4, 0.3, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4]
    assert main(["accept", "--target", ",".join(map(str, target)), "--draft", ",".join(map(str, draft)),
                 "-n", "2", "--json"]) == 0
    records = {record["method"]: record for record in json.loads(capsys.readouterr().out)["methods"]}
    expected = sum(p * (1 - (1 - q) ** 2) for p, q in zip(target, draft))
    assert records["toy_independent"]["acceptance"] == pytest.approx(expected, abs=1e-12)
    assert records["toy_independent"]["optimum"] == pytest.approx(0.79, abs=1e-9)  # α* with replacement

    pair = tiny_pair()
    processing = Processing(vocab_size=pair.vocab_size)
    decoder = Decoder(CausalLM(pair.target), ModelDrafter(CausalLM(pair.draft), processing), processing)
    tree = build_method("tree", num_drafts=2, depth=2, verifier="toy_independent")
    assert len(decoder.generate([1, 2], tree, 6, torch.Generator().manual_seed(0)).tokens) == 6

    study = AcceptanceStudy(num_drafts=(2,), max_new_tokens=4)
    assert "toy_independent" in study.methods
    results = run_study(study, pair, tiny_prompts(2), tmp_path / "acceptance" / "toy", "toy", progress=False)
    assert all("toy_independent" in record["acceptance"] for record in results.positions)
    assert "independent toy verifier" in write_report(tmp_path).read_text()


def test_the_toy_verifier_is_lossless(toy_verifier):
    rng = np.random.default_rng(0)
    target, draft = rng.dirichlet(np.ones(5)), rng.dirichlet(np.ones(5))
    np.testing.assert_allclose(toy_verifier.output_law(target, draft, [[1, 3]])[0], target, atol=1e-15)


def test_a_name_is_registered_once(toy_verifier):
    with pytest.raises(ValueError, match="registered already"):
        register_verifier(Independent)
