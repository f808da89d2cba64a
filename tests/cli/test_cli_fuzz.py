"""Every option of every subcommand, set to bad, empty, huge, negative and non-numeric
values: each call ends with exit status 2 and a one-line message naming the option, or —
for a value that is valid — finishes within its work limit; never a traceback, never a
value silently accepted that is bad.

The options are read from the parsers themselves (``specbound.cli.build_parser``), so a
new option is fuzzed as soon as it exists. Values are chosen per kind of option (its
argparse type): MUST_REFUSE values are wrong for every option of that kind; MAY_ACCEPT
values (huge numbers, 0, a large seed) are refused or run — within FUZZ_SECONDS. An option
whose converter the test does not know gets every value as MAY_ACCEPT: no traceback, no
status but 0 and 2, no time beyond the bound.

``run``, ``generate``, ``serve`` and ``study`` must check their values before any model
loads: the two ways a pair loads (``models.loading.load_model``, llama.cpp's
``models.loading.gguf_file``) are replaced by stubs that raise ``support.cli.ModelWouldLoad``
(``conftest.no_model_loads``), and reaching one counts as "accepted" (no model is ever loaded
here, and no server listens).
Their --target/--draft are checked before loading only for naming some model (an embedded name,
a .gguf file, a folder with a config.json: ``test_refused_before_work``); whether it loads is
found by loading, so they are not fuzzed.
Output folders get a folder no one can create (below /proc), which must be refused before any
work; ``generate``'s standard input gets bytes that are not UTF-8 and empty input
(``STDIN_MUST_REFUSE``) and odd but valid text (``STDIN_MAY_ACCEPT``).
Each call is also stopped by an alarm past FUZZ_SECONDS, so a hang fails the test instead
of stalling it. The bound is on a call's work, not on what a process pays once: each command
that computes in-process (``FIRST_CALLED``) is called once at its base settings before any call
is timed, so that numba's first compile of the exact loops (on a machine whose cache is empty,
as CI's: more than the bound on its own) and the first imports are not counted against the
first value fuzzed. Calls run in-process (``main``); a few subprocesses prove the same end to
end. KNOWN_OPEN lists the values of options owned elsewhere that still fail, each with a
strict xfail test that turns red once it is fixed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from support.cli import ModelWouldLoad
from specbound.cli import build_parser, main

FUZZ_SECONDS = 10.0  # an accepted call at the small base settings below, or any refusal
FIRST_CALL_SECONDS = 120.0  # a command's first call in this process, compiling its loops included
FIRST_CALLED = [("accept",), ("bounds", "optimum"), ("bounds", "plot"), ("theory", "convergence"),
                ("theory", "drafts"), ("theory", "improvement"), ("theory", "pareto")]  # no model loads
HUGE = ["1000000000", "1" + "0" * 20]
MUST_REFUSE = {
    "int": ["", " ", "x", "-1", "1.5", "1e3", "nan", "0x10"],
    "number": ["", "x", "nan", "inf", "-inf", "-1", "1e999"],
    "list": ["", ",", "x", "1,x", "-1", "nan"],
    "pairs": ["", "x", "1", "1:2:3", "-1:1", "nan:1", ";"],
    "names": ["", ",", "bogus"],
    "choice": ["", "bogus"],
    "lookahead": ["", "x", "0", "-1", "nan"],
    "folder": ["", "{file}", "{file}/child", "{unwritable}"],
    "distribution": ["", "x", "nan", "-1", "1e999", "0.5,0.6", "[0.5]", "{missing}.json", "{dict_json}",
                     "{ragged_json}", ",".join(["0.1"] * 5000)],  # the last: a name too long for a path
    "dataset": ["", "no-such-set"],
    "methods": ["", ",", "beam"],
    "verifier": ["", "bogus"],
    "results_dir": ["", "{missing}", "{file}", "{empty_dir}"],
    "unknown": [],
}
MAY_ACCEPT = {
    "int": ["0", *HUGE, "9223372036854775807"],
    "number": ["0", "1e300", *HUGE],
    "list": ["0", *HUGE],
    "pairs": ["0:0", "1000000000:1"],
    "lookahead": ["inf", *HUGE],
    "folder": ["{new_folder}"],
    "unknown": ["", "x", "-1", "0", "nan", "1e999", *HUGE],
}
TYPE_KINDS = {"integer": "int", "int": "int", "number": "number", "float": "number", "numbers": "list",
              "comma_list": "list", "pairs": "pairs", "names": "names", "lookahead": "lookahead",
              "folder": "folder"}
UNTYPED_KINDS = {  # options that take text, by (command, dest)
    ("accept", "target"): "distribution", ("accept", "draft"): "distribution",
    ("bounds", "target"): "distribution", ("bounds", "draft"): "distribution",
    ("run", "prompts"): "dataset", ("run", "methods"): "methods", ("run", "verifier"): "verifier",
    ("report", "results_dir"): "results_dir", ("generate", "method"): "methods", ("serve", "method"): "methods",
}
UNWRITABLE = "/proc/specbound-fuzz/out"  # a folder nobody can create, root included (Linux)
STDIN_MUST_REFUSE = {"empty": b"", "blank": b" \n\t\n", "a lone 0xff": b"hi \xff", "cut short": b"hi \xc3",
                     "an encoded surrogate": b"\xed\xa0\x80", "random bytes": bytes(range(256)) * 20}
STDIN_MAY_ACCEPT = {"NUL": b"\x00", "accents": "héllo wörld ✓".encode(), "long": b"word " * 20_000}
MODEL_SOURCES = {(command, source) for command in ("run", "generate", "study", "serve", "audit")
                 for source in ("target", "draft")}
KNOWN_OPEN: dict = {}  # (command, option): (values not run here, why, whose); none open today


class TookTooLong(Exception):
    """Raised by the alarm in a call that ran past FUZZ_SECONDS."""


def leaf_parsers(parser, path=()):
    """(command path, parser) of every subcommand that runs."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, subparser in action.choices.items():
                yield from leaf_parsers(subparser, (*path, name))
            return
    yield path, parser


def option_kind(path, action) -> str | None:
    """The kind of values an option takes; None for options that are not fuzzed."""
    if action.choices:
        return "choice"
    if action.type is None:
        if (path[0], action.dest) in MODEL_SOURCES:
            return None
        return UNTYPED_KINDS.get((path[0], action.dest), "unknown")
    return TYPE_KINDS.get(getattr(action.type, "__qualname__", "").split(".")[0], "unknown")


def fuzzed_options():
    for path, parser in leaf_parsers(build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction) or action.nargs == 0:
                continue  # --help and flags take no value
            kind = option_kind(path, action)
            if kind is not None:
                yield pytest.param(path, action, kind, id=f"{' '.join(path)} {action.dest}")


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    (root / "a-file").write_text("not a folder")
    (root / "empty").mkdir()
    (root / "dict.json").write_text(json.dumps({"target": {"a": 1}, "draft": [0.5, 0.5]}))
    (root / "ragged.json").write_text(json.dumps({"target": [[0.5, 0.5], [1.0]], "draft": [0.5, 0.5]}))
    (root / "prompts.txt").write_text("a b c\n")
    return {"root": root, "file": str(root / "a-file"), "missing": str(root / "missing"),
            "empty_dir": str(root / "empty"), "dict_json": str(root / "dict.json"),
            "ragged_json": str(root / "ragged.json"), "prompts": str(root / "prompts.txt"),
            "unwritable": UNWRITABLE if os.path.isdir("/proc/self") else str(root / "a-file" / "child")}


def base_arguments(path, places, positional_fuzzed: bool = False) -> list[str]:
    """Small settings for each command, so that an accepted value runs in well under a second
    (``generate`` gets a prompt unless its prompt is the value fuzzed)."""
    out = str(places["root"] / "out" / "-".join(path))
    pair = ["--target", "0.4,0.3,0.2,0.1", "--draft", "0.1,0.2,0.3,0.4"]
    chain = ["--horizon", "5", "--vocab", "3", "--runs", "20"]
    return {
        ("accept",): [*pair, "-n", "2", "--json"],
        ("bounds", "optimum"): [*pair, "--json"],
        ("bounds", "plot"): [*pair, "--max-drafts", "2", "--out", out, "--json"],
        ("theory", "convergence"): [*chain, "--lookaheads", "2", "--out", out, "--json"],
        ("theory", "drafts"): [*chain, "--max-drafts", "4", "--simulated-drafts", "1,2", "--out", out, "--json"],
        ("theory", "improvement"): ["--max-drafts", "3", "--out", out, "--json"],
        ("theory", "pareto"): ["--random-points", "5", "--epsilons", "0,0.1", "--out", out, "--json"],
        ("run",): ["--prompts", places["prompts"], "--max-new-tokens", "2", "--output-dir", out],
        ("report",): [],
        ("generate",): ["--max-new-tokens", "2", "--quiet", *([] if positional_fuzzed else ["a prompt"])],
        ("serve",): ["--max-new-tokens", "2", "--quiet"],  # an accepted value stops at loading: nothing listens
        ("audit",): [*([] if positional_fuzzed else ["specbound:chain"]), "--prompts", places["prompts"],
                     "--samples", "2", "--max-new-tokens", "2", "--output", out, "--quiet"],  # stops at loading
    }.get(path, ["--dataset", places["prompts"], "--max-new-tokens", "2", "--out", out, "--quiet"])


@pytest.fixture(scope="module")
def first_called(places):
    """Each command of FIRST_CALLED called once at its base settings, untimed but bounded:
    each must be accepted there, or the fuzz below would test nothing."""
    for path in FIRST_CALLED:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as error:
            outcome, _ = call([*path, *base_arguments(path, places)], bound=FIRST_CALL_SECONDS)
        assert outcome == "accepted", f"{' '.join(path)} at its base settings: {outcome}\n{error.getvalue()}"


def call(argv, bound: float = FUZZ_SECONDS) -> tuple[str, float]:
    """'refused', 'accepted' or what went wrong, and the seconds it took (stopped at bound + 5 s)."""
    def alarm(signum, frame):
        raise TookTooLong

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, bound + 5)
    started = time.perf_counter()
    try:
        status = main(argv)
    except SystemExit as exit_info:
        status = exit_info.code
    except ModelWouldLoad:
        status = 0
    except TookTooLong:
        status = "stopped by the alarm"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    seconds = time.perf_counter() - started
    return {0: "accepted", 2: "refused"}.get(status, f"exit status {status!r}"), seconds


def names_the_option(message: str, action) -> bool:
    """The option's flag or name appears in the message (a list option by its item's name,
    ``--epsilons`` as ``epsilon``), or the message is about a field its name starts with
    (``results: …`` for RESULTS_DIR)."""
    names = [*action.option_strings, action.dest, action.dest.replace("_", "-")]
    names += [name[:-1] for name in names if name.endswith("s")]
    field = message.split("error: ", 1)[-1].split(":", 1)[0]
    return any(name.lstrip("-") and name in message for name in names) or (
        field.isidentifier() and action.dest.startswith(field))


@pytest.mark.usefixtures("no_model_loads", "first_called")
@pytest.mark.parametrize(("path", "action", "kind"), list(fuzzed_options()))
def test_every_option_refuses_bad_values_and_bounds_its_work(path, action, kind, places, capsys):
    option = max(action.option_strings, key=len) if action.option_strings else None
    not_run = KNOWN_OPEN.get((" ".join(path), option), ((), ""))[0]
    problems = []
    for value_template in [value for value in MUST_REFUSE[kind] + MAY_ACCEPT.get(kind, []) if value not in not_run]:
        value = value_template.format(**places, new_folder=str(places["root"] / "new" / "-".join(path)))
        argv = [*path, *base_arguments(path, places, option is None), f"{option}={value}" if option else value]
        outcome, seconds = call(argv)
        captured = capsys.readouterr()
        shown = f"{' '.join(path)} {option or action.dest}={value!r}"
        if "Traceback" in captured.err:
            problems.append(f"{shown}: a traceback")
        if seconds > FUZZ_SECONDS:
            problems.append(f"{shown}: took {seconds:.1f} s (bound {FUZZ_SECONDS:g} s)")
        if outcome == "refused":
            lines = [line for line in captured.err.splitlines() if line.strip() and "it/s]" not in line]
            last = lines[-1] if lines else ""
            if not (last.startswith("specbound") and "error:" in last and names_the_option(last, action)):
                problems.append(f"{shown}: the message does not name the option: {last!r}")
        elif outcome == "accepted":
            if value_template in MUST_REFUSE[kind]:
                problems.append(f"{shown}: accepted a bad value")
        else:
            problems.append(f"{shown}: {outcome}")
    assert not problems, "\n".join(problems)


@pytest.mark.usefixtures("no_model_loads")
@pytest.mark.parametrize("prompt", [[], ["-"]], ids=["no prompt", "-"])
def test_standard_input_is_refused_when_not_utf8_text_and_read_otherwise(prompt, monkeypatch, capsys):
    """``generate`` reads its prompt from standard input: bad bytes and empty input are
    refused naming the prompt, before any model loads; any UTF-8 text is accepted."""

    problems = []
    for label, data in {**STDIN_MUST_REFUSE, **STDIN_MAY_ACCEPT}.items():
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
        outcome, seconds = call(["generate", *prompt, "--max-new-tokens", "2", "--quiet"])
        error = capsys.readouterr().err
        last = error.strip().splitlines()[-1] if error.strip() else ""
        if "Traceback" in error or seconds > FUZZ_SECONDS:
            problems.append(f"{label}: a traceback or {seconds:.1f} s")
        if outcome == "refused" and not last.startswith("specbound generate: error: prompt:"):
            problems.append(f"{label}: the message does not name the prompt: {last!r}")
        expected = "refused" if label in STDIN_MUST_REFUSE else "accepted"
        if outcome != expected:
            problems.append(f"{label}: {outcome}, expected {expected}")
    assert not problems, "\n".join(problems)


def test_the_fuzz_covers_every_subcommand():
    commands = {" ".join(path) for path, _ in leaf_parsers(build_parser())}
    assert commands >= {"accept", "bounds optimum", "bounds plot", "theory convergence", "theory drafts",
                        "theory improvement", "theory pareto", "study acceptance", "study rejections",
                        "study bias", "report", "run"}
    fuzzed = {" ".join(param.values[0]) for param in fuzzed_options()}
    assert fuzzed == commands


# -- end to end, in a fresh interpreter --------------------------------------------------
def specbound(*arguments, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    code = "import sys; from specbound.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *arguments], stdout=stdout, stderr=subprocess.PIPE,
                          text=True, timeout=120)


@pytest.mark.parametrize(("arguments", "message"), [
    (["accept", "-n", "0"], "argument -n/--num-drafts: expected a positive integer"),
    (["accept", "--target", "0.4,0.3,0.2,0.1", "--draft", "0.1,0.2,0.3,0.4", "-n", "1" + "0" * 20],
     "above the limit of 30 s"),
    (["theory", "improvement", "--uniform", "100000000:1"], "uniform V = 100,000,000"),
])
def test_refusals_end_with_one_line_and_status_2_in_a_fresh_process(arguments, message):
    finished = specbound(*arguments)
    assert finished.returncode == 2
    assert "Traceback" not in finished.stderr
    last = finished.stderr.strip().splitlines()[-1]
    assert last.startswith("specbound") and message in last


def test_a_closed_pipe_ends_quietly_with_status_141():
    """``specbound accept … --json | head`` closes the pipe before the output is written."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        finished = specbound("accept", "--target", "0.4,0.3,0.2,0.1", "--draft", "0.1,0.2,0.3,0.4", "--json",
                             stdout=write_end)
    finally:
        os.close(write_end)
    assert finished.returncode == 141
    assert "Traceback" not in finished.stderr and "BrokenPipeError" not in finished.stderr


@pytest.mark.skipif(not KNOWN_OPEN, reason="no value is known to fail")
@pytest.mark.usefixtures("no_model_loads")
@pytest.mark.parametrize(("command", "option"), list(KNOWN_OPEN) or [("", "")])
@pytest.mark.xfail(strict=True, reason="owned elsewhere, reported; see KNOWN_OPEN")
def test_known_open_values_still_fail(command, option, places, capsys):
    path = tuple(command.split())
    outcome, _ = call([*path, *base_arguments(path, places), f"{option}={HUGE[-1]}"])
    assert outcome in ("accepted", "refused") and "Traceback" not in capsys.readouterr().err
