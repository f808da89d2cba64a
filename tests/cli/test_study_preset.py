"""``specbound study acceptance --preset hu2025``: one flag for Hu et al.'s settings, each
overridden by an option given explicitly (parsed only: no model is loaded)."""

import pytest

from specbound.cli import build_parser, main
from specbound.cli.study import _available, apply_preset
from specbound.studies.acceptance import HU2025_DATASETS, acceptance_methods


def parsed(*options):
    args = build_parser().parse_args(["study", "acceptance", *options])
    return args, apply_preset(args)


def test_hu2025_preset_sets_the_papers_settings():
    args, chosen = parsed("--preset", "hu2025")
    assert args.dataset == list(HU2025_DATASETS) == chosen
    assert {"mt_bench", "mmlu", "edit", "instructions", "summarize", "translate_de_en"} == set(args.dataset)
    assert args.limit == 1024 and args.max_new_tokens == 128 and args.temperature == [0.7]
    assert args.num_drafts == [2, 3, 4, 6]
    assert args.methods == list(acceptance_methods()) and len(args.methods) >= 9


@pytest.mark.parametrize("preset", [[], ["--preset", "hu2025"]])
def test_an_explicit_option_wins_over_the_preset(preset):
    args, chosen = parsed("--num-drafts", "3", "--limit", "5", "--dataset", "edit", "--max-new-tokens", "16", *preset)
    assert (args.num_drafts, args.limit, args.dataset, args.max_new_tokens) == ([3], 5, ["edit"], 16)
    assert chosen == []  # an explicit --dataset is read as given, never filtered


def test_without_a_preset_the_defaults_stay():
    args, chosen = parsed()
    assert (args.num_drafts, args.limit, args.dataset, args.max_new_tokens, args.temperature) == (
        [3], None, ["humaneval"], 128, [0.7])
    assert chosen == []


def test_help_says_what_the_preset_sets(capsys):
    with pytest.raises(SystemExit):
        main(["study", "acceptance", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for setting in ("--limit 1024", "--num- drafts 2,3,4,6", "--max-new-tokens 128", "mt_bench", "override"):
        assert setting.replace("- ", "-") in text.replace("- ", "-")


def test_a_preset_set_that_cannot_be_read_is_left_out_with_the_reason(capsys):
    assert not _available("no-such-prompt-set.jsonl")
    assert "leaving out" in capsys.readouterr().err
    assert _available("edit")


def test_an_unknown_preset_is_refused(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["study", "acceptance", "--preset", "nope"])
