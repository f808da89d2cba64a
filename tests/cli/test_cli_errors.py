"""How a command ends when something goes wrong: a user's error in one line with status 2,
an interruption in one line with status 130, a bug as an "internal error" with status 1 and
the hint to rerun with ``--debug``, which shows the full traceback."""

import argparse
import re

import pytest

from specbound.cli import build_parser, main


def failing_command(monkeypatch, error):
    """``accept``'s work replaced by one that raises ``error``."""
    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr("specbound.tables.bounds.acceptance_table", fail)
    return ["accept", "--target", "0.5,0.5", "--draft", "0.5,0.5"]


def test_ctrl_c_while_models_load_ends_with_one_line_and_status_130(monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("specbound.models.loading.load_model", interrupted)
    monkeypatch.setattr("specbound.models.loading.gguf_file", interrupted)
    assert main(["generate", "hi", "--quiet"]) == 130
    message = capsys.readouterr().err.strip()
    assert message == "specbound generate: interrupted"


@pytest.mark.parametrize("arguments, command", [(["accept"], "accept"), (["--debug", "study", "acceptance"], "study")])
def test_ctrl_c_while_the_commands_import_ends_with_one_line_and_status_130(monkeypatch, capsys, arguments, command):
    """``run``, ``theory`` and ``study`` read their options from registries that import torch
    (seconds) while the arguments are parsed, before any command runs: the line names the
    command, as an interruption while it runs does (one message, early or late)."""
    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr("specbound.cli.build_parser", interrupted)
    assert main(arguments) == 130
    assert capsys.readouterr().err.strip() == f"specbound {command}: interrupted"


def test_a_bug_says_internal_error_with_the_hint_to_rerun_with_debug(monkeypatch, capsys):
    assert main(failing_command(monkeypatch, TypeError("unsupported operand"))) == 1
    message = capsys.readouterr().err.strip()
    assert message.count("\n") == 0 and "Traceback" not in message
    assert "internal error" in message and "TypeError: unsupported operand" in message and "--debug" in message


def test_a_value_error_from_a_library_is_an_internal_error_not_a_user_error(monkeypatch, capsys):
    """A ValueError raised outside specbound's own checks (here numpy's) is a bug, not bad input."""
    import numpy as np

    def broadcast(*args, **kwargs):
        return np.zeros(2) + np.zeros(3)

    monkeypatch.setattr("specbound.tables.bounds.acceptance_table", broadcast)
    assert main(["accept", "--target", "0.5,0.5", "--draft", "0.5,0.5"]) == 1
    assert "internal error" in capsys.readouterr().err


def test_debug_shows_the_traceback_of_a_user_error(capsys):
    arguments = ["accept", "--target", "0.5,0.6", "--draft", "0.5,0.5"]
    assert main(arguments) == 2
    assert "Traceback" not in capsys.readouterr().err
    for debug in (["--debug", *arguments], [*arguments, "--debug"]):
        assert main(debug) == 2
        shown = capsys.readouterr().err
        assert "Traceback" in shown and "target_probs: rows must sum to 1" in shown


def test_debug_shows_the_traceback_of_an_internal_error(monkeypatch, capsys):
    assert main([*failing_command(monkeypatch, TypeError("unsupported operand")), "--debug"]) == 1
    shown = capsys.readouterr().err
    assert "Traceback" in shown and "TypeError: unsupported operand" in shown


def every_parser(parser, path=("specbound",)):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, subparser in action.choices.items():
                yield from every_parser(subparser, (*path, name))


@pytest.mark.parametrize(("path", "parser"), [pytest.param(path, parser, id=" ".join(path))
                                              for path, parser in every_parser(build_parser())])
def test_help_is_plain_text_without_restructuredtext_markup(path, parser):
    shown = parser.format_help()
    assert "``" not in shown and not re.search(r":\w+:`", shown), shown


def test_run_help_names_the_default_methods():
    run = dict(every_parser(build_parser()))[("specbound", "run")].format_help()
    assert "autoregressive, chain and tree" not in run
    assert "autoregressive, chain and auto" in " ".join(run.split())


@pytest.mark.parametrize("command", [
    ["generate", "hi", "--quiet", "--method", "chain:gamma=2:gamma=3"],
    ["run", "--methods", "autoregressive,chain:gamma=2:gamma=3"],
])
def test_a_method_option_given_twice_is_refused_naming_it(command, no_model_loads, capsys):
    """The last value won silently."""
    assert main(command) == 2
    message = capsys.readouterr().err.strip()
    assert message.count("\n") == 0 and "'gamma' twice" in message and "chain:gamma=2:gamma=3" in message


@pytest.mark.parametrize("drafter", ["prompt-lookup", "suffix"])
@pytest.mark.parametrize("command", ["generate", "run"])
@pytest.mark.parametrize("ignored", [["--draft", "other.gguf"], ["--draft-precisions", "int8"]])
def test_a_draft_model_option_with_a_drafter_of_the_text_is_refused(drafter, command, ignored, no_model_loads, capsys):
    """Prompt lookup and suffix decoding draft from the text: --draft was silently not loaded."""
    text = ["hi", "--quiet"] if command == "generate" else []
    assert main([command, *text, "--drafter", drafter, *ignored]) == 2
    message = capsys.readouterr().err.strip()
    assert message.count("\n") == 0 and ignored[0] in message and f"--drafter {drafter}" in message


def test_an_unbounded_range_is_stated_as_such(no_model_loads, capsys):
    """"a number in [0, inf]" for a check that refuses inf."""
    assert main(["generate", "hi", "--quiet", "--method", "decoding_opt:epsilon=-1"]) == 2
    message = capsys.readouterr().err.strip()
    assert "epsilon: expected a finite number ≥ 0, got -1" in message and "inf" not in message


@pytest.mark.parametrize("methods, flag", [
    ("autoregressive", ["--gamma", "5"]), ("chain:gamma=4", ["--gamma", "5"]), ("chain,auto", ["-n", "3"]),
    ("batch", ["--verifier", "greedy"]), ("tree", ["--epsilon", "0.2"]),
])
def test_a_method_flag_that_no_chosen_method_uses_is_refused(methods, flag, no_model_loads, capsys):
    """``run``'s flags fill the options an entry of --methods leaves out; one that fills none was ignored."""
    assert main(["run", "--methods", methods, *flag]) == 2
    message = capsys.readouterr().err.strip()
    assert message.count("\n") == 0 and flag[0] in message and "none of --methods" in message


def test_a_method_flag_that_a_chosen_method_uses_is_taken(no_model_loads, capsys):
    with pytest.raises(no_model_loads):
        main(["run", "--methods", "chain:gamma=4,tree", "--depth", "3", "-n", "2", "--debug"])


def test_serve_without_the_serve_extra_names_it_and_exits_2(monkeypatch, capsys):
    """The README's first command installs no HTTP server: ``serve`` then says which extra
    to install (exit 2), before it binds a port or loads a model, not 'internal error'."""
    import importlib.util

    from specbound.cli import serve

    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *rest: None if name == "fastapi" else found(name))
    monkeypatch.setattr(serve, "_serve", lambda *args: pytest.fail("serve went on without fastapi"))
    assert main(["serve", "--port", "0"]) == 2
    error = capsys.readouterr().err
    assert "serve needs fastapi" in error and "pip install 'specbound[serve]'" in error and "internal" not in error
