"""``specbound study`` takes its results folder before any model loads: a second study on the
same --out is refused at once, a resume with nothing left to do loads no model, damaged
records are refused with their line before a model loads, and an unreachable --ray address
fails in seconds. The pair the command would load is the tiny one, described as the
options ask (``cli.study.asked_models``)."""

import dataclasses
import json
import time

import pytest

from specbound.cli import main
from specbound.studies.records import RECORDS_FILE, ResultsStore
from specbound.models.tiny import tiny_pair

OPTIONS = ["--max-new-tokens", "3", "--num-drafts", "2", "--workers", "1", "--batch-size", "1", "--quiet",
           "--backend", "torch", "--dtype", "float32"]
UNREACHABLE = "127.0.0.1:1"  # nothing listens on port 1


@pytest.fixture
def loads(monkeypatch):
    """The pairs the command loaded: each call of ``load_pair`` gives the tiny pair."""
    loaded = []

    def load_pair(target, draft, dtype, progress=True, float32_twins=None, backend="torch"):
        loaded.append(target)
        description = {**tiny_pair().description, "target": target, "draft": draft,
                       "dtype": str(dtype).removeprefix("torch."), "float32_twins": bool(float32_twins)}
        return dataclasses.replace(tiny_pair(), description=description)

    monkeypatch.setattr("specbound.models.pair.load_pair", load_pair)
    return loaded


def study(tmp_path, *options) -> list[str]:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("ab\ncab\n")
    return ["study", "acceptance", "--dataset", str(prompts), "--out", str(tmp_path / "out"), *OPTIONS, *options]


def folder(tmp_path):
    return tmp_path / "out" / "acceptance" / "prompts"


def test_a_second_study_on_the_same_out_is_refused_before_any_model_loads(tmp_path, loads, capsys):
    """The lock was taken after the models had loaded (31 s on the default pair)."""
    folder(tmp_path).mkdir(parents=True)
    with ResultsStore(folder(tmp_path), {"study": "acceptance"}):
        assert main(study(tmp_path)) == 2
    assert "in use by another run" in capsys.readouterr().err
    assert loads == []


def test_a_resume_with_nothing_left_to_do_loads_no_model(tmp_path, loads, capsys):
    assert main(study(tmp_path)) == 0
    first = capsys.readouterr()
    assert main(study(tmp_path)) == 0
    again = capsys.readouterr()
    assert loads == ["default-target"]
    assert "nothing left to do" in again.err and again.out == first.out  # the same tables, read back
    assert main(study(tmp_path, "--limit", "1")) == 0  # a subset: nothing to do either
    assert main(study(tmp_path, "--target", "smollm2")) == 2  # other models: loaded, then refused
    assert loads == ["default-target", "smollm2"] and "models differ" in capsys.readouterr().err


def test_damaged_records_refuse_a_resume_naming_the_line_before_any_model_loads(tmp_path, loads, capsys):
    assert main(study(tmp_path, "--limit", "1")) == 0
    records = folder(tmp_path) / RECORDS_FILE
    lines = records.read_text().splitlines(keepends=True)
    records.write_text(lines[0] + "".join(lines))  # the first position line twice
    capsys.readouterr()
    assert main(study(tmp_path)) == 2
    message = capsys.readouterr().err.strip()
    assert f"{records} line 2" in message and "second position record" in message and message.count("\n") == 0
    assert loads == ["default-target"]


@pytest.mark.parametrize("finished", [False, True])
def test_an_unreachable_ray_address_fails_in_seconds_naming_the_option(tmp_path, loads, monkeypatch, capsys,
                                                                        finished):
    """Ray retried for minutes, saying nothing, even when every unit was written already."""
    if finished:
        assert main(study(tmp_path)) == 0
        capsys.readouterr()

    def no_ray(*args, **kwargs):
        raise AssertionError("ray.init would retry here for minutes")

    monkeypatch.setattr("specbound.studies.distributed.RayWorkers", no_ray)
    started = time.monotonic()
    assert main(study(tmp_path, "--ray", UNREACHABLE)) == 2
    message = capsys.readouterr().err.strip()
    assert time.monotonic() - started < 10
    assert message.count("\n") == 0 and "--ray" in message and UNREACHABLE in message


def test_check_reachable_leaves_ray_s_own_names_alone():
    from specbound.studies.distributed import check_reachable

    for address in (None, "local", "auto"):
        check_reachable(address)
    with pytest.raises(ValueError, match="address: no Ray cluster at ray://127.0.0.1:1"):
        check_reachable(f"ray://{UNREACHABLE}")


def test_refused_records_are_named_for_a_python_caller_too(tmp_path, loads):
    assert main(study(tmp_path, "--limit", "1")) == 0
    records = folder(tmp_path) / RECORDS_FILE
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    lines[0]["token"] = "two"
    records.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(ValueError, match=r"line 1: 'token' is \"two\", not an integer"):
        ResultsStore(folder(tmp_path), json.loads((folder(tmp_path) / "settings.json").read_text()))


def test_a_draft_with_another_tokenizer_is_refused_naming_the_draft():
    """A study scores the target's token ids with the draft (``traces.trace_probs``): a pair
    whose draft has another tokenizer is refused before anything decodes, in every study."""
    import torch

    from specbound.engine import Processing
    from specbound.engine.vocabulary import SharedVocabulary
    from specbound.studies import STUDIES
    from specbound.studies.traces import trace_probs
    from specbound.models.tiny import tiny_prompts

    pair = tiny_pair()
    vocabulary = SharedVocabulary(torch.arange(1, pair.vocab_size), torch.arange(1, pair.vocab_size),
                                  pair.vocab_size, pair.vocab_size)
    other = dataclasses.replace(pair, vocabulary=vocabulary)
    with pytest.raises(ValueError, match=r"^draft: .*target's tokenizer"):
        trace_probs(other, None, Processing(0.7, None, None, pair.vocab_size))
    for name, study_class in STUDIES.items():
        study = study_class(max_new_tokens=2)
        units = study.units(tiny_prompts(1))[:1]
        with pytest.raises(ValueError, match=r"^draft: "):
            study.run_units(other, units, [torch.Generator().manual_seed(0)])


def test_the_light_options_name_what_the_registries_hold():
    """``studies.options`` spells out the method names so that the command line reads them
    without torch; they must be the registries' own, and every study must have its entry."""
    from specbound.studies import STUDIES
    from specbound.studies.acceptance_methods import acceptance_methods
    from specbound.studies.options import ACCEPTANCE_METHODS, BIASED_METHODS, STUDY_OPTIONS
    from specbound.verifiers import VERIFIERS

    assert list(ACCEPTANCE_METHODS) == list(acceptance_methods())
    assert list(BIASED_METHODS) == [name for name, verifier in VERIFIERS.items() if not verifier.lossless]
    assert sorted(STUDY_OPTIONS) == sorted(STUDIES)
    for name, study in STUDIES.items():
        options = STUDY_OPTIONS[name]
        assert (study.help, study.order, study.record_fields, study.presets) == (
            options.help, options.order, options.record_fields, options.presets)
