"""``specbound serve``: an OpenAI-compatible HTTP server with speculative decoding and
continuous batching (``specbound.serve``).

The model, backend, method and sampling options are those of ``generate``; the sampling
options and ``--max-new-tokens`` are a request's defaults, which its own fields override.
The server listens on 127.0.0.1 unless ``--host`` says otherwise. On SIGTERM (or Ctrl-C) it
stops accepting connections, lets the requests in flight finish for up to
``--drain-seconds``, cancels the rest, and exits with status 0.

``--pair-factory MODULE:FUNCTION`` serves the ``ModelPair`` that function returns instead
of loading ``--target``/``--draft``: the tests serve tiny in-process models with it
(``tests/serve/tiny_pair.py``).
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal

from specbound import arguments
from specbound.cli.decoding import add_model_arguments, add_sampling_arguments, load_speculator, parse_method


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from specbound.api import Speculator
    from specbound.engine.processing import Processing
    from specbound.serve.app import Settings, create_app
    from specbound.serve.batching import BatchingLoop
    from specbound.serve.prompts import PromptEncoder

    method, options = parse_method(args.method)
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    if args.pair_factory:
        speculator = Speculator(pair=_factory(args.pair_factory)(), drafter=args.drafter, device=args.device)
    else:
        speculator = load_speculator(args)
    processing = Processing(args.temperature, args.top_k, args.top_p, speculator.pair.vocab_size)
    speculator.progress = False  # loaded: a request's prefill draws no bar in the server's log (generate's does)
    decoder, _ = speculator.decoder_for(processing, method, options)  # auto measures its costs here, once
    name = args.served_model_name or speculator.pair.description.get("target") or args.target
    settings = Settings(name, decoder.target.max_positions, args.max_new_tokens, args.temperature, args.top_k,
                        args.top_p, args.seed, args.api_key or os.environ.get("SPECBOUND_API_KEY") or None)
    loop = BatchingLoop(speculator, method, options, args.max_batch, args.max_queue, args.max_settings)
    app = create_app(loop, PromptEncoder(speculator.pair), settings)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                           timeout_graceful_shutdown=args.drain_seconds, access_log=False))
    for handled in (signal.SIGTERM, signal.SIGINT):  # uvicorn drains on them, then raises them again: exit 0
        signal.signal(handled, lambda *_: None)
    server.run()
    return 0 if server.started else 1


def _factory(path: str):
    module, separator, name = path.partition(":")
    if not separator or not module or not name:
        raise ValueError(f"pair-factory: expected MODULE:FUNCTION, got {path!r}")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"pair-factory: cannot load {path!r}: {error}") from None


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve", help="an OpenAI-compatible server (completions, chat, streaming) with continuous batching",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_arguments(parser)
    add_sampling_arguments(parser, max_new_tokens=256)
    parser.add_argument("--method", default="auto",
                        help="auto (default) or a method of the engine with its options: 'chain:gamma=4'")
    server = parser.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine)")
    server.add_argument("--port", type=arguments.integer(0, 65535), default=8000, help="port (default 8000)")
    server.add_argument("--api-key", default=None,
                        help="require 'Authorization: Bearer KEY' on /v1 (default: $SPECBOUND_API_KEY, else none)")
    server.add_argument("--max-batch", type=arguments.positive_int, default=8,
                        help="sequences decoded at once (default 8)")
    server.add_argument("--max-queue", type=arguments.integer(0), default=64,
                        help="requests waiting beyond them; more are refused with 429 (default 64)")
    server.add_argument("--max-settings", type=arguments.positive_int, default=16,
                        help="distinct sampling settings (temperature, top_p, top_k) served, each its own batch "
                        "(default 16)")
    server.add_argument("--drain-seconds", type=arguments.number(0.0), default=30.0,
                        help="on SIGTERM, how long requests in flight may finish (default 30)")
    server.add_argument("--served-model-name", default=None, help="the model's id in the API (default: --target)")
    server.add_argument("--log-level", choices=["critical", "error", "warning", "info", "debug"], default="info")
    server.add_argument("--pair-factory", default=None, metavar="MODULE:FUNCTION",
                        help="serve the ModelPair this function returns instead of --target/--draft (for tests)")
    parser.add_argument("--threads", type=arguments.integer(1, os.cpu_count() or 1), default=None,
                        help="torch CPU threads (at most the CPU count)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars while the models load")
    parser.set_defaults(handler=run)
