"""``specbound audit``: our engine in-process and through an OpenAI-compatible endpoint on a
tiny pair saved as Hugging Face folders; the three verdicts and their statuses; bad endpoints
and engines end in one line, status 2, no file left half-written, and what can be refused
before a model loads is refused then."""

import json
import subprocess
import sys
import threading
import time

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from support.audit import Endpoint
from support.models import noisy_copy, tiny_model
from specbound.cli import main
from specbound.engine import CausalLM, Decoder, Processing, build_method
from specbound.engine.drafters import ModelDrafter

WORDS = ["<eos>", "a", "b", "c", "d", "<|endoftext|>"]  # the tiny models' 6 tokens; Qwen2Tokenizer adds the last


@pytest.fixture(scope="module")
def pair_folders(tmp_path_factory):
    """A tiny target and draft as Hugging Face folders with a word-level tokenizer (as
    ``tests/cli/test_run_command.py`` saves them; no chat template: prompts are plain text)."""
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=_word_tokenizer(), eos_token="<eos>", unk_token="a")
    target = tiny_model(seed=0)
    draft = noisy_copy(target, seed=1, noise=0.5)
    folders = []
    for name, model in (("target", target), ("draft", draft)):
        folder = tmp_path_factory.mktemp(name)
        model.generation_config.eos_token_id = 0
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        folders.append(folder)
    prompts = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    prompts.write_text("a b c\nd c a b\nb b\n")
    return {"target": str(folders[0]), "draft": str(folders[1]), "prompts": str(prompts), "model": target}


def _word_tokenizer() -> Tokenizer:
    backend = Tokenizer(models.WordLevel({word: index for index, word in enumerate(WORDS)}, unk_token="a"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return backend


def command(pair_folders, engine, output, *extra):
    return ["audit", engine, "--target", pair_folders["target"], "--draft", pair_folders["draft"], "--backend",
            "torch", "--dtype", "float32", "--prompts", pair_folders["prompts"], "--samples", "24",
            "--max-new-tokens", "4", "--temperature", "0.8", "--output", str(output), "--quiet", *extra]


def setting(argv: list[str], **values) -> list[str]:
    """``argv`` with the values of some of its options replaced (``max_new_tokens="1"``)."""
    argv = list(argv)
    for name, value in values.items():
        argv[argv.index("--" + name.replace("_", "-")) + 1] = value
    return argv


def strict_json(text: str):
    """``text`` parsed as strict JSON: NaN, Infinity and -Infinity refused."""
    def refuse(constant):
        raise ValueError(f"{constant} is not strict JSON")
    return json.loads(text, parse_constant=refuse)


def test_our_engine_in_process_passes_and_saves_its_record(pair_folders, tmp_path, capsys):
    status = main(setting(command(pair_folders, "specbound:chain:gamma=3", tmp_path), samples="128"))
    out, err = capsys.readouterr()
    assert status == 0, err
    assert out.startswith("PASSED: specbound:chain:gamma=3")
    assert "detects a per-position TV of 0." in out and "position" in out
    summary = strict_json((tmp_path / "audit.json").read_text())
    assert summary["verdict"] == "passed" and summary["samples"] == 128 and len(summary["worst_positions"]) == 4
    lines = (tmp_path / "samples.jsonl").read_text().splitlines()
    assert len(lines) == 128 and set(json.loads(lines[0])) == {"index", "prompt", "seed", "tokens"}
    assert (tmp_path / "audit.png").stat().st_size > 0
    assert not list(tmp_path.glob("*.partial"))


def test_transformers_assisted_generation_passes(pair_folders, tmp_path, capsys):
    assert main(setting(command(pair_folders, "transformers:assisted", tmp_path, "--top-k", "3"), samples="128")) == 0
    assert capsys.readouterr().out.startswith("PASSED: transformers:assisted")


@pytest.fixture
def endpoint():
    opened = []

    def open_endpoint(reply):
        opened.append(Endpoint(reply))
        return opened[-1].url

    yield open_endpoint
    for server in opened:
        server.close()


def test_an_endpoint_returning_our_engines_token_ids_passes(pair_folders, endpoint, tmp_path):
    target = pair_folders["model"]
    processing = Processing(0.8)
    decoder = Decoder(CausalLM(target), ModelDrafter(CausalLM(noisy_copy(target, seed=1, noise=0.5)), processing),
                      processing, (0,))
    method = build_method("chain", gamma=3)
    lock = threading.Lock()

    def reply(body):
        with lock:
            tokens = decoder.generate(body["prompt"], method, body["max_tokens"],
                                      torch.Generator().manual_seed(body["seed"])).tokens
        finish = "stop" if tokens[-1] == 0 else "length"
        return {"choices": [{"text": "", "finish_reason": finish}],
                "specbound": {"token_ids": tokens[:-1] if finish == "stop" else tokens}}  # EOS left out, as servers do

    assert main(setting(command(pair_folders, endpoint(reply), tmp_path), samples="128")) == 0


def test_an_endpoint_that_returns_no_tokens_is_inconclusive_not_passed(pair_folders, endpoint, tmp_path, capsys):
    url = endpoint(lambda body: {"choices": [{"finish_reason": "length"}], "specbound": {"token_ids": []}})
    assert main(command(pair_folders, url, tmp_path)) == 4
    out = capsys.readouterr().out
    assert out.startswith("INCONCLUSIVE: ") and "PASSED" not in out and "inf" not in out
    assert "no sample count would do" in out
    summary = strict_json((tmp_path / "audit.json").read_text())
    assert summary["verdict"] == "inconclusive" and summary["positions_scored"] == 0


def test_an_audit_too_small_to_detect_anything_is_inconclusive_and_says_what_would_do(pair_folders, tmp_path,
                                                                                       capsys):
    assert main(setting(command(pair_folders, "specbound:chain:gamma=3", tmp_path), samples="2",
                        max_new_tokens="1")) == 4
    out = capsys.readouterr().out
    assert out.startswith("INCONCLUSIVE: specbound:chain:gamma=3") and "detects a per-position TV of inf" not in out
    needed = strict_json((tmp_path / "audit.json").read_text())["needed_samples"]
    assert needed > 2 and f"about {needed:,} samples (--samples)" in out


def test_a_failing_engine_ends_with_status_3(pair_folders, endpoint, tmp_path, capsys):
    """An endpoint that always answers the token "a": the reference's law is far from a point mass."""
    url = endpoint(lambda body: {"choices": [{"finish_reason": "length"}],
                                 "specbound": {"token_ids": [1] * body["max_tokens"]}})
    assert main(command(pair_folders, url, tmp_path)) == 3
    assert capsys.readouterr().out.startswith("FAILED: ")
    assert strict_json((tmp_path / "audit.json").read_text())["verdict"] == "failed"


def test_long_audits_show_samples_done_elapsed_and_left(pair_folders, tmp_path, capsys):
    argv = [value for value in command(pair_folders, "specbound:chain:gamma=3", tmp_path) if value != "--quiet"]
    main(argv)
    progress = capsys.readouterr().err.split("\r")[-1]
    assert "audit: 100%" in progress and "24/24 [" in progress and "<00:00" in progress


def test_the_model_asked_of_an_endpoint_is_the_target_as_serve_names_it(pair_folders, endpoint, tmp_path):
    """``serve`` names its model by its ``--target`` unless told another name: a default audit
    of a default server asks for the model it serves."""
    asked = []

    def reply(body):
        asked.append(body["model"])
        return {"choices": [{"finish_reason": "length"}], "specbound": {"token_ids": [1]}}

    main(command(pair_folders, endpoint(reply), tmp_path))
    assert set(asked) == {pair_folders["target"]}


def test_an_endpoint_that_serves_another_model_is_refused_before_the_target_loads(pair_folders, tmp_path, capsys,
                                                                                  monkeypatch):
    served = Endpoint(lambda body: {}, models=["default-target"])
    monkeypatch.setattr("specbound.models.pair.load_pair", _no_loading)
    try:
        assert main(command(pair_folders, served.url, tmp_path, "--model", "specbound")) == 2
    finally:
        served.close()
    error = capsys.readouterr().err
    assert f"model: {served.url} serves 'default-target', not 'specbound'" in error


def _no_loading(*args, **kwargs):
    raise AssertionError("a model was loaded before the refusal")


def test_a_hanging_endpoint_is_given_up_after_the_request_timeout(pair_folders, endpoint, tmp_path, capsys):
    url = endpoint(lambda body: time.sleep(3) or {"choices": [{"finish_reason": "length"}],
                                                  "specbound": {"token_ids": [1]}})
    started = time.perf_counter()
    assert main(command(pair_folders, url, tmp_path, "--request-timeout", "0.5")) == 2
    assert time.perf_counter() - started < 30
    assert "did not answer within 0.5 s" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("reply, message", [
    (lambda body: {"choices": [{"text": "red", "finish_reason": "length"}]}, "returned no token ids"),
    (lambda body: {"choices": [{"finish_reason": "length"}], "specbound": {"token_ids": [500]}},
     "token id 500, outside the reference's vocabulary"),
])
def test_a_bad_endpoint_ends_in_one_line_and_leaves_no_file(pair_folders, endpoint, tmp_path, capsys, reply,
                                                            message):
    assert main(command(pair_folders, endpoint(reply), tmp_path)) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and message in error[0] and error[0].startswith("specbound audit: error: sampler:")
    assert list(tmp_path.iterdir()) == []


def test_an_unreachable_endpoint_ends_in_one_line(pair_folders, tmp_path, capsys):
    assert main(command(pair_folders, "http://127.0.0.1:9", tmp_path)) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "engine: cannot reach http://127.0.0.1:9/v1/models" in error[0]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("engine, message", [
    ("vllm", "engine: expected specbound:METHOD"),
    ("specbound:auto", "engine: audit a fixed method"),
    ("specbound:chain:gama=3", "engine: 'chain' takes no option 'gama'"),
])
def test_a_bad_engine_is_refused_before_any_model_loads(tmp_path, capsys, engine, message):
    assert main(["audit", engine, "--output", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("option, message", [
    ("--level=1", "argument --level: expected a number in (0, 1), got '1'"),
    ("--level=0", "argument --level: expected a number in (0, 1), got '0'"),
    ("--level=nan", "argument --level: expected a number in (0, 1), got 'nan'"),
    ("--tolerance=1", "argument --tolerance: expected a number in [0, 1), got '1'"),
    ("--tolerance=-0.1", "argument --tolerance: expected a number in [0, 1), got '-0.1'"),
    ("--row-tolerance=1", "argument --row-tolerance: expected a number in [0, 1), got '1'"),
    ("--request-timeout=0", "argument --request-timeout: expected a number in (0, 86400], got '0'"),
    ("--request-timeout=1e20", "argument --request-timeout: expected a number in (0, 86400], got '1e20'"),
    ("--samples=0", "argument --samples: expected an integer in [1, 1000000]")])
def test_a_bad_setting_is_refused_before_any_model_loads(tmp_path, capsys, option, message):
    try:
        status = main(["audit", "specbound:chain", option, "--output", str(tmp_path / "out")])
    except SystemExit as exit_info:  # argparse's own refusals
        status = exit_info.code
    assert status == 2 and message in capsys.readouterr().err


REFUSALS = [  # (arguments after `audit`, what the one line says): each refused before any model loads
    (["transformers:assisted", "--draft", ""], "draft: expected an embedded model"),
    (["specbound:chain", "--target", "nope.gguf"], "target: expected an embedded model"),
    (["llama-cpp-python:draft-model", "--draft", "folder-not-gguf"], "draft: expected an embedded model"),
    (["specbound:chain", "--target", "t" * 5000 + ".gguf"], "target: expected an embedded model"),
    (["http://", "--target", "nope.gguf"], "engine: 'http://' names no host"),
    (["http://127.0.0.1:9"], "engine: cannot reach http://127.0.0.1:9/v1/models"),
    (["llama-cpp-python:prompt-lookup", "--top-p", "0.9"], "top_p: llama-cpp-python's sampler chain"),
]
REFUSING = """
import contextlib, io, json, sys
from specbound.cli import main
lines = []
for arguments in json.loads(sys.argv[1]):
    with contextlib.redirect_stderr(io.StringIO()) as errors:
        status = main(["audit", *arguments, "--output", sys.argv[2], "--quiet"])
    lines.append([status, errors.getvalue()])
print(json.dumps([lines, [name for name in ("torch", "transformers", "llama_cpp") if name in sys.modules]]))
"""


def test_what_can_be_refused_before_a_model_loads_is_refused_then_naming_the_option(tmp_path):
    """In a fresh interpreter: the refusals import neither torch nor transformers nor llama.cpp,
    so no model has loaded and no shard was written."""
    finished = subprocess.run([sys.executable, "-c", REFUSING, json.dumps([arguments for arguments, _ in REFUSALS]),
                               str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr
    lines, heavy = json.loads(finished.stdout)
    for (arguments, message), (status, error) in zip(REFUSALS, lines):
        assert status == 2 and error.startswith(f"specbound audit: error: {message}"), (arguments, error)
    assert heavy == []
