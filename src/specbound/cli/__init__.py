"""The ``specbound`` command line: one module per command, each parse → call → print.

Each command module exposes ``register(subparsers)``, which adds its parser and sets
``handler`` (a function taking the parsed arguments and returning an exit code). The
numbers come from ``specbound.experiments``, the studies and the engine; the command line
knows nothing of the math beyond calling it. A bad value ends with exit status 2 and a
one-line message naming the option (argparse's own, or a ValueError raised below).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from specbound.models.gguf import ModelPackageMissingError

COMMAND_MODULES = [
    "specbound.cli.accept",
    "specbound.cli.theory",
    "specbound.cli.run",
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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except (ValueError, ModelPackageMissingError) as error:
        print(f"specbound {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
