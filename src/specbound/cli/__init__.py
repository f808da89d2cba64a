"""The ``specbound`` command line: one module per command, each parse → call → print.

Each command module exposes ``register(subparsers)``, which adds its parser and sets
``handler`` (a function taking the parsed arguments and returning an exit code). The
numbers come from ``specbound.experiments``, the studies and the engine; the command line
knows nothing of the math beyond calling it. A bad value ends with exit status 2 and a
one-line message naming the option (argparse's own, or a ValueError raised below, a
``checks.WorkLimitError`` among them); so does running out of memory. A closed stdout
(``specbound accept --json | head``) ends quietly with status 141, as a process that
SIGPIPE stopped (what ``yes | head`` reports), never with a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from specbound.models.gguf import ModelPackageMissingError

COMMAND_MODULES = [
    "specbound.cli.accept",
    "specbound.cli.theory",
    "specbound.cli.run",
    "specbound.cli.generate",
    "specbound.cli.bounds",
    "specbound.cli.study",
    "specbound.cli.report",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specbound",
        description="Speculative decoding with its theory built in.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


BROKEN_PIPE_STATUS = 128 + 13  # 128 + SIGPIPE, as the shell reports a process SIGPIPE stopped


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        status = int(args.handler(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
        return status
    except BrokenPipeError:
        _silence_stdout()
        return BROKEN_PIPE_STATUS
    except (ValueError, ModelPackageMissingError) as error:
        print(f"specbound {args.command}: error: {error}", file=sys.stderr)
        return 2
    except MemoryError:
        print(f"specbound {args.command}: error: out of memory; ask for less (smaller sizes, fewer runs)",
              file=sys.stderr)
        return 2


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
