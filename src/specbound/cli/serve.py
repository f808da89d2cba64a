"""``specbound serve``: an OpenAI-compatible HTTP server with speculative decoding and
continuous batching (``specbound.serve``).

The model, backend, method and sampling options are those of ``generate``; the sampling
options and ``--max-new-tokens`` are a request's defaults, which its own fields override.
The server listens on 127.0.0.1 unless ``--host`` says otherwise; the address is resolved and
the port bound before the models load, so a bad one is refused at once. On SIGTERM (or
Ctrl-C) it stops accepting connections, lets the requests in flight finish for up to
``--drain-seconds``, ends the rest (a stream with an error event and ``data: [DONE]``), and
exits with status 0.

A request may take a batch slot (``--max-batch``) or, when all are busy, wait (up to
``--max-queue`` requests; 0: none wait); beyond them it is refused with 429. Requests of
every sampling setting decode in one batch of one decoder; the cache entries the requests
decoding and waiting reserve (prompt, max_tokens and a draft tree each) are at most
``--max-cache-tokens``, and a request beyond them is refused with 429 (one alone is always
taken). A body over ``--max-body-bytes`` is refused with 413. ``--api-key`` (or
``$SPECBOUND_API_KEY``) must not be empty; clients send it as ``Authorization: Bearer KEY``;
without one, listening beyond this machine is warned of.

``--pair-factory MODULE:FUNCTION`` serves the ``ModelPair`` that function returns instead
of loading ``--target``/``--draft``: the tests serve tiny in-process models with it
(``tests/support/chat_pair.py``).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import signal
import sys

from specbound import arguments
from specbound.cli.decoding import (add_model_arguments, add_sampling_arguments, check_models, load_speculator,
                                    parse_method)

KEY_VARIABLE = "SPECBOUND_API_KEY"
SERVE_PACKAGES = ("fastapi", "uvicorn", "prometheus_client")  # the serve extra's
# A request body's default limit: 32,768 token ids take about 0.2 MB; json parses a body holding the
# GIL, so the limit also bounds how long one request can keep /health waiting.
MAX_BODY_BYTES = 2**20


def run(args: argparse.Namespace) -> int:
    missing = [name for name in SERVE_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:  # before anything binds or loads
        raise ValueError(f"serve needs {', '.join(missing)}, which the serve extra installs: "
                         "pip install 'specbound[serve]' (from a checkout: pip install -e '.[serve]')")
    from specbound.serve.server import bind, exposure_warning

    check_models(args)
    method, options = parse_method(args.method)
    api_key = args.api_key if args.api_key is not None else _environment_key()
    listener = bind(args.host, args.port)  # a bad address is refused before anything heavy loads
    warning = exposure_warning(listener, api_key)
    if warning:
        print(f"specbound serve: {warning}", file=sys.stderr)
    try:
        return _serve(args, method, options, api_key, listener)
    finally:
        listener.close()


def _serve(args: argparse.Namespace, method: str, options: dict, api_key: str | None, listener) -> int:
    from specbound.api import Speculator
    from specbound.engine.processing import Sampling
    from specbound.serve.app import create_app
    from specbound.serve.batching import BatchingLoop
    from specbound.serve.handling import Settings
    from specbound.serve.metrics import ServerMetrics
    from specbound.serve.prompts import PromptEncoder
    from specbound.serve.server import run as serve_forever

    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    if args.pair_factory:
        speculator = Speculator(pair=_factory(args.pair_factory)(), drafter=args.drafter, device=args.device)
    else:
        speculator = load_speculator(args)
    sampling = Sampling(args.temperature, args.top_k, args.top_p)
    speculator.progress = False  # loaded: a request's prefill draws no bar in the server's log (generate's does)
    decoder, _ = speculator.decoder_for(sampling, method, options)  # auto measures its costs here, once
    name = args.served_model_name or speculator.pair.description.get("target") or args.target
    context = decoder.target.max_positions
    settings = Settings(name, context, args.max_new_tokens, sampling, args.seed, args.max_body_bytes, api_key)
    metrics = ServerMetrics()
    max_cache_tokens = args.max_cache_tokens if args.max_cache_tokens is not None else context
    loop = BatchingLoop(speculator, method, options, args.max_batch, args.max_queue, max_cache_tokens,
                        default=sampling, observer=metrics)
    app = create_app(loop, PromptEncoder(speculator.pair, context), settings, metrics)
    for handled in (signal.SIGTERM, signal.SIGINT):  # uvicorn drains on them, then raises them again: exit 0
        signal.signal(handled, lambda *_: None)
    return 0 if serve_forever(app, loop, listener, args.drain_seconds, args.log_level) else 1


def api_key(text: str) -> str:
    """An API key: printable ASCII without spaces (what a bearer token can carry), not empty."""
    if not text:
        raise argparse.ArgumentTypeError("must not be empty (an empty key would serve without authentication; "
                                         "leave the option out for no key)")
    if not all("!" <= character <= "~" for character in text):
        raise argparse.ArgumentTypeError("must be printable ASCII without spaces (a bearer token's characters)")
    return text


def _environment_key() -> str | None:
    text = os.environ.get(KEY_VARIABLE)
    if text is None:
        return None
    try:
        return api_key(text)
    except argparse.ArgumentTypeError as error:
        raise ValueError(f"${KEY_VARIABLE}: {error}") from None


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
    server.add_argument("--api-key", type=api_key, default=None,
                        help="require 'Authorization: Bearer KEY' on /v1 (default: $SPECBOUND_API_KEY, else none); "
                        "not empty")
    server.add_argument("--max-batch", type=arguments.positive_int, default=8,
                        help="sequences decoded at once (default 8)")
    server.add_argument("--max-queue", type=arguments.integer(0), default=64,
                        help="requests waiting for a slot when all are busy (0: none wait); more are refused with "
                        "429 (default 64)")
    server.add_argument("--max-cache-tokens", type=arguments.positive_int, default=None,
                        help="cache entries the requests decoding and waiting reserve together at most (its prompt, "
                        "max_tokens and a draft tree each); a request beyond them is refused with 429, one alone is "
                        "always taken (default: the model's context)")
    server.add_argument("--max-body-bytes", type=arguments.integer(1), default=MAX_BODY_BYTES,
                        help=f"a request body's size at most; larger ones are refused with 413 "
                        f"(default {MAX_BODY_BYTES:,})")
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
