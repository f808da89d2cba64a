"""``specbound generate "PROMPT"``: decode one prompt and stream the text as tokens are
accepted (a prompt of '-', or none, is read from standard input, which must be UTF-8).

The method defaults to ``auto``: the planner measures this machine's forward costs once
(kept in the cache), then picks chain or tree and their sizes step by step from the
acceptance it sees (``specbound.engine.planner``). Lossless: the text has the target's law
under the sampling settings. The text goes to standard output; the run's statistics and the
plan to standard error.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from specbound import arguments
from specbound.checks import unicode_text
from specbound.cli.decoding import (
    add_model_arguments,
    add_sampling_arguments,
    check_known_context,
    check_models,
    check_sampling,
    load_speculator,
)
from specbound.cli.inputs import standard_input_text
from specbound.engine.method_text import parse_method

if TYPE_CHECKING:
    import torch


class TextStream:
    """A streamer (``put``/``end``) that prints the text of the tokens so far as it grows:
    the prompt's ``put`` is skipped, and a text ending in an unfinished character waits for
    the next token."""

    def __init__(self, decode, file=None):
        self.decode = decode
        self.file = file or sys.stdout
        self.tokens: list[int] = []
        self.printed = 0
        self.prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.tokens += value.tolist()
        text = self.decode(self.tokens)
        if text.endswith("\ufffd"):
            return
        self.file.write(text[self.printed:])
        self.file.flush()
        self.printed = len(text)

    def end(self) -> None:
        text = self.decode(self.tokens)
        self.file.write(text[self.printed:] + "\n")
        self.file.flush()


def run(args: argparse.Namespace) -> int:
    prompt = args.prompt if args.prompt not in (None, "-") else standard_input_text("prompt")
    if not unicode_text("prompt", prompt).strip():
        raise ValueError("prompt: empty (give it as an argument or on standard input)")
    method, options = parse_method(args.method)
    check_sampling(args, [(method, options)])
    check_models(args)
    check_known_context(args)
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    speculator = load_speculator(args)
    stream = TextStream(lambda tokens: speculator.pair.decode(tokens, skip_special_tokens=True))
    result = speculator.generate(prompt, args.max_new_tokens, args.temperature, args.top_k, args.top_p, method,
                                 args.seed, stream, chat=not args.raw, **options)
    stats = result.stats
    print(f"{stats.tokens_generated} tokens in {stats.wall_seconds:.1f} s: {stats.tokens_per_second:.2f} tokens/s, "
          f"{stats.tokens_per_target_call:.2f} tokens per target call, finished by {result.finish_reason}",
          file=sys.stderr)
    if result.plan:
        print(f"plan: {result.plan}", file=sys.stderr)
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "generate", help="decode one prompt, streaming the text (method auto by default)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("prompt", nargs="?", help="the prompt text; '-' or nothing: read standard input")
    parser.add_argument("--raw", action="store_true", help="give the prompt as plain text, without the chat template")
    add_model_arguments(parser)
    add_sampling_arguments(parser, max_new_tokens=128)
    parser.add_argument("--method", default="auto",
                        help="auto (default) or a method of the engine, with its options as KEY=VALUE "
                        "pairs after a colon: 'chain:gamma=4', 'sparse:budget=12:depth=6'")
    parser.add_argument("--threads", type=arguments.integer(1, os.cpu_count() or 1), default=None,
                        help="torch CPU threads (at most the CPU count)")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress bars while the models load and a long prompt prefills")
    parser.set_defaults(handler=run)
