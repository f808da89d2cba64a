"""The acceptance report sets our table beside Hu et al.'s published figures: our means
± 2 s.e. and gaps to α* next to theirs, and the orderings compared only where the paired
difference of the two methods lies beyond its 2 s.e. The studies here are faked: position
records written directly."""

from pathlib import Path

import pytest

from specbound.studies.acceptance import HU2025_DATASETS
from specbound.studies.acceptance_methods import acceptance_methods
from specbound.studies.acceptance_report import (acceptance_report, acceptance_summary, beside_published_table,
                                                 difference_summary, ordering_verdicts, published_gap)
from specbound.studies.document import to_markdown
from specbound.studies.published import NOT_COMPARABLE, PUBLISHED
from specbound.studies.records import StudyResults


def fake_study(dataset: str, acceptance_by_prompt: list[dict[str, float]], positions: int = 4) -> StudyResults:
    """One prompt per dict, each with ``positions`` positions at T = 0.7, n = 3 where every
    method has the dict's value."""
    records = [
        {"prompt_id": f"{dataset}/{prompt}", "temperature": 0.7, "num_drafts": 3, "acceptance": dict(values)}
        for prompt, values in enumerate(acceptance_by_prompt) for _ in range(positions)
    ]
    settings = {"dataset": dataset, "methods": list(acceptance_by_prompt[0]), "temperatures": [0.7],
                "num_drafts": [3]}
    return StudyResults(Path("unused"), settings, records, [], {})


def separated() -> StudyResults:
    """Greedy far above RRS without replacement on every prompt, prompts close together."""
    return fake_study("instructions", [
        {"optimal_without_replacement": 0.82 + shift, "rrs_without_replacement": 0.80 + shift, "greedy": 0.95 + shift,
         "optimal_greedy": 0.95 + shift} for shift in (0.0, 0.01, -0.01, 0.005)])


def overlapping() -> StudyResults:
    """Greedy and RRS without replacement within each other's spread over prompts."""
    return fake_study("instructions", [
        {"optimal_without_replacement": 0.9, "rrs_without_replacement": 0.6, "greedy": 0.65, "optimal_greedy": 0.65},
        {"optimal_without_replacement": 0.9, "rrs_without_replacement": 0.8, "greedy": 0.75, "optimal_greedy": 0.75},
        {"optimal_without_replacement": 0.9, "rrs_without_replacement": 0.7, "greedy": 0.72, "optimal_greedy": 0.72},
    ])


def shared_spread() -> StudyResults:
    """Prompts far apart (shifts ±0.1 shared by every method), greedy a steady ~0.01 above
    RRS without replacement on each: the two means' 2-s.e. intervals overlap, their paired
    difference is far from 0."""
    return fake_study("instructions", [
        {"optimal_without_replacement": 0.9 + shift, "rrs_without_replacement": 0.8 + shift,
         "greedy": 0.81 + shift + wobble, "optimal_greedy": 0.81 + shift + wobble}
        for shift, wobble in ((0.0, 0.001), (0.1, -0.001), (-0.1, 0.0), (0.05, 0.002))])


def test_every_published_figure_names_a_study_method_and_a_dataset_of_hu2025():
    assert PUBLISHED.keys() | NOT_COMPARABLE.keys() <= set(HU2025_DATASETS)
    for table in PUBLISHED.values():
        assert table.acceptance.keys() <= acceptance_methods().keys()
        assert all(0.0 < value < 1.0 for value in table.acceptance.values()) and "SPEC.md" in table.source


def test_the_table_sets_ours_with_two_errors_beside_the_published_figures_and_gaps():
    results = separated()
    headers, rows = beside_published_table(results, PUBLISHED["instructions"])
    assert headers == ["method", "ours (± 2 s.e.)", "ours: α* − α", "Hu et al., Alpaca", "Hu et al.: α* − α"]
    by_method = {row[0]: row for row in rows}
    # 4 prompts of 4 positions each: the standard error over prompts of their shifts
    shifts = [0.0, 0.01, -0.01, 0.005]
    mean = sum(shifts) / 4
    error = (sum((s - mean) ** 2 for s in shifts) * 4 / 3) ** 0.5 / 4
    assert by_method["RRS without replacement"][1] == f"{0.80 + mean:.4f} ± {2 * error:.4f}"
    assert by_method["RRS without replacement"][2] == "0.0200 ± 0.0000"  # paired: the same 0.02 at every position
    assert by_method["RRS without replacement"][3:] == ["0.889", "0.010"]  # 0.899 − 0.889
    assert by_method["α* without replacement"][2:] == ["—", "0.899", "—"]
    assert by_method["greedy verifier"][3:] == ["0.907", "—"]  # α* greedy is not published


def test_the_ordering_is_stated_where_the_intervals_separate():
    verdicts = ordering_verdicts(separated(), PUBLISHED["instructions"])
    greedy = next(line for line in verdicts if line.startswith("greedy vs RRS without replacement"))
    assert "Hu et al. greedy verifier higher (0.907 vs 0.889)" in greedy
    assert "ours greedy verifier higher" in greedy and greedy.endswith("the orderings agree.")
    # RRS (with replacement) and K-SEQ are published for Alpaca but not run in this study
    assert any(line.startswith("K-SEQ vs RRS") and line.endswith("ours not measured.") for line in verdicts)


def test_the_ordering_is_not_resolved_where_the_intervals_overlap():
    greedy = next(line for line in ordering_verdicts(overlapping(), PUBLISHED["instructions"])
                  if line.startswith("greedy vs RRS without replacement"))
    assert greedy.endswith("not resolved at this sample size.") and "agree" not in greedy


def test_an_opposite_ordering_is_reported_as_differing():
    results = fake_study("summarize", [
        {"rrs_without_replacement": 0.9 + shift, "greedy": 0.7 + shift} for shift in (0.0, 0.01, -0.01)])
    (line,) = ordering_verdicts(results, PUBLISHED["summarize"])
    assert "Hu et al. greedy verifier higher (0.842 vs 0.815)" in line
    assert "ours RRS without replacement higher" in line and line.endswith("the orderings differ.")


def test_a_dataset_without_a_published_counterpart_gets_no_published_column(tmp_path):
    other = fake_study("humaneval", [{"rrs_without_replacement": 0.8, "greedy": 0.9}] * 2)
    mt_bench = fake_study("mt_bench", [{"rrs_without_replacement": 0.8, "greedy": 0.9}] * 2)
    markdown = to_markdown(acceptance_report([separated(), other, mt_bench], tmp_path))
    assert "### Beside Hu et al.'s published table" in markdown
    assert "#### instructions (T = 0.7, n = 3) beside Hu et al.'s Alpaca" in markdown
    section = markdown.split("#### humaneval (T = 0.7, n = 3)")[1].split("####")[0]
    assert "| method | ours (± 2 s.e.) | ours: α* − α |\n" in section and "Hu et al.," not in section
    assert "no published counterpart" in section
    mt_bench_section = markdown.split("#### mt_bench (T = 0.7, n = 3)")[1]
    assert "Hu et al.," not in mt_bench_section.split("\n\n")[1] and "multi-step draft trees" in mt_bench_section


def test_a_report_of_datasets_without_counterparts_has_no_published_section(tmp_path):
    markdown = to_markdown(acceptance_report([fake_study("toy", [{"greedy": 0.9}] * 2)], tmp_path))
    assert "Beside Hu et al." not in markdown


@pytest.mark.parametrize("dataset", sorted(PUBLISHED))
def test_published_gaps_are_never_negative(dataset):
    table = PUBLISHED[dataset]
    gaps = [published_gap(table, method, 3) for method in table.acceptance]
    assert all(gap >= 0.0 for gap in gaps if gap is not None)


def test_the_cost_at_the_papers_scale_comes_from_the_reports_own_unit_times():
    """Two units of 20 s and 40 s (generation, scoring and exact part each): 30 s a unit on
    average, so 4,096 units take 4096 · 30 s = 34.1 h here and a sixteenth on 16 workers;
    a report without timings states nothing."""
    from specbound.studies.acceptance_report import scale_blocks, scale_projection

    results = separated()
    assert scale_projection([results]) is None and scale_blocks([results]) == []
    results.timings.update({
        "instructions/0|T=0.7": {"generate": 10.0, "score": 2.0, "acceptance": 8.0, "total": 20.0},
        "instructions/1|T=0.7": {"generate": 20.0, "score": 4.0, "acceptance": 16.0, "total": 40.0},
    })
    projection = scale_projection([results])
    assert projection["units"] == 2 and projection["mean"]["total"] == 30.0 and projection["mean"]["generate"] == 15.0
    assert projection["paper_hours"] == pytest.approx(4096 * 30.0 / 3600)
    text = to_markdown(scale_blocks([results]))
    assert "30.0 s each" in text and "34.1 h on this machine" in text and "2.1 h on 16" in text


def test_the_paired_difference_is_the_mean_of_the_per_prompt_differences_with_their_error():
    """Every prompt has 4 positions, so the per-token difference is the mean of the per-prompt
    differences 0.011, 0.009, 0.010, 0.012, and its error the standard error of those four."""
    (key, (mean, error, positions)), = difference_summary(shared_spread(), "greedy", "rrs_without_replacement").items()
    differences = [0.011, 0.009, 0.010, 0.012]
    centre = sum(differences) / 4
    assert key == (0.7, 3) and positions == 16 and mean == pytest.approx(centre, abs=1e-12)
    assert error == pytest.approx((sum((d - centre) ** 2 for d in differences) / 3) ** 0.5 / 2, rel=1e-9)


def test_an_ordering_hidden_by_the_prompts_spread_is_resolved_by_the_paired_difference():
    """Both means' 2-s.e. intervals overlap (the prompts differ by ±0.1), yet greedy is above
    RRS without replacement on every prompt: the paired verdict resolves it, the interval
    overlap this report used before could not."""
    results = shared_spread()
    summary = acceptance_summary(results)
    (greedy, greedy_error, _), (rrs, rrs_error, _) = (summary[(0.7, 3, m)] for m in ("greedy", "rrs_without_replacement"))
    assert greedy - 2 * greedy_error < rrs + 2 * rrs_error  # the intervals overlap
    line = next(line for line in ordering_verdicts(results, PUBLISHED["instructions"])
                if line.startswith("greedy vs RRS without replacement"))
    assert "ours greedy verifier higher" in line and "difference +0.0105 ± 0.0013" in line
    assert line.endswith("the orderings agree.")


def test_the_per_prompt_file_gives_back_every_per_token_mean(tmp_path):
    """Prompts of 4, 2 and 3 positions with values that vary by position: the file's
    per-prompt means, weighted by their positions, give acceptance_summary's per-token mean
    to rounding, and every prompt has its own line."""
    import csv

    from specbound.studies.acceptance_report import write_prompt_means

    records = [{"prompt_id": f"instructions/{prompt}", "temperature": 0.7, "num_drafts": 3, "tail_bound": 1e-7 * position,
                "acceptance": {"greedy": 0.5 + 0.1 * prompt + 0.01 * position, "rrs_without_replacement": 0.4 + 0.001 * position}}
               for prompt, length in enumerate((4, 2, 3)) for position in range(length)]
    settings = {"dataset": "instructions", "methods": ["greedy", "rrs_without_replacement"], "temperatures": [0.7],
                "num_drafts": [3]}
    results = StudyResults(Path("unused"), settings, records, [], {})
    path = write_prompt_means(results, tmp_path / "prompts.csv")
    lines = list(csv.DictReader(path.open()))
    assert [line["prompt_id"] for line in lines] == ["instructions/0", "instructions/1", "instructions/2"]
    assert [int(line["positions"]) for line in lines] == [4, 2, 3]
    assert float(lines[0]["max_tail_bound"]) == pytest.approx(3e-7)
    summary = acceptance_summary(results)
    for method in settings["methods"]:
        pooled = sum(float(line[method]) * int(line["positions"]) for line in lines) / 9
        assert pooled == pytest.approx(summary[(0.7, 3, method)][0], abs=1e-15)


def test_a_difference_without_an_error_estimate_orders_nothing():
    """One prompt gives no standard error (NaN), a missing difference none at all: neither
    is a verdict, and both print."""
    from specbound.studies.acceptance_report import _signed, paired_higher

    assert paired_higher("greedy", "rrs", (0.5, float("nan"), 4)) is None and paired_higher("greedy", "rrs", None) is None
    assert paired_higher("greedy", "rrs", (0.01, 0.0, 4)) == "greedy" and paired_higher("greedy", "rrs", (0.0, 0.0, 4)) is None
    assert _signed((0.5, float("nan"), 4)) == "+0.5000" and _signed(None) == "—"
    line = next(line for line in ordering_verdicts(fake_study("instructions", [{"rrs_without_replacement": 0.8,
                                                                                "greedy": 0.9}]), PUBLISHED["instructions"])
                if line.startswith("greedy vs RRS without replacement"))
    assert line.endswith("difference +0.1000 (± 2 s.e., paired over prompts): not resolved at this sample size.")
