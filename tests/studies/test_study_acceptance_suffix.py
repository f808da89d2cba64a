"""The acceptance study with ``--drafter suffix`` (``studies.acceptance_suffix``) on the tiny
pair: suffix drafts along the target's own texts, with no draft model.

The exact figure is checked against an independent computation: at every position, α* of the
recorded draft set S by the coupling LP over every ordered tuple of the tiny vocabulary (any
draft law on S drawing |S| distinct drafts draws exactly S), on target rows re-scored by one
forward of the target, must equal the recorded p(S); the chain's draft is in S. The history
is global: a prompt that repeats the start of an earlier unit's output drafts the token that
followed it there, which neither its own prompt nor an empty history holds. Resumed,
extended and batched runs write the same records.
"""

import dataclasses
import json

import numpy as np
import pytest

from specbound.cli import main
from specbound.datasets import Prompt
from specbound.drafts import get_draft_scheme
from specbound.engine import Processing
from specbound.models.tiny import EOS, tiny_pair, tiny_prompts
from specbound.studies.acceptance import AcceptanceStudy
from specbound.studies.acceptance_suffix import SuffixHistoryRun, replay_summary, suffix_summary
from specbound.studies.runner import run_study
from specbound.studies.traces import next_token_probs

CHARACTERS = {1: "d", 2: "e", 3: "a", 4: "b", 5: "c"}  # the tiny pair's token -> a character it encodes to


def suffix_study(**options) -> AcceptanceStudy:
    return AcceptanceStudy(drafter="suffix", **{"max_new_tokens": 12, "temperatures": (1.0,)} | options)


def records(directory) -> list[dict]:
    return [json.loads(line) for line in (directory / "records.jsonl").read_text().splitlines()]


def test_suffix_acceptance_is_the_optimum_of_its_fixed_drafts_at_every_position(tmp_path):
    pair, processing = tiny_pair(), Processing(temperature=1.0)
    results = run_study(suffix_study(), pair, tiny_prompts(5), tmp_path, "toy", progress=False)
    optimum_lp = get_draft_scheme("without_replacement").optimum_lp
    prompts = {prompt.id: prompt for prompt in tiny_prompts(5)}
    drafted, chains_shorter = 0, 0
    for run in results.runs:
        rows = next_token_probs(pair.target, pair.encode(prompts[run["prompt_id"]].text), run["tokens"], processing)
        for record in (r for r in results.positions if r["unit"] == run["unit"]):
            tree, chain = record["drafts"]["suffix_tree"], record["drafts"]["suffix_chain"]
            target_probs = rows[record["position"]]  # [vocab]
            assert record["acceptance"]["suffix_chain"] <= record["acceptance"]["suffix_tree"]
            assert set(chain) <= set(tree) and len(chain) == min(len(tree), 1) and len(tree) <= 3
            if not tree:
                assert record["acceptance"]["suffix_tree"] == 0.0
                continue
            draft_probs = np.zeros_like(target_probs)
            draft_probs[tree] = 1.0 / len(tree)
            alpha = optimum_lp(target_probs[None], draft_probs[None], len(tree))[0]
            assert record["acceptance"]["suffix_tree"] == pytest.approx(alpha, abs=1e-6)
            assert record["acceptance"]["suffix_chain"] == pytest.approx(target_probs[chain[0]], abs=1e-6)
            drafted += 1
            chains_shorter += record["acceptance"]["suffix_chain"] < record["acceptance"]["suffix_tree"] - 1e-9
        for name, steps in run["suffix"]["accepted"].items():  # each step emits its accepted drafts and one more
            assert sum(steps) + len(steps) == len(run["tokens"]), name
    assert drafted > 20 and chains_shorter > 5  # the checks saw drafts, and trees beyond their chain
    one_step, replayed = suffix_summary(results), replay_summary(results)
    assert one_step[(1.0, "suffix_tree")][0] >= one_step[(1.0, "suffix_chain")][0]
    assert 0 < one_step[(1.0, "drafted")][0] <= 1
    tokens = sum(len(run["tokens"]) for run in results.runs)
    calls = {name: sum(len(run["suffix"]["accepted"][name]) for run in results.runs)
             for name in ("suffix_tree", "suffix_chain")}
    assert replayed[(1.0, "suffix_tree")][0] == pytest.approx(tokens / calls["suffix_tree"])
    assert replayed[(1.0, "ratio")][0] == pytest.approx(calls["suffix_chain"] / calls["suffix_tree"])
    assert replayed[(1.0, "ratio")][1] >= 0


def test_the_history_is_global_a_unit_drafts_from_an_earlier_units_output(tmp_path):
    """Unit "first" writes X; prompt "second" is X[:k], k chosen so that X[k] is no token of
    X[:k]. Run after "first", its first position drafts X[k], which only the history holds;
    run first, it does not."""
    pair = tiny_pair()
    first = Prompt("a", "cab", "toy")
    text = run_study(suffix_study(), pair, [first], tmp_path / "alone", "toy", progress=False).runs[0]["tokens"]
    k = next(k for k in range(2, len(text)) if text[k] not in text[:k] and EOS not in text[: k + 1])
    second = Prompt("b", "".join(CHARACTERS[token] for token in text[:k]), "toy")
    assert pair.encode(second.text) == text[:k]
    drafts = {}
    for order in ([first, second], [second, first]):
        folder = tmp_path / order[0].id
        results = run_study(suffix_study(), pair, order, folder, "toy", progress=False)
        start = next(r for r in results.positions if r["prompt_id"] == "b" and r["position"] == 0)
        drafts[order[0].id] = start["drafts"]["suffix_tree"]
        run = next(run for run in results.runs if run["prompt_id"] == "b")
        assert run["suffix"]["history_outputs"] == (order[0].id == "a")
    assert text[k] in drafts["a"]
    assert text[k] not in drafts["b"]


def assert_same_but_rounding(lines: list[dict], expected: list[dict]) -> None:
    """The same records, the acceptances to 1e-6: a batched forward rounds otherwise than a
    one-row one, so batched units' rows differ in their last digits (their texts, drafts and
    replayed steps do not)."""
    assert len(lines) == len(expected)
    for line, wanted in zip(lines, expected):
        assert {**line, "acceptance": None} == {**wanted, "acceptance": None}
        assert line.get("acceptance", {}) == pytest.approx(wanted.get("acceptance", {}), abs=1e-6)


def test_resumed_extended_and_batched_runs_write_the_same_records(tmp_path, monkeypatch):
    prompts = tiny_prompts(4)
    run_study(suffix_study(temperatures=(0.7, 1.0)), tiny_pair(), prompts, tmp_path / "once", "toy", progress=False)
    expected = records(tmp_path / "once")
    assert [r["unit"] for r in expected if r["kind"] == "run"][:3] == ["toy/0|T=0.7", "toy/0|T=1", "toy/1|T=0.7"]
    run_study(suffix_study(temperatures=(0.7, 1.0)), tiny_pair(), prompts[:2], tmp_path / "extended", "toy",
              progress=False)
    run_study(suffix_study(temperatures=(0.7, 1.0)), tiny_pair(), prompts, tmp_path / "extended", "toy",
              progress=False, batch_size=3)
    assert_same_but_rounding(records(tmp_path / "extended"), expected)
    unit, calls = SuffixHistoryRun.unit, []

    def interrupted(self, *arguments):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return unit(self, *arguments)

    monkeypatch.setattr(SuffixHistoryRun, "unit", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_study(suffix_study(temperatures=(0.7, 1.0)), tiny_pair(), prompts, tmp_path / "resumed", "toy",
                  progress=False)
    assert len([r for r in records(tmp_path / "resumed") if r["kind"] == "run"]) == 3
    monkeypatch.setattr(SuffixHistoryRun, "unit", unit)
    run_study(suffix_study(temperatures=(0.7, 1.0)), tiny_pair(), prompts, tmp_path / "resumed", "toy",
              progress=False)
    assert records(tmp_path / "resumed") == expected


def test_records_written_out_of_history_order_refuse_a_resume(tmp_path):
    prompts = tiny_prompts(3)
    run_study(suffix_study(), tiny_pair(), prompts, tmp_path, "toy", progress=False)
    lines = (tmp_path / "records.jsonl").read_text().splitlines(keepends=True)
    first_unit = [line for line in lines if json.loads(line)["unit"] == "toy/0|T=1"]
    (tmp_path / "records.jsonl").write_text("".join(line for line in lines if line not in first_unit))
    with pytest.raises(ValueError, match="out: .*'toy/0\\|T=1'"):
        run_study(suffix_study(), tiny_pair(), prompts, tmp_path, "toy", progress=False)


def test_suffix_settings_that_need_a_draft_model_are_refused():
    with pytest.raises(ValueError, match="generation_gamma"):
        AcceptanceStudy(drafter="suffix", generation_gamma=2)
    with pytest.raises(ValueError, match="drafter"):
        AcceptanceStudy(drafter="magic")
    with pytest.raises(ValueError, match="drafter"):  # the history is begun by the runner, not on Ray
        suffix_study().suffix_output(tiny_pair(), suffix_study().units(tiny_prompts(1))[0], None)


# -- the command line ---------------------------------------------------------------------------
@pytest.fixture
def loads(monkeypatch):
    """The (target, draft) each call of ``load_pair`` was asked for; it gives the tiny pair."""
    loaded = []

    def load_pair(target, draft, dtype, progress=True, float32_twins=None, backend="torch"):
        loaded.append((target, draft))
        description = {**tiny_pair().description, "target": target, "draft": draft,
                       "dtype": str(dtype).removeprefix("torch."), "float32_twins": bool(float32_twins)}
        pair = tiny_pair()
        return dataclasses.replace(pair, draft=None if draft is None else pair.draft, description=description)

    monkeypatch.setattr("specbound.models.pair.load_pair", load_pair)
    return loaded


def command(tmp_path, study="acceptance", *options) -> list[str]:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("ab\ncab\nbcd\n")
    return ["study", study, "--dataset", str(prompts), "--out", str(tmp_path / "out"), "--max-new-tokens", "6",
            "--batch-size", "1", "--quiet", "--backend", "torch", "--dtype", "float32", *options]


def test_the_command_runs_the_suffix_study_without_a_draft_model_and_reports_it(tmp_path, loads, capsys):
    assert main(command(tmp_path, "acceptance", "--drafter", "suffix")) == 0
    out = capsys.readouterr().out
    assert loads == [("default-target", None)]
    assert "suffix drafts, exact one-step acceptance per token" in out and "tree ÷ chain" in out
    settings = json.loads((tmp_path / "out" / "acceptance" / "prompts" / "settings.json").read_text())
    assert settings["drafter"] == "suffix" and settings["models"]["draft"] is None
    assert main(command(tmp_path, "acceptance", "--drafter", "suffix")) == 0  # nothing left: no model loads
    assert len(loads) == 1 and capsys.readouterr().out == out
    assert main(["report", str(tmp_path / "out")]) == 0
    report = next((tmp_path / "out").rglob("report.md")).read_text()
    assert "Acceptance study with suffix drafts" in report and "tree ÷ chain" in report


@pytest.mark.parametrize("option", [["--draft", "x"], ["--num-drafts", "2"], ["--methods", "single"],
                                    ["--gamma", "0"], ["--tail-budget", "0"], ["--workers", "1"],
                                    ["--preset", "hu2025"], ["--ray"]])
def test_options_that_suffix_drafts_leave_unused_are_refused_before_anything_loads(tmp_path, loads, capsys,
                                                                                    option):
    assert main(command(tmp_path, "acceptance", "--drafter", "suffix", *option)) == 2
    message = capsys.readouterr().err
    assert f"{option[0]} " in message and "--drafter suffix" in message and message.count("\n") == 1
    assert loads == [] and not (tmp_path / "out" / "acceptance").exists()


@pytest.mark.parametrize("study", ["bias", "multistep", "rejections"])
def test_studies_whose_theory_needs_a_draft_model_take_no_drafter(tmp_path, loads, capsys, study):
    with pytest.raises(SystemExit) as exit_info:
        main(command(tmp_path, study, "--drafter", "suffix"))
    assert exit_info.value.code == 2 and "--drafter" in capsys.readouterr().err
    assert loads == []


def test_the_draft_model_study_still_loads_its_draft(tmp_path, loads):
    assert main(command(tmp_path, "acceptance", "--num-drafts", "2", "--workers", "1", "--methods", "single")) == 0
    assert loads == [("default-target", "default-draft")]



def test_the_suffix_tree_is_chosen_on_the_command_line_and_only_with_suffix_drafts(tmp_path, loads, capsys):
    assert main(command(tmp_path, "acceptance", "--drafter", "suffix", "--suffix-tree", "6/3/3/2")) == 0
    settings = json.loads((tmp_path / "out" / "acceptance" / "prompts" / "settings.json").read_text())
    assert settings["suffix_tree"] == {"budget": 6, "depth": 3, "width": 3, "max_children": 2}
    assert settings["suffix_chain"] == {"gamma": 3}
    capsys.readouterr()
    (tmp_path / "model").mkdir()
    assert main(command(tmp_path / "model", "acceptance", "--suffix-tree", "6/3/3/2")) == 2
    assert "--suffix-tree" in capsys.readouterr().err and len(loads) == 1
    with pytest.raises(SystemExit) as exit_info:
        main(command(tmp_path / "model", "acceptance", "--drafter", "suffix", "--suffix-tree", "6/3"))
    assert exit_info.value.code == 2 and "--suffix-tree" in capsys.readouterr().err
