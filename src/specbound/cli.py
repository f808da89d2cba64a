"""The ``specbound`` command line: one subcommand per module in ``specbound.commands``.

Each command module exposes ``register(subparsers)``, which adds its parser and sets
``handler`` (a function taking the parsed arguments and returning an exit code).
The command line knows nothing of the math beyond calling it.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from specbound.gguf_assets import ModelPackageMissingError

COMMAND_MODULES = [
    "specbound.commands.accept",
    "specbound.commands.theory",
    "specbound.commands.run",
    "specbound.commands.bounds",
    "specbound.commands.study",
    "specbound.commands.report",
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
