"""``specbound audit``: our engine in-process and through an OpenAI-compatible endpoint on a
tiny pair saved as Hugging Face folders; bad endpoints and engines end in one line, status 2,
no file left half-written."""

import json
import threading

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from audit_fixtures import Endpoint
from engine_fixtures import noisy_copy, tiny_model
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


def test_our_engine_in_process_passes_and_saves_its_record(pair_folders, tmp_path, capsys):
    status = main(command(pair_folders, "specbound:chain:gamma=3", tmp_path))
    out, err = capsys.readouterr()
    assert status == 0, err
    assert out.startswith("PASSED: specbound:chain:gamma=3")
    assert "detects a per-position TV of" in out and "position" in out
    summary = json.loads((tmp_path / "audit.json").read_text())
    assert summary["passed"] and summary["samples"] == 24 and len(summary["worst_positions"]) == 4
    lines = (tmp_path / "samples.jsonl").read_text().splitlines()
    assert len(lines) == 24 and set(json.loads(lines[0])) == {"index", "prompt", "seed", "tokens"}
    assert (tmp_path / "audit.png").stat().st_size > 0
    assert not list(tmp_path.glob("*.partial"))


def test_transformers_assisted_generation_passes(pair_folders, tmp_path, capsys):
    assert main(command(pair_folders, "transformers:assisted", tmp_path, "--top-k", "3")) == 0
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

    assert main(command(pair_folders, endpoint(reply), tmp_path)) == 0


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
    assert len(error) == 1 and "endpoint: cannot reach http://127.0.0.1:9/v1/completions" in error[0]
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


@pytest.mark.parametrize("option, message", [("--level=1", "level: expected a number below 1"),
                                             ("--row-tolerance=1", "row_tolerance: expected a number below 1"),
                                             ("--samples=0", "argument --samples: expected an integer in [1, 1000000]")])
def test_a_bad_setting_is_refused_before_any_model_loads(tmp_path, capsys, option, message):
    try:
        status = main(["audit", "specbound:chain", option, "--output", str(tmp_path / "out")])
    except SystemExit as exit_info:  # argparse's own refusals
        status = exit_info.code
    assert status == 2 and message in capsys.readouterr().err
