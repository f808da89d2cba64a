"""``specbound generate``'s prompt: from the argument or standard input, refused before any
model loads when it is empty, not UTF-8, or asks for more tokens than any model has."""

import io

import numpy as np
import pytest

from specbound.cli import main


def feed_stdin(monkeypatch, data: bytes) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


def last_line(capsys) -> str:
    message = capsys.readouterr().err.strip()
    assert "Traceback" not in message and message.count("\n") == 0, message
    return message


@pytest.mark.usefixtures("no_model_loads")
@pytest.mark.parametrize("data", [np.random.default_rng(0).bytes(5000), b"hi \xff there", b"\xc3"],
                         ids=["random bytes", "one bad byte", "a character cut short"])
@pytest.mark.parametrize("prompt", [[], ["-"]], ids=["no prompt", "-"])
def test_standard_input_that_is_not_utf8_is_refused_before_a_model_loads(data, prompt, monkeypatch, capsys):
    """``head -c 5000 /dev/urandom | specbound generate`` used to load both models, then fail
    with the tokenizer's TypeError."""
    feed_stdin(monkeypatch, data)
    assert main(["generate", *prompt, "--quiet"]) == 2
    message = last_line(capsys)
    assert message.startswith("specbound generate: error: prompt: standard input is not UTF-8 text")


@pytest.mark.usefixtures("no_model_loads")
@pytest.mark.parametrize("data", [b"", b" \n\t\n"])
def test_empty_standard_input_is_refused_before_a_model_loads(data, monkeypatch, capsys):
    feed_stdin(monkeypatch, data)
    assert main(["generate", "--quiet"]) == 2
    assert "prompt: empty" in last_line(capsys)


@pytest.mark.usefixtures("no_model_loads")
def test_a_prompt_argument_with_undecodable_bytes_is_refused_before_a_model_loads(capsys):
    """Python turns an argument's bytes that are not UTF-8 into lone surrogates ('\\udcff')."""
    assert main(["generate", "hi \udcff", "--quiet"]) == 2
    assert "prompt: not valid Unicode text" in last_line(capsys)


@pytest.mark.usefixtures("no_model_loads")
@pytest.mark.parametrize("command", ["generate", "run"])
def test_more_new_tokens_than_any_model_has_positions_are_refused_before_a_model_loads(command, tmp_path, capsys):
    """``--max-new-tokens 10¹²`` used to be refused after 24 s of loading, naming prompt_ids;
    now while parsing, as ``study`` does."""
    where = ["hi", "--quiet"] if command == "generate" else ["--output-dir", str(tmp_path)]
    with pytest.raises(SystemExit) as exit_info:
        main([command, *where, "--max-new-tokens", "1000000000000"])
    assert exit_info.value.code == 2
    assert "argument --max-new-tokens" in capsys.readouterr().err


@pytest.mark.parametrize(("command", "method"), [("generate", "tree:verifier=optimal:num_drafts=8"),
                                                 ("run", "tree:verifier=optimal:num_drafts=8:depth=1")])
def test_a_verifier_whose_linear_program_cannot_fit_is_refused_before_a_model_loads(command, method, tmp_path,
                                                                                     no_model_loads, capsys):
    """``tree:verifier=optimal:num_drafts=8`` used to be refused after both models loaded, with
    "enumerating 151936^8 draft tuples exceeds 6"; now before, saying what limit and why."""
    where = ["hi", "--quiet", "--method"] if command == "generate" else ["--output-dir", str(tmp_path), "--methods"]
    assert main([command, *where, method]) == 2
    message = last_line(capsys)
    assert "optimal verifier" in message and "linear program" in message and "1,000,000" in message
    assert "any vocabulary over 4 tokens" in message and "--top-k 4 or less" in message
    with pytest.raises(no_model_loads):  # a small enough --top-k: accepted, and the models would load
        main([command, *where, method, "--top-k", "4"])


def test_a_study_refuses_more_new_tokens_than_any_model_has_positions_while_parsing(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["study", "acceptance", "--max-new-tokens", "1000000000000"])
    assert exit_info.value.code == 2
    assert "argument --max-new-tokens" in capsys.readouterr().err
