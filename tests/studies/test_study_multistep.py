"""The multistep study: token-wise, block and traversal verification on the same drafted
steps of the engine, and the ladder up to the multi-step optimum on the tiny models.

E[τ | drafted tree] is exact given the tree, so averaged over steps it estimates the
realised accepted count of the verifier that decided: their difference has mean zero, and
over a few hundred seeded steps it lies within 4 standard errors (prompts as clusters). The
ladder is exact over the drafts at each step's prefix, so its order holds at every step.
"""

import json
import re

import pytest

from specbound.cli import main
from specbound.statistics import grouped_per_token_means
from specbound.studies.multistep import MultistepConfig, MultistepStudy, optimum_entries
from specbound.studies.multistep_report import ladder_table, multistep_summary
from specbound.studies.records import read_results
from specbound.studies.report import write_report
from specbound.studies.runner import run_study
from specbound.models.tiny import tiny_pair, tiny_prompts

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
LP_TOLERANCE = 1e-9


def run(study, prompts, directory):
    return run_study(study, tiny_pair(), prompts, directory, prompts[0].dataset, progress=False)


def record_lines(directory) -> set[bytes]:
    return set((directory / "records.jsonl").read_bytes().splitlines())


def test_the_study_runs_resumes_and_its_report_section_renders(tmp_path):
    study = MultistepStudy(max_new_tokens=6, gammas=[2], trees=[(2, 1), (2, 2)], sparse=[(4, 2)])
    resumed, fresh = tmp_path / "out" / "multistep" / "toy", tmp_path / "fresh"
    run(study, tiny_prompts(2), resumed)
    results = run(study, tiny_prompts(3), resumed)  # resumes: a larger limit extends the results
    assert len(results.runs) == 4 * 3
    run(study, tiny_prompts(3), fresh)
    assert record_lines(resumed) == record_lines(fresh)  # each unit its own seed: the same records
    for run_record in results.runs:
        steps = [step for step in results.positions if step["unit"] == run_record["unit"]]
        assert steps and all(step["tree_size"] > 0 for step in steps)
        assert sum(step["accepted"] + 1 for step in steps) >= len(run_record["tokens"])
    summary = {row["config"]: row for row in multistep_summary(results)}
    assert list(summary) == ["chain γ=2", "tree 2×1", "tree 2×2", "sparse 4/2"]
    assert summary["chain γ=2"]["block"] is not None and summary["tree 2×2"]["block"] is None
    statuses = {row[1]: row[-1] for row in ladder_table(results)[1]}
    assert statuses["chain γ=2"] == statuses["tree 2×1"] == "computed"
    assert statuses["tree 2×2"].startswith("not computed") and "--optimum-limit" in statuses["tree 2×2"]
    assert "frontier" in statuses["sparse 4/2"]

    markdown_path = write_report(tmp_path / "out")
    markdown, html = markdown_path.read_text(), markdown_path.with_suffix(".html").read_text()
    assert "Multi-step verification: token-wise, block and traversal" in markdown
    assert "best lossless verifier" in markdown and "<table>" in html
    images = [image for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown) if "multistep" in image]
    assert len(images) == 2  # verifiers by configuration, and the ladder
    for image in images:
        assert image in html
        data = (markdown_path.parent / image).read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 10_000


def paired_z(steps, value) -> float:
    """Mean of ``value`` per step over its standard error, prompts as clusters."""
    mean, error, _ = grouped_per_token_means(steps, lambda step: (), value)[()]
    return mean / error


@pytest.mark.parametrize("decide", ["multistep", "tokenwise"])
def test_expected_lengths_average_to_the_realised_counts_and_block_keeps_at_least_token_wise(decide, tmp_path):
    study = MultistepStudy(temperatures=(1.0,), max_new_tokens=24, gammas=[3], trees=[(2, 2)], decide=decide,
                           optimum_limit=0)
    results = run(study, tiny_prompts(72), tmp_path)
    decided = {run_record["config"]: run_record["decided_by"] for run_record in results.runs}
    keys = {"single": "tokenwise", "rrs_without_replacement": "tokenwise", "block": "block", "traversal": "traversal"}
    for label in ("chain γ=3", "tree 2×2"):
        steps = [step for step in results.positions if step["config"] == label]
        assert len(steps) > 150
        key = keys[decided[label]]
        assert abs(paired_z(steps, lambda step: step["accepted"] - step["expected"][key])) < 4, label
    chain = [step for step in results.positions if step["config"] == "chain γ=3"]
    assert all(step["expected"]["traversal"] == pytest.approx(step["expected"]["block"], abs=1e-12) for step in chain)
    assert all(step["expected"]["univer"] == pytest.approx(step["expected"]["traversal"], abs=1e-9)
               for step in results.positions)  # block on chains, traversal on trees without replacement
    assert paired_z(chain, lambda step: step["expected"]["block"] - step["expected"]["tokenwise"]) > -4
    assert all(step["ladder"] is None for step in results.positions)


def test_the_ladder_is_ordered_at_every_step_and_block_is_the_best_lossless_verifier_on_chains(tmp_path):
    study = MultistepStudy(max_new_tokens=8, gammas=[2], trees=[(2, 1), (3, 1)])
    results = run(study, tiny_prompts(3), tmp_path)
    assert results.positions
    for step in results.positions:
        ladder = step["ladder"]
        assert ladder["tokenwise"] <= ladder["multistep"] + LP_TOLERANCE
        assert ladder["multistep"] <= ladder["best_lossless"] + LP_TOLERANCE
        assert ladder["best_lossless"] <= ladder["coupling_bound"] + LP_TOLERANCE
        assert ladder["coupling_bound"] <= step["depth"] + LP_TOLERANCE
        if step["config"] == "chain γ=2":
            assert ladder["best_lossless"] == pytest.approx(ladder["multistep"], abs=1e-7)
    summary = {row["config"]: row for row in multistep_summary(results)}
    assert summary["tree 3×1"]["gap_multistep"][0] > 0  # traversal is not the best lossless verifier of a tree


def test_the_optimum_is_refused_above_its_limit_with_the_reason():
    assert optimum_entries(6, (1, 1)) == 6**2 * (6**3 + 6**2 + 6)  # 36 chains, each node's emitted sequences
    assert optimum_entries(6, (2,)) == 6**2 * (6**2 + 2 * 6)
    study = MultistepStudy()
    assert study.optimum_status(6, MultistepConfig("chain", 2, 2)) is None
    reason = study.optimum_status(151_936, MultistepConfig("chain", 2, 2))
    assert reason.startswith("not computed") and "V = 151,936" in reason and "--optimum-limit" in reason
    assert "frontier" in study.optimum_status(6, MultistepConfig("sparse", 8, 4))
    assert MultistepStudy(optimum_limit=0).optimum_status(6, MultistepConfig("tree", 2, 1)) is not None


def test_bad_settings_are_refused_naming_them():
    with pytest.raises(ValueError, match="gammas, trees, sparse"):
        MultistepStudy(gammas=[], trees=[], sparse=[])
    with pytest.raises(ValueError, match="gammas"):
        MultistepStudy(gammas=[0])
    with pytest.raises(ValueError, match="decide"):
        MultistepStudy(decide="both")
    with pytest.raises(ValueError, match="optimum_limit"):
        MultistepStudy(optimum_limit=-1)


def test_the_command_lists_its_options_and_exits_2_on_a_bad_one(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["study", "multistep", "--help"])
    assert exit_info.value.code == 0
    help_text = capsys.readouterr().out
    for option in ("--gammas", "--trees", "--sparse", "--decide", "--optimum-limit"):
        assert option in help_text
    for option, value in [("--trees", "2y2"), ("--gammas", "0"), ("--sparse", "8"), ("--optimum-limit", "-3"),
                          ("--decide", "both")]:
        with pytest.raises(SystemExit) as exit_info:
            main(["study", "multistep", option, value])
        assert exit_info.value.code == 2
        assert option in capsys.readouterr().err


@pytest.mark.slow
def test_multistep_study_on_the_default_pair(tmp_path):
    """The embedded default pair (Qwen2.5-Coder 1.5B / 0.5B): a short run of every family and
    the report; the optimum is out of reach at V = 151,936 and says so."""
    from specbound.models.gguf import ModelPackageMissingError
    from specbound.models.pair import load_pair

    try:
        load_pair("default-target", "default-draft", progress=False)
    except ModelPackageMissingError as error:
        pytest.skip(str(error))
    arguments = ["study", "multistep", "--dataset", "humaneval", "--limit", "1", "--max-new-tokens", "16",
                 "--gammas", "2", "--trees", "2x2", "--sparse", "8/4", "--out", str(tmp_path), "--quiet"]
    assert main(arguments) == 0
    results = read_results(tmp_path / "multistep" / "humaneval")
    assert len(results.runs) == 3
    assert json.loads(json.dumps(results.settings))["models"]["vocab_size"] > 150_000
    for run_record in results.runs:
        assert run_record["optimum"].startswith("not computed")
    for step in results.positions:
        assert step["ladder"] is None
        assert 0.0 <= step["expected"]["tokenwise"] <= step["depth"] + 1e-9
        if "block" in step["expected"]:
            assert step["expected"]["traversal"] == pytest.approx(step["expected"]["block"], abs=1e-9)
    assert main(["report", str(tmp_path)]) == 0
    assert "Multi-step verification" in (tmp_path / "report" / "report.md").read_text()


def test_iid_trees_are_decided_by_univer_beside_traversal_and_rrs_on_the_same_steps(tmp_path):
    """Trees drafted with replacement: UniVer (Global Resolution plans) decides, its exact
    E[τ | tree] averages to the realised counts, and on these steps its mean lies above
    traversal's, which lies above token-wise RRS's (paired, prompts as clusters; with 24
    prompts UniVer's lead is 1.6 standard errors: a direction, not a resolved gain)."""
    study = MultistepStudy(temperatures=(1.0,), max_new_tokens=24, gammas=[], trees=[], iid_trees=[(2, 2)],
                           optimum_limit=0)
    results = run(study, tiny_prompts(24), tmp_path)
    assert {run_record["decided_by"] for run_record in results.runs} == {"univer"}
    steps = results.positions
    assert len(steps) > 40 and all(step["config"] == "i.i.d. tree 2×2" for step in steps)
    assert abs(paired_z(steps, lambda step: step["accepted"] - step["expected"]["univer"])) < 4
    assert paired_z(steps, lambda step: step["expected"]["univer"] - step["expected"]["traversal"]) > 0
    assert paired_z(steps, lambda step: step["expected"]["traversal"] - step["expected"]["tokenwise"]) > 0
