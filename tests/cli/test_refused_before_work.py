"""Inputs that only fail once work has started are checked before it starts (before any
model loads): an output folder that cannot be written, a prompts file that cannot be read,
a results folder whose settings are not a study's; each refused in one line naming the
option, with status 2. Every value the handlers check is checked before torch loads."""

import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from specbound.cli import main
from specbound.cli.study import DEFAULT_OUT

UNWRITABLE = "/proc/specbound-test/out"  # /proc takes no new folder, not even from root
needs_proc = pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs Linux's /proc")


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("a b c\n")
    return str(path)


def refusal(capsys) -> str:
    message = capsys.readouterr().err.strip()
    assert "Traceback" not in message and message.count("\n") == 0, message
    return message


@needs_proc
@pytest.mark.usefixtures("no_model_loads")
@pytest.mark.parametrize(("command", "option"), [
    (["run", "--max-new-tokens", "2"], "--output-dir"),
    (["study", "acceptance", "--max-new-tokens", "2", "--quiet"], "--out"),
    (["theory", "convergence", "--horizon", "5", "--vocab", "3", "--runs", "20"], "--out"),
    (["theory", "pareto", "--random-points", "5"], "--out"),
    (["bounds", "plot", "--max-drafts", "2"], "--out"),
])
def test_an_output_folder_that_cannot_be_written_is_refused_before_the_work(command, option, prompts, capsys):
    """``run --output-dir /proc/qa`` used to load both models, then fail with FileNotFoundError."""
    data = ["--prompts", prompts] if command[0] == "run" else ["--dataset", prompts] if command[0] == "study" else []
    assert main([*command, *data, option, UNWRITABLE]) == 2
    message = refusal(capsys)
    assert option in message and UNWRITABLE in message


@pytest.mark.usefixtures("no_model_loads")
@pytest.mark.parametrize("suffix", [".gz", ".jsonl.gz"])
@pytest.mark.parametrize("command", ["run", "study"])
def test_a_prompts_file_that_is_not_gzip_is_refused_naming_the_file(suffix, command, tmp_path, capsys):
    """Random bytes named ``garbage.gz`` used to end in gzip.BadGzipFile's traceback."""
    garbage = tmp_path / f"garbage{suffix}"
    garbage.write_bytes(np.random.default_rng(0).bytes(300))
    truncated = tmp_path / f"truncated{suffix}"
    words = np.random.default_rng(1).integers(ord("a"), ord("z") + 1, 3000, dtype=np.uint8).tobytes()
    compressed = gzip.compress(words + b"\n")
    truncated.write_bytes(compressed[:len(compressed) // 2])
    option = "--prompts" if command == "run" else "--dataset"
    for path in (garbage, truncated):
        arguments = ["run", "--output-dir", str(tmp_path / "out")] if command == "run" else [
            "study", "acceptance", "--out", str(tmp_path / "out"), "--quiet"]
        assert main([*arguments, option, str(path)]) == 2
        message = refusal(capsys)
        assert str(path) in message and option.lstrip("-") in message


@pytest.mark.usefixtures("no_model_loads")
@pytest.mark.parametrize("stored", [[1, 2], "settings", 3, None])
def test_a_results_folder_whose_settings_are_not_an_object_is_refused_before_a_model_loads(stored, prompts,
                                                                                            tmp_path, capsys):
    """A study folder whose settings.json held valid JSON but no object ([1, 2]) used to end in
    an AttributeError traceback after the models had loaded (16 s)."""
    folder = tmp_path / "out" / "acceptance" / "prompts"
    folder.mkdir(parents=True)
    (folder / "settings.json").write_text(json.dumps(stored))
    assert main(["study", "acceptance", "--dataset", prompts, "--out", str(tmp_path / "out"), "--quiet"]) == 2
    message = refusal(capsys)
    assert "out:" in message and str(folder / "settings.json") in message


def test_a_results_folder_whose_settings_are_not_an_object_is_refused_by_report(tmp_path, capsys):
    folder = tmp_path / "acceptance" / "toy"
    folder.mkdir(parents=True)
    (folder / "settings.json").write_text("[1, 2]")
    (folder / "records.jsonl").write_text(json.dumps({"kind": "run", "unit": "u"}) + "\n")
    assert main(["report", str(tmp_path)]) == 2
    message = refusal(capsys)
    assert message.startswith("specbound report: error: results:") and str(folder / "settings.json") in message


BEFORE_TORCH = [  # (arguments, the option the one-line refusal names): values checked in the handlers
    (["generate", "hi", "--max-new-tokens", "1000000000000"], "--max-new-tokens"),
    (["generate", "hi", "--method", "bogus"], "method"),
    (["generate", "hi", "--method", "chain:gamma=0"], "gamma"),
    (["generate", "hi", "--method", "tree:verifier=optimal"], "method"),
    (["run", "--prompts", "{prompts}", "--methods", "chain,bogus"], "methods"),
    (["run", "--prompts", "{prompts}", "--show", "5"], "show"),
    (["run", "--prompts", "{missing}"], "prompts"),
    (["serve", "--method", "sparse:budget=0"], "budget"),
    (["generate", "hi", "--target", "{short}", "--draft", "{short}", "--max-new-tokens", "64"], "max_new_tokens"),
    (["run", "--target", "{short}", "--draft", "{short}", "--max-new-tokens", "64"], "max_new_tokens"),
    (["study", "acceptance", "--limit", "0"], "--limit"),
    (["study", "bias", "--top-p", "2"], "--top-p"),
    (["study", "acceptance", "--ray", "bad"], "--ray"),
    (["report", "{empty}"], "results"),
    (["generate", "hi", "--target", "{missing}.gguf"], "--target"),
    (["generate", "hi", "--draft", "{empty}"], "--draft"),  # a folder without a config.json
    (["generate", "hi", "--drafter", "suffix", "--target", "{missing}.gguf"], "--target"),
    (["run", "--target", "{missing}.gguf", "--output-dir", "{out}"], "--target"),
    (["serve", "--draft", "{missing}.gguf"], "--draft"),
]
BEFORE_TORCH_CODE = """
import contextlib, io, json, sys
from specbound.cli import main
results = []
for arguments in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as errors:
        try:
            status = main(arguments)
        except SystemExit as ended:
            status = ended.code
    results.append([status, errors.getvalue().strip().splitlines()[-1]])
print(json.dumps({"results": results, "loaded": [name for name in ("torch", "transformers", "llama_cpp")
                                                 if name in sys.modules]}))
"""


def test_a_bad_value_is_refused_before_torch_loads(prompts, tmp_path):
    """The handlers check every value (methods and their options, prompt sets, indexes, the
    model sources) before they import torch, transformers or llama.cpp: a refusal takes no
    model stack's import time. One fresh interpreter for all of them."""
    short = tmp_path / "short"  # a model whose config gives 64 positions: refused before it loads
    short.mkdir()
    (short / "config.json").write_text(json.dumps({"model_type": "qwen2", "max_position_embeddings": 64}))
    (tmp_path / "empty").mkdir()
    calls = [[argument.format(prompts=prompts, missing=tmp_path / "missing.txt", short=short, empty=tmp_path / "empty",
                              out=tmp_path / "refused" / "out")
              for argument in arguments] for arguments, _ in BEFORE_TORCH]
    finished = subprocess.run([sys.executable, "-c", BEFORE_TORCH_CODE, json.dumps(calls)], capture_output=True,
                              text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr
    report = json.loads(finished.stdout)
    for (arguments, option), (status, message) in zip(BEFORE_TORCH, report["results"]):
        assert status == 2 and option.lstrip("-") in message, (arguments, status, message)
    assert report["loaded"] == []
    assert not (tmp_path / "refused").exists()  # a refused run makes no output folder


STUDY_BEFORE_TORCH = [  # (arguments, the option the refusal names): the study's own options, its name, its folder
    (["study", "nope"], "STUDY"),
    (["study", "bias", "--gamma", "0"], "--gamma"),
    (["study", "acceptance", "--preset", "nope"], "--preset"),
    (["study", "acceptance", "--num-drafts", "0"], "--num-drafts"),
    (["study", "multistep", "--trees", "0x2"], "--trees"),
    # sizes beyond the drafted tokens one target call verifies (engine.drafted), refused as they are parsed
    (["study", "bias", "--gamma", "5000"], "--gamma"),
    (["study", "acceptance", "--gamma", "5000"], "--gamma"),
    (["study", "multistep", "--gammas", "2,5000"], "--gammas"),
    (["study", "multistep", "--trees", "64x4"], "--trees"),
    (["study", "multistep", "--trees", "2x5000"], "--trees"),
    (["study", "multistep", "--iid-trees", "64x4"], "--iid-trees"),
    (["study", "multistep", "--sparse", "5000/4"], "--sparse"),
    # settings that span options (studies.sizes), refused by the study's check before the studies load
    (["study", "multistep", "--gammas", "none", "--trees", "none"], "trees"),
    (["study", "rejections", "--batch-sizes", "64"], "batch_sizes"),  # M = 64 drafts at γ = the horizon, 128
    (["study", "rejections", "--lookaheads", "5000", "--max-new-tokens", "6000"], "lookaheads"),
    (["study", "rejections", "--max-new-tokens", "5000"], "max_new_tokens"),  # lookahead inf drafts the horizon
    # a model that is none of the forms a pair loads from, checked as the other commands check it
    (["study", "bias", "--target", "/nonexistent/x.gguf"], "--target"),  # the default --out
    (["study", "acceptance", "--draft", "/nonexistent/d.gguf", "--out", "{refused}"], "--draft"),
    (["study", "multistep", "--target", "{no_model}", "--out", "{refused}"], "--target"),  # a folder, no config.json
    (["study", "rejections", "--draft", "{prompts}", "--out", "{refused}"], "--draft"),  # a file, no .gguf
    (["study", "acceptance", "--drafter", "suffix", "--target", "/nonexistent/x.gguf", "--out", "{refused}"],
     "--target"),
    (["study", "acceptance", "--dataset", "{prompts}", "--out", "{held}"], "--out"),
    (["study", "acceptance", "--dataset", "{prompts}", "--out", "{free}", "--ray", "127.0.0.1:1"], "--ray"),
    (["report", "{held}"], "results"),  # settings without a finished run
    (["report", "{lacking}"], "results"),  # settings without the study's own fields
]
STUDY_CODE = BEFORE_TORCH_CODE.replace('("torch", "transformers", "llama_cpp")',
                                       '("torch", "transformers", "llama_cpp", "numba", "scipy", "matplotlib")')


def test_a_study_refuses_its_name_options_folder_and_ray_before_the_studies_load(prompts, tmp_path):
    """``specbound study`` reads the studies' names, options and presets without torch
    (``studies.options``): an unknown study, a bad option of a study's own, a size beyond
    the engine's drafted tokens per target call (``engine.drafted``, as the option is parsed;
    across options, ``studies.sizes``), a results folder another run holds and an
    unreachable ``--ray`` are refused (status 2, naming the option) before the studies'
    registry loads torch, numba, scipy or matplotlib; so are results ``specbound report``
    cannot render (their fields are read without the studies too). The multistep and
    rejections studies' sizes used to be refused by their constructors, after the studies'
    imports. A ``--target`` or ``--draft`` that names no model used to be refused by the
    pair's loading, 5-7 s in; it and an unreachable ``--ray`` left an empty results folder
    behind: a refused run leaves none. Nothing listens on port 1."""
    from specbound.studies.records import ResultsStore

    held, lacking = tmp_path / "held", tmp_path / "lacking" / "acceptance" / "x"
    lacking.mkdir(parents=True)
    (lacking / "settings.json").write_text(json.dumps({"study": "acceptance", "dataset": "x"}))
    (tmp_path / "no-model").mkdir()
    refused = tmp_path / "refused" / "out"  # its parent is made for the run too, and must go with it
    calls = [[argument.format(prompts=prompts, held=held, free=tmp_path / "free", lacking=lacking.parents[1],
                              no_model=tmp_path / "no-model", refused=refused)
              for argument in arguments] for arguments, _ in STUDY_BEFORE_TORCH]
    with ResultsStore(held / "acceptance" / "prompts", {"study": "acceptance"}):  # another run's lock
        finished = subprocess.run([sys.executable, "-c", STUDY_CODE, json.dumps(calls)], capture_output=True,
                                  text=True, timeout=300, cwd=tmp_path)  # the default --out: below tmp_path
    assert finished.returncode == 0, finished.stderr
    report = json.loads(finished.stdout)
    for (arguments, option), (status, message) in zip(STUDY_BEFORE_TORCH, report["results"]):
        assert status == 2 and option in message, (arguments, status, message)
    assert report["loaded"] == []
    left = [path for path in (refused.parent, tmp_path / "free", tmp_path / DEFAULT_OUT) if path.exists()]
    assert left == []
