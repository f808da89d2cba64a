"""The ``specbound`` command line: one module per command, each parse → call → print.

Each command module exposes ``register(subparsers)``, which adds its parser and sets
``handler`` (a function taking the parsed arguments and returning an exit code). The
numbers come from ``specbound.experiments``, the studies and the engine; the command line
knows nothing of the math beyond calling it. How a command ends:

- a bad value: exit status 2 and a one-line message naming the option (argparse's own, or
  a ValueError raised by specbound's own checks, a ``checks.WorkLimitError`` among them);
  so does running out of memory;
- Ctrl-C: one line, status 130 (128 + SIGINT, as the shell reports it);
- anything else (a ValueError raised inside a library, a TypeError, ...) is a bug: one line
  saying "internal error", status 1;
- a closed stdout (``specbound accept --json | head``): quietly, status 141, as a process
  that SIGPIPE stopped (what ``yes | head`` reports).

``--debug`` (before or after the command) adds the full traceback to any of them. Help
texts are the modules' docstrings with their reStructuredText markup taken out.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import traceback

from specbound.models.gguf import ModelPackageMissingError

COMMAND_MODULES = [
    "specbound.cli.accept",
    "specbound.cli.theory",
    "specbound.cli.run",
    "specbound.cli.generate",
    "specbound.cli.bounds",
    "specbound.cli.study",
    "specbound.cli.report",
    "specbound.cli.serve",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specbound",
        description="Speculative decoding with its theory built in.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    for each in _every_parser(parser):
        _make_plain(each)
        each.add_argument("--debug", action="store_true", default=False if each is parser else argparse.SUPPRESS,
                          help="on an error, show the full traceback")
    return parser


def _every_parser(parser: argparse.ArgumentParser):
    """``parser`` and every subcommand's parser below it."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                yield from _every_parser(subparser)


def plain_text(text: str | None) -> str | None:
    """``text`` without reStructuredText's literal quotes (````x```` shows as x)."""
    return None if text is None else re.sub(r"``(.+?)``", r"\1", text, flags=re.DOTALL)


def _make_plain(parser: argparse.ArgumentParser) -> None:
    parser.description = plain_text(parser.description)
    for action in parser._actions:
        action.help = plain_text(action.help)
        for choice in getattr(action, "_choices_actions", []):  # the subcommands' one-line helps
            choice.help = plain_text(choice.help)


BROKEN_PIPE_STATUS = 128 + 13  # 128 + SIGPIPE, as the shell reports a process SIGPIPE stopped
INTERRUPTED_STATUS = 128 + 2  # 128 + SIGINT
INTERNAL_ERROR_STATUS = 1


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
    except KeyboardInterrupt:  # while the command modules import torch and transformers
        print("specbound: interrupted", file=sys.stderr)
        return INTERRUPTED_STATUS
    args = parser.parse_args(argv)
    try:
        status = int(args.handler(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
        return status
    except BrokenPipeError:
        _silence_stdout()
        return BROKEN_PIPE_STATUS
    except KeyboardInterrupt:
        return _ended(args, "interrupted", INTERRUPTED_STATUS)
    except MemoryError:
        return _ended(args, "error: out of memory; ask for less (smaller sizes, fewer runs)", 2)
    except Exception as error:  # noqa: BLE001 (every error ends in one line; --debug shows where)
        if is_input_error(error):
            return _ended(args, f"error: {error}", 2)
        return _ended(args, f"internal error: {type(error).__name__}: {error} (a bug: rerun with --debug for the "
                      "traceback, and report it)", INTERNAL_ERROR_STATUS)


def is_input_error(error: BaseException) -> bool:
    """Whether ``error`` reports bad input: a ValueError raised by specbound's own code (the
    checks that name the argument), or a missing model package. A ValueError raised inside
    a library (numpy, torch, tokenizers) is not: specbound checks its input before handing it on."""
    if isinstance(error, ModelPackageMissingError):
        return True
    if not isinstance(error, ValueError) or error.__traceback__ is None:
        return False
    innermost = error.__traceback__
    while innermost.tb_next is not None:
        innermost = innermost.tb_next
    return innermost.tb_frame.f_globals.get("__name__", "").startswith("specbound.")


def _ended(args: argparse.Namespace, message: str, status: int) -> int:
    """Print ``message`` as the command's last line (after the traceback with ``--debug``)."""
    if args.debug:
        traceback.print_exc()
    print(f"specbound {args.command}: {message}", file=sys.stderr)
    return status


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's final flush of what is still
    buffered does not raise again on the closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (AttributeError, OSError, ValueError):  # stdout replaced by something without a file
        pass


if __name__ == "__main__":
    sys.exit(main())
