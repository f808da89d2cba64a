"""The options ``run`` and ``generate`` share: which models, at which precision, on which
device; how to sample; which method (``auto`` or one of the engine's, with its options)."""

from __future__ import annotations

import argparse
import math
import sys
from typing import TYPE_CHECKING

from specbound import arguments
from specbound.cli.inputs import check_model_sources
from specbound.engine.backends import CHOICES as BACKENDS
from specbound.engine.method_text import parse_method  # noqa: F401  (serve and audit read it here)
from specbound.engine.precisions import AS_LOADED, OLD_NAMES, PRECISIONS, precision_name
from specbound.models import DTYPES

if TYPE_CHECKING:
    from specbound.engine.methods import Method


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    models = parser.add_argument_group("models")
    models.add_argument("--target", default="default-target",
                        help="embedded model name, .gguf file or Hugging Face directory (default default-target)")
    models.add_argument("--draft", default=arguments.default("default-draft"),
                        help="draft model, same forms (default default-draft)")
    models.add_argument("--drafter", choices=["model", "prompt-lookup", "suffix"], default="model",
                        help="draft with the draft model, by n-gram prompt lookup, or by suffix decoding (trees of "
                        "what followed the text's suffix in the prompt, the output so far and earlier outputs)")
    models.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16", help="the models' dtype (bfloat16)")
    models.add_argument("--target-precision", "--target-dtype", type=precision, choices=PRECISIONS,
                        default=AS_LOADED, help=f"the target's weights: {AS_LOADED} (default: the model itself, at "
                        "--dtype, or a GGUF file's own types on llama.cpp) or a weight-only int8/int4 copy (CPU only, "
                        "kept in the cache; changes the law being sampled: the target is then the quantised model)"
                        f"{OLD_NAMES_HELP}")
    models.add_argument("--draft-precisions", type=precisions, default=arguments.default(list(PRECISIONS)),
                        help=f"draft precisions the planner may use, forward by forward, as for --target-precision "
                        f"(default {','.join(PRECISIONS)}; any precision keeps decoding lossless; on llama.cpp or a "
                        f"GPU the draft runs {AS_LOADED}){OLD_NAMES_HELP}")
    models.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the models run (cpu)")
    models.add_argument("--backend", choices=list(BACKENDS), default="auto",
                        help="whose kernels run the forwards: llama.cpp (GGUF files as they are), torch, or auto "
                        "(default: llama.cpp for GGUF models when llama-cpp-python is installed and the device is "
                        "the CPU, torch otherwise)")


OLD_NAMES_HELP = "".join(f"; {old} is an old name of {name}" for old, name in OLD_NAMES.items())


def precision(text: str) -> str:
    """A precision of ``engine.precisions.PRECISIONS`` (an old name accepted)."""
    try:
        return precision_name(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"unknown {text!r}; choose from {', '.join(PRECISIONS)}") from None


def precisions(text: str) -> list[str]:
    """A comma-separated selection of precisions, each once."""
    return list(dict.fromkeys(arguments.comma_list(precision)(text)))


def add_sampling_arguments(parser: argparse.ArgumentParser, max_new_tokens: int) -> None:
    sampling = parser.add_argument_group("sampling")
    sampling.add_argument("--temperature", type=arguments.number(0.0), default=0.7, help="0 = greedy (default 0.7)")
    sampling.add_argument("--top-k", type=arguments.positive_int, default=None)
    sampling.add_argument("--top-p", type=arguments.number(0.0, 1.0, low_open=True), default=None)
    sampling.add_argument("--seed", type=arguments.seed, default=0)
    sampling.add_argument("--max-new-tokens", type=arguments.integer(1, MAX_NEW_TOKENS), default=max_new_tokens,
                          help=f"tokens to generate at most (default {max_new_tokens}; at most {MAX_NEW_TOKENS:,}, "
                          "more positions than any model has)")


MAX_NEW_TOKENS = 2**20  # more positions than any model here has (Qwen2.5: 32,768)


def check_sampling(args, methods: list[tuple[str, dict]], option: str = "method") -> None:
    """What can be refused before the models load beyond each value's own check: a method
    of ``methods`` (name, options) that the sampling settings make too large for its
    verifier (``check_enumeration``); messages name ``option``."""
    from specbound.engine.methods import build_method

    for name, options in methods:
        if name != "auto":
            check_enumeration(build_method(name, **options), args.temperature, args.top_k, args.top_p, option)


def check_enumeration(method: Method, temperature: float, top_k: int | None, top_p: float | None,
                      option: str = "method") -> None:
    """Refuse a method whose verifier enumerates every tuple of a node's drafts
    (``Verifier.scalable`` False: the optimal verifier's linear program has tuples × V
    variables, at most ``MAX_LP_VARIABLES``) where the sampling lets the draft sample more
    tokens than any vocabulary V leaves room for: every token (a positive temperature, no
    --top-k or --top-p), or a --top-k above that size. A --top-p bounds the draft's tokens
    by what the model says: that is checked when decoding."""
    from specbound.bounds import MAX_LP_VARIABLES
    from specbound.engine.methods import Budget

    deciders = method.verifiers if method.tree_verifier is None else (method.tree_verifier,)
    enumerating = next((verifier for verifier in deciders if not verifier.scalable), None)
    if enumerating is None or temperature == 0 or (top_k is None and top_p is not None):
        return
    num_drafts = method.shape.max_children if isinstance(method.shape, Budget) else max(method.shape.branching)
    distinct = enumerating.scheme != "with_replacement"

    def variables(tokens: int) -> int:  # the tuples of num_drafts drafts from `tokens` tokens, × V ≥ tokens
        return (math.perm(tokens, num_drafts) if distinct else tokens**num_drafts) * tokens

    largest = 1
    while variables(largest + 1) <= MAX_LP_VARIABLES:
        largest += 1
    if top_k is not None and top_k <= largest:
        return
    drawn = (f"--top-k {top_k:,} lets the draft sample {top_k:,} tokens" if top_k is not None
             else "without --top-k the draft samples every token of the vocabulary")
    raise ValueError(
        f"{option}: the {enumerating.name} verifier of {method.name} solves a linear program over every tuple of "
        f"a node's {num_drafts} drafts and every token of the vocabulary (tuples × V variables, at most "
        f"{MAX_LP_VARIABLES:,}); {drawn}, beyond that limit for any vocabulary over {largest:,} tokens: give "
        f"--top-k {largest:,} or less, --temperature 0, or another verifier")


def check_models(args) -> None:
    """Refuse, before anything loads: the draft model's options where the drafter loads no
    draft model, and a ``--target`` or ``--draft`` that names no model
    (``inputs.check_model_sources``)."""
    check_drafter_options(args)
    check_model_sources({"target": args.target, "draft": args.draft if args.drafter == "model" else None})


def check_known_context(args) -> None:
    """Refuse, before the models load, a ``--max-new-tokens`` that no prompt leaves room for
    in the models' context as their files say it (``models.context.check_fits_context``).
    The exact check, with the prompt's tokens, follows the loading."""
    from specbound.models.context import check_fits_context

    sources = [args.target] + ([args.draft] if args.drafter == "model" and args.draft is not None else [])
    check_fits_context(args.max_new_tokens, sources, " (--max-new-tokens)")


def check_drafter_options(args) -> None:
    """Refuse the draft model's options with ``--drafter prompt-lookup`` or ``suffix``, which
    load no draft model (they draft from the text): given, they would be ignored."""
    if args.drafter not in ("prompt-lookup", "suffix"):
        return
    for flag, value in (("--draft", args.draft), ("--draft-precisions", args.draft_precisions)):
        if arguments.given(value):
            raise ValueError(f"{flag.lstrip('-').replace('-', '_')}: {flag} chooses the draft model, which "
                             f"--drafter {args.drafter} does not load (it drafts from the text); "
                             f"leave {flag} out or use --drafter model")


def load_speculator(args):
    """The ``Speculator`` (``specbound.api``) the model options ask for."""
    import torch

    check_drafter_options(args)

    from specbound.api import Speculator

    speculator = Speculator(args.target, args.draft, getattr(torch, args.dtype), args.target_precision,
                            args.draft_precisions, args.device, progress=not getattr(args, "quiet", False),
                            drafter=args.drafter, backend=args.backend)
    missed = missed_fast_backend(args.backend, speculator.backend, [args.target, args.draft], args.device)
    if missed:
        print(f"specbound: {missed}", file=sys.stderr)
    return speculator


def missed_fast_backend(asked: str, chosen, sources, device: str) -> str | None:
    """One line for a user whose models run on ``chosen`` (a ``Backend``) under ``auto``
    only because the backend ``auto`` prefers is not installed: what it would give and how
    to get it (None otherwise)."""
    from specbound.models.backends import passed_over

    missing = passed_over(chosen, sources, device) if asked == "auto" else None
    return None if missing is None else f"decoding on {chosen.name}: {missing.missing}"
