"""The ``specbound`` command line: one module per command, each parse → call → print.

Each command module exposes ``register(subparsers)``, which adds its parser and sets
``handler`` (a function taking the parsed arguments and returning an exit code). The
numbers come from ``specbound.tables``, the studies and the engine; the command line
knows nothing of the math beyond calling it. Building the parser imports none of them (nor
torch, transformers, matplotlib, numba or scipy): the handlers import what they call, and a
command whose options are read from such a registry adds them on its first use
(``subparsers.choices.defer``, ``CommandParsers``), after a first pass over the options it
can check without it. The handlers check every value before
they import torch, transformers or llama.cpp, and ``accept``, ``bounds`` and ``theory``
never import them (the math layers import torch only in their torch paths). How a command ends:

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
from collections.abc import Mapping

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
    "specbound.cli.audit",
]
COMMAND_NAMES = [module_name.rpartition(".")[2] for module_name in COMMAND_MODULES]  # each module is its command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specbound",
        description="Speculative decoding with its theory built in.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", action=CommandsAction)
    subparsers.choices = subparsers._name_parser_map = CommandParsers(_finish)
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    _make_plain(parser)
    parser.add_argument("--debug", action="store_true", default=False, help=DEBUG_HELP)
    return parser


DEBUG_HELP = "on an error, show the full traceback"


class CommandParsers(Mapping):
    """The commands' parsers by name, where the subparsers action looks them up (its
    ``choices``). A command's parser is finished (``_finish``) on its first lookup — parsing
    the command, its help, a walk over every parser — after the options its module deferred
    to then (``defer``), if any: options read from a registry whose modules are heavy (the
    studies' import torch, the engine's methods numba and scipy) cost the other commands nothing."""

    def __init__(self, finish):
        self._parsers = {}
        self._unfinished = {}  # name -> the deferred fill, or None
        self._checks = {}  # name -> the first pass over its arguments
        self._finish = finish

    def __setitem__(self, name: str, parser: argparse.ArgumentParser) -> None:  # argparse's add_parser
        self._parsers[name] = parser
        self._unfinished[name] = None

    def defer(self, name: str, fill, check=None) -> None:
        """Have ``fill(parser)`` add the options of command ``name`` on its first lookup, and
        ``check(arguments)``, when given, see the command's arguments before that lookup when
        they are parsed: a first pass over the options it can check without the registry,
        refusing a bad value in a moment."""
        self._unfinished[name] = fill
        if check is not None:
            self._checks[name] = check

    def check(self, name: str, arguments: list[str]) -> None:
        """The first pass of command ``name`` over ``arguments`` (``defer``), if it has one."""
        if name in self._checks:
            self._checks.pop(name)(arguments)

    def __getitem__(self, name: str) -> argparse.ArgumentParser:
        parser = self._parsers[name]
        if name in self._unfinished:
            fill = self._unfinished.pop(name)
            if fill is not None:
                fill(parser)
            self._finish(parser)
        return parser

    def __contains__(self, name) -> bool:  # a name is checked without building its parser
        return name in self._parsers

    def __iter__(self):
        return iter(self._parsers)

    def __len__(self) -> int:
        return len(self._parsers)


class CommandsAction(argparse._SubParsersAction):
    """The commands' subparsers action: a command's first pass (``CommandParsers.defer``)
    sees its arguments before its parser is looked up and finished."""

    def __call__(self, parser, namespace, values, option_string=None):
        self.choices.check(values[0], values[1:])
        super().__call__(parser, namespace, values, option_string)


def _finish(command: argparse.ArgumentParser) -> None:
    """Plain help texts and ``--debug`` on a command's parser and every parser below it."""
    for each in _every_parser(command):
        _make_plain(each)
        each.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)


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
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser().parse_args(argv)
    except KeyboardInterrupt:  # while a deferred command's options import their registry (torch)
        command = next((word for word in argv if not word.startswith("-")), None)
        print(f"specbound{f' {command}' if command in COMMAND_NAMES else ''}: interrupted", file=sys.stderr)
        return INTERRUPTED_STATUS
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
