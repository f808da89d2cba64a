"""``specbound run`` end to end on tiny models saved as local Hugging Face directories."""

import json
import os
import subprocess
import sys

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from support.models import noisy_copy, tiny_model
from specbound.cli import main

WORDS = ["<eos>", "a", "b", "c", "d", "<|endoftext|>"]  # Qwen2Tokenizer adds the last if missing


def save_tiny(directory, model):
    tokenizer = Tokenizer(models.WordLevel({word: i for i, word in enumerate(WORDS)}, unk_token="a"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>", unk_token="a")
    model.generation_config.eos_token_id = 0
    model.save_pretrained(directory)
    fast.save_pretrained(directory)
    return str(directory)


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    target = tiny_model(seed=0)
    prompts = root / "prompts.txt"
    prompts.write_text("a b c\nd c a b\n")
    return (save_tiny(root / "target", target), save_tiny(root / "draft", noisy_copy(target, 1, 0.7)),
            str(prompts))


def run_command(tiny_dirs, output_dir, *extra):
    target, draft, prompts = tiny_dirs
    return main(["run", "--target", target, "--draft", draft, "--prompts", prompts,
                 "--dtype", "float32", "--max-new-tokens", "6", "--output-dir", str(output_dir),
                 *extra])


def test_run_writes_results_plot_and_table(tiny_dirs, tmp_path, capsys):
    assert run_command(tiny_dirs, tmp_path, "--methods", "autoregressive,chain,tree,batch",
                       "--depth", "2") == 0
    printed = capsys.readouterr().out
    for label in ["autoregressive", "chain γ=3", "tree 2×2 rrs_without_replacement", "batch M=2 γ=3"]:
        assert label in printed
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert len(records) == 2 * 4
    assert {record["method"] for record in records} >= {"autoregressive"}
    assert all(1 <= record["tokens_generated"] <= 6 for record in records)
    assert (tmp_path / "run.png").stat().st_size > 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["methods"][0]["speedup"] == pytest.approx(1.0)
    assert "optimum α*" in printed and summary["methods"][0]["optimum"]["positions"] == 0  # autoregressive verifies none
    for method in summary["methods"][1:]:  # every request's first verified position at least (engine.optimum)
        optimum = method["optimum"]
        assert optimum["positions"] > 0 and optimum["computed"] > 0
        assert optimum["optimal_acceptance"] >= optimum["expected_acceptance"] and optimum["acceptance_gap"] >= 0


def test_same_seed_same_tokens_from_the_command(tiny_dirs, tmp_path):
    outputs = []
    for name in ("first", "second"):
        assert run_command(tiny_dirs, tmp_path / name, "--methods", "chain", "--seed", "3") == 0
        outputs.append([json.loads(line)["tokens"]
                        for line in (tmp_path / name / "results.jsonl").read_text().splitlines()])
    assert outputs[0] == outputs[1]


def test_prompt_lookup_drafter_needs_no_draft_model(tiny_dirs, tmp_path):
    target, _, prompts = tiny_dirs  # no --draft: prompt lookup refuses one (test_cli_errors)
    assert main(["run", "--target", target, "--prompts", prompts, "--dtype", "float32", "--max-new-tokens", "6",
                 "--output-dir", str(tmp_path), "--drafter", "prompt-lookup", "--methods", "chain"]) == 0


def test_bad_options_are_reported(tiny_dirs, tmp_path, capsys):
    assert run_command(tiny_dirs, tmp_path, "--methods", "beam") == 2
    assert "method" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        (["--methods", "chain", "--gamma", "1000000000"], "chain (gamma = 1,000,000,000)"),
        (["--methods", "tree", "-n", "2", "--depth", "30"], "tree (num_drafts = 2, depth = 30)"),
        (["--methods", "batch", "-n", "100000", "--gamma", "3"], "batch (num_drafts = 100,000, gamma = 3)"),
        (["--methods", ","], "methods"),
    ],
)
def test_drafts_no_target_call_could_verify_are_refused_before_a_model_loads(arguments, named, tmp_path,
                                                                            monkeypatch, capsys):
    """γ = 10⁹ used to build a 10⁹-long tuple of verifiers (and a 2³⁰-node tree hangs in
    decoding); nothing may load a model before the options are known to be good."""
    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("specbound.models.loading.load_model", no_model)
    assert main(["run", "--output-dir", str(tmp_path), *arguments]) == 2
    assert named in capsys.readouterr().err


def test_auto_prints_its_plan_with_predicted_and_measured_speed(tiny_dirs, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SPECBOUND_CACHE", str(tmp_path / "cache"))  # the cost book of the tiny models
    assert run_command(tiny_dirs, tmp_path / "out", "--methods", "autoregressive,auto",
                       "--draft-precisions", "bf16") == 0
    printed = capsys.readouterr().out
    assert "auto: plans " in printed and "tokens/s in decoding, measured" in printed
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    auto = next(row for row in summary["methods"] if row["method"] == "auto")
    assert auto["predicted_tokens_per_second"] > 0 and auto["plan"]
    # measured like the prediction, prefill left out (so faster than with it), and printed so
    assert auto["decoding_tokens_per_second"] > auto["tokens_per_second"] > 0
    assert f"measured {auto['decoding_tokens_per_second']:.2f} in decoding" in printed
    assert (tmp_path / "cache" / "costs.json").exists()


def test_generate_streams_the_text_and_reports_on_stderr(tiny_dirs, tmp_path, capsys, monkeypatch):
    """The streamed text is the decoded tokens (this tokenizer, loaded as Qwen2's, decodes
    its words without spaces: letters of a-d only, special tokens skipped), and the method's
    own tokens: the same seed gives the same text."""
    monkeypatch.setenv("SPECBOUND_CACHE", str(tmp_path / "cache"))
    target, draft, _ = tiny_dirs
    texts = []
    for method in ("chain:gamma=2", "chain:gamma=2", "auto"):
        assert main(["generate", "a b c", "--raw", "--target", target, "--draft", draft, "--dtype", "float32",
                     "--max-new-tokens", "5", "--method", method, "--quiet", "--draft-precisions", "bf16"]) == 0
        captured = capsys.readouterr()
        texts.append(captured.out)
        assert "tokens in" in captured.err and "tokens per target call" in captured.err
        assert set(captured.out.strip()) <= set("abcd")
    assert texts[0] == texts[1] and texts[0].strip()


@pytest.mark.parametrize(("method", "named"), [("chain:gamma=0", "gamma"), ("chain:depth=2", "depth"),
                                               ("beam", "method"), ("chain:gamma", "method"),
                                               ("tree:num_drafts=2:depth=40", "tree (num_drafts = 2, depth = 40)")])
def test_generate_refuses_bad_methods_before_a_model_loads(method, named, monkeypatch, capsys):
    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("specbound.models.loading.load_model", no_model)
    assert main(["generate", "x", "--method", method]) == 2
    assert named in capsys.readouterr().err


def test_run_names_methods_as_generate_does_with_the_flags_as_defaults(tiny_dirs, tmp_path, capsys):
    """``--methods`` takes ``NAME:KEY=VALUE`` as ``generate --method`` does, so a sparse tree's
    budget and width can be set; ``--gamma`` still sets a chain given without options."""
    assert run_command(tiny_dirs, tmp_path, "--methods", "chain,chain:gamma=2,sparse:budget=6:width=2:depth=3",
                       "--gamma", "4") == 0
    printed = capsys.readouterr().out
    assert "chain γ=4" in printed and "chain γ=2" in printed and "sparse 6/3 rrs_without_replacement" in printed


@pytest.mark.parametrize("methods", ["chain,chain:gamma=3", "chain:gamma=2, chain:gamma=2", "auto,auto",
                                     "tree,tree:num_drafts=2"])
def test_run_refuses_a_method_given_twice_before_a_model_loads(methods, tmp_path, no_model_loads, capsys):
    assert main(["run", "--output-dir", str(tmp_path), "--methods", methods]) == 2
    message = capsys.readouterr().err.strip()
    assert message.count("\n") == 0 and message.startswith("specbound run: error: methods:") and "twice" in message


def test_run_refuses_a_prompt_and_new_tokens_beyond_the_context_naming_the_option(tiny_dirs, tmp_path, capsys):
    """The tiny models hold 64 positions; the prompts are 3 and 4 tokens."""
    assert run_command(tiny_dirs, tmp_path, "--methods", "chain", "--max-new-tokens", "61") == 2
    message = capsys.readouterr().err
    assert "max_new_tokens: 61 new tokens after the prompt" in message
    assert "'s 4 exceed the models' context of 64 positions; ask for at most 60 (--max-new-tokens)" in message
    assert not (tmp_path / "results.jsonl").exists()


SPECULATIVE = "chain,tree,batch,sparse"  # a chain, a tree, batch's RRS, a budgeted tree


@pytest.mark.slow  # compiles every verifier's loops afresh: about a minute on 2 cores
def test_a_fresh_run_fills_the_theory_columns_for_every_speculative_method(tiny_dirs, tmp_path):
    """A new process with an empty cache (nothing compiled yet) computes the exact
    acceptance and α* for every speculative method, on every prompt."""
    target, draft, prompts = tiny_dirs
    command = ["run", "--target", target, "--draft", draft, "--prompts", prompts, "--dtype", "float32",
               "--max-new-tokens", "8", "--output-dir", str(tmp_path / "out"), "--methods", SPECULATIVE]
    environment = {**os.environ, "SPECBOUND_CACHE": str(tmp_path / "cache")}
    program = f"import sys; from specbound.cli import main; sys.exit(main({command!r}))"
    finished = subprocess.run([sys.executable, "-c", program], env=environment, capture_output=True, text=True,
                              timeout=600)
    assert finished.returncode == 0, finished.stderr
    records = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert len(records) == 2 * len(SPECULATIVE.split(","))
    for record in records:
        assert record["optimum"]["positions"] > 0 and record["optimum"]["computed"] > 0, record["method"]
        assert record["optimum"]["acceptance_gap"] >= 0
