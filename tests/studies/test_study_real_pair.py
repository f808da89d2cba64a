"""The studies on the embedded default pair (Qwen2.5-Coder 1.5B target, 0.5B draft): a
short end-to-end run of each command and the report. Opt-in (``pytest -m slow``): it needs
the model packages and takes tens of minutes on a two-core CPU."""

import json

import pytest

from specbound.cli import main
from specbound.studies.records import read_results

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def results_dir(tmp_path_factory):
    from specbound.models.gguf import ModelPackageMissingError
    from specbound.models.pair import load_pair

    try:
        load_pair("default-target", "default-draft", progress=False)
    except ModelPackageMissingError as error:
        pytest.skip(str(error))
    return tmp_path_factory.mktemp("real")


def test_acceptance_study_on_the_default_pair(results_dir):
    arguments = ["study", "acceptance", "--dataset", "humaneval", "--limit", "2", "--max-new-tokens", "16",
                 "--num-drafts", "2,3", "--out", str(results_dir), "--quiet"]
    assert main(arguments) == 0
    results = read_results(results_dir / "acceptance" / "humaneval")
    assert len(results.runs) == 2
    assert json.loads(json.dumps(results.settings))["models"]["vocab_size"] > 150_000
    for record in results.positions:
        values = record["acceptance"]
        assert 0.0 <= values["single"] <= values["rrs"] + 1e-9 <= values["optimal_with_replacement"] + 2e-9
        assert values["greedy"] == pytest.approx(values["optimal_greedy"], abs=1e-9)


def test_bias_study_on_the_default_pair(results_dir):
    arguments = ["study", "bias", "--dataset", "instructions", "--limit", "1", "--max-new-tokens", "16",
                 "--epsilons", "0.1,0.4", "--out", str(results_dir), "--quiet"]
    assert main(arguments) == 0
    results = read_results(results_dir / "bias" / "instructions")
    for record in results.positions:
        for point in record["points"]:
            if point["method"] == "decoding_opt":
                assert point["bias"] + point["rejection"] == pytest.approx(record["total_variation"], abs=1e-9)


def test_report_on_the_default_pair(results_dir):
    assert main(["report", str(results_dir)]) == 0
    assert "default-target" in (results_dir / "report" / "report.md").read_text()
