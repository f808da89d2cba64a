"""``specbound audit ENGINE``: does a speculative engine sample from its target's law?

ENGINE is one of
- ``specbound:METHOD`` — ours, a method with its options (``specbound:chain:gamma=4``,
  ``specbound:tree:num_drafts=2:depth=3``), on ``--backend``;
- ``llama-cpp-python:draft-model`` or ``llama-cpp-python:prompt-lookup`` — llama-cpp-python's
  speculative modes (the target's and the draft's GGUF files; llama.cpp applies the
  temperature after top-p, so keep --top-p 1 there);
- ``transformers:assisted`` — transformers' assisted generation (``assistant_model``);
- ``http://HOST:PORT`` — an OpenAI-compatible server (``--server``: specbound, llama.cpp or
  vllm) that returns the sampled token ids, serving ``--model``.

The reference is ``--target`` run without speculation (a GGUF file on llama.cpp where
llama-cpp-python is installed, or a Hugging Face folder), scoring every sampled token by
teacher forcing (``specbound.audit``). ``--samples`` continuations of ``--max-new-tokens``
tokens are drawn, spread over the prompts of ``--prompts``, each request to an endpoint
waiting ``--request-timeout`` seconds at most; the samples done, the time spent and the time
left show on stderr as they come. The verdict is one of three:

- passed (status 0): no test rejects at ``--level``, and the audit had the power to see a
  per-position TV below 1;
- failed (status 3): a test rejects; the engine's law is not its target's;
- inconclusive (status 4): nothing was scored, or too little to detect any TV; the line says
  why and what sample count would do.

It is printed with the p-value, the tolerances (measured from the reference's own rounding
unless given), the per-position TV and the error in temperature this many samples detect with
probability 0.99, and the worst positions; ``--output`` receives ``samples.jsonl`` (written as
the samples come, under a ``.partial`` name until the run ends), ``audit.json`` (strict JSON:
null where a figure is undefined) and ``audit.png``. Bad input ends with one line naming the
option and status 2, before any model loads where it can be seen then (the engine, the models'
files, an endpoint's URL, whether it is up and serves ``--model``; ``--top-p`` below 1 with
llama-cpp-python), and otherwise (an endpoint that stops answering, returns no token ids or
ids outside the reference's vocabulary, a sampler that fails) leaving no partial file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from specbound import arguments
from specbound.cli.decoding import parse_method

OTHER_ENGINES = ("llama-cpp-python:draft-model", "llama-cpp-python:prompt-lookup", "transformers:assisted")
SERVERS = ("specbound", "llama.cpp", "vllm")
KEY_VARIABLE = "SPECBOUND_API_KEY"
STATUS = {"passed": 0, "failed": 3, "inconclusive": 4}  # by verdict (1 is an internal error, 2 bad input)


def parse_engine(text: str) -> tuple[str, str]:
    """(kind, name): ("specbound", METHOD text), ("endpoint", URL) or one of ``OTHER_ENGINES``
    as (kind, mode), without importing the methods' registry; ValueError naming ``engine``."""
    if text.startswith(("http://", "https://")):
        from specbound.audit.samplers import endpoint_address

        return "endpoint", endpoint_address(text, "engine")
    if text.startswith("specbound:"):
        return "specbound", text.removeprefix("specbound:")
    if text in OTHER_ENGINES:
        kind, mode = text.split(":")
        return kind, mode
    raise ValueError(f"engine: expected specbound:METHOD, {', '.join(OTHER_ENGINES)} or an http(s):// URL, "
                     f"got {text!r}")


def parse_our_method(text: str) -> tuple[str, dict]:
    """(method, options) of our engine's METHOD text; ValueError naming ``engine``."""
    method, options = parse_method(text, option="engine")
    if method == "auto":
        raise ValueError("engine: audit a fixed method (specbound:chain, specbound:tree:num_drafts=2, ...), not auto")
    return method, options


def run(args: argparse.Namespace) -> int:
    kind, name = parse_engine(args.engine)
    check_models(args, kind, name)  # before the methods' registry loads: it takes a second
    name, options = parse_our_method(name) if kind == "specbound" else (name, {})
    from specbound.cli.inputs import prompt_set
    from specbound.cli.output import writable_folder

    texts = [prompt.text for prompt in prompt_set(args.prompts, args.limit, "--prompts")]
    folder = writable_folder(args.output, "--output")
    if kind == "endpoint":
        from specbound.audit.samplers import PROBE_TIMEOUT, probe_endpoint

        probe_endpoint(name, served_model(args), args.server, os.environ.get(KEY_VARIABLE),
                       min(args.request_timeout, PROBE_TIMEOUT), name="engine")
    sampler, reference, pair = build_engine(args, kind, name, options)
    prompt_ids = [pair.encode(text) for text in texts]
    return audit_and_report(args, sampler, reference, prompt_ids, pair.vocab_size, folder)


def check_models(args, kind: str, name: str) -> None:
    """Refuse, before anything loads, a model the engine needs that is no embedded model's
    name, existing .gguf file or (but for llama-cpp-python) Hugging Face folder, and a
    ``--top-p`` llama-cpp-python's sampler chain would apply with another law."""
    from specbound.cli.inputs import check_model_sources

    gguf_only = kind == "llama-cpp-python"
    needed = {"target": args.target}
    if kind in ("specbound", "transformers") or name == "draft-model":
        needed["draft"] = args.draft
    check_model_sources(needed, gguf_only)
    if gguf_only and args.top_p is not None and args.top_p < 1:
        raise ValueError(f"top_p: llama-cpp-python's sampler chain applies the temperature after top-p, so its law "
                         f"at --top-p {args.top_p:g} is not the one the reference scores; leave --top-p out")


def served_model(args) -> str:
    """The model asked of an endpoint: ``--model``, else ``--target`` (the name ``serve``
    gives its model unless told another)."""
    return args.model if args.model is not None else args.target


def build_engine(args, kind: str, name: str, options: dict):
    """(sampler, reference, pair): the engine under audit, the target without speculation,
    the pair whose tokenizer encodes the prompts."""
    from specbound.audit import samplers
    from specbound.engine.processing import Sampling
    from specbound.models.pair import load_pair

    progress = not args.quiet
    if kind == "specbound":
        from specbound.api import Speculator

        speculator = Speculator(args.target, args.draft, progress=progress, backend=args.backend)
        decoder, method = speculator.decoder_for(Sampling(args.temperature, args.top_k, args.top_p), name, options)
        from specbound.audit.reference import pair_reference

        return samplers.engine_sampler(decoder, method), pair_reference(speculator.pair), speculator.pair
    if kind == "endpoint":
        pair = load_pair(args.target, None, progress=progress, backend=_backend(args))
        sampler = samplers.endpoint_sampler(name, served_model(args), args.temperature, args.top_k or 0,
                                            args.top_p or 1.0, args.server, os.environ.get(KEY_VARIABLE),
                                            pair.eos_token_ids, args.request_timeout)
        return sampler, pair.target, pair
    if kind == "transformers":
        import torch

        pair = load_pair(args.target, args.draft, torch.float32, progress, float32_twins=False, backend="torch")
        sampler = samplers.transformers_sampler(pair.target, args.temperature, args.top_k or 0, args.top_p or 1.0,
                                                pair.draft, pair.eos_token_ids)
        return sampler, pair.target, pair
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    from specbound.models.loading import gguf_file

    pair = load_pair(args.target, None, progress=progress, backend="llama.cpp")
    target_path = str(gguf_file(args.target, progress=progress)[0])
    if name == "prompt-lookup":
        draft = LlamaPromptLookupDecoding(num_pred_tokens=args.num_drafts)
    else:
        draft = samplers.ModelDraft(Llama(str(gguf_file(args.draft, progress=progress)[0]), n_ctx=CONTEXT,
                                          verbose=False), args.num_drafts)
    llama = Llama(target_path, n_ctx=CONTEXT, draft_model=draft, verbose=False)
    return samplers.llama_cpp_sampler(llama, args.temperature, args.top_k or 0, args.top_p or 1.0), pair.target, pair


TOLERANCE_OPTIONS = {  # the audit's tolerances (``audit.tolerances``), each as the command line names it
    "--tolerance": "the mean per-position TV",
    "--row-tolerance": "one shared row's TV",
    "--sharpness-tolerance": "the sharpness test's aggregate drift of the score per unit of the rows' spread",
    "--variance-tolerance": "the sharpness test's excess of the score's second moment",
}
MAX_SAMPLES = 10**6  # the PIT values alone take samples × max-new-tokens × 8 bytes
CONTEXT = 4096  # llama-cpp-python's context for its engines: prompt and new tokens
MAX_REQUEST_SECONDS = 86_400  # a day, beyond any reply (values near 1e11 overflow a socket's timeout)


def _backend(args) -> str:
    from specbound.models.backends import resolve_backend

    return resolve_backend(args.backend, [args.target])


def below_one(low_open: bool):
    """An argparse type: a number in (0, 1) (``low_open``) or [0, 1), one message for every
    value outside."""
    interval = f"{'(' if low_open else '['}0, 1)"
    parse = arguments.number(0.0, 1.0, low_open=low_open)

    def check(text: str) -> float:
        try:
            value = parse(text)
        except argparse.ArgumentTypeError:
            value = None
        if value is None or value >= 1:
            raise argparse.ArgumentTypeError(f"expected a number in {interval}, got {text!r}")
        return value

    return check


def audit_and_report(args, sampler, reference, prompt_ids, vocab_size: int, folder: Path) -> int:
    """Run the audit, writing the samples as they come; print and save the verdict."""
    from tqdm import tqdm

    from specbound.audit import audit
    from specbound.audit.pit import edges
    from specbound.plots.audit import plot_audit

    partial = folder / "samples.jsonl.partial"
    bar = None if args.quiet else tqdm(total=args.samples, desc="audit", unit="sample", file=sys.stderr)
    try:
        with partial.open("w", encoding="utf-8") as sink:
            def saved(index, record):
                sink.write(json.dumps(record) + "\n")
                sink.flush()
                if bar is not None:
                    bar.update(1)

            result = audit(sampler, reference, prompt_ids, temperature=args.temperature, top_k=args.top_k or 0,
                           top_p=args.top_p or 1.0, max_new_tokens=args.max_new_tokens, samples=args.samples,
                           seed=args.seed, level=args.level, tolerance=args.tolerance,
                           row_tolerance=args.row_tolerance, sharpness_tolerance=args.sharpness_tolerance,
                           variance_tolerance=args.variance_tolerance, vocab_size=vocab_size, on_sample=saved)
    except ValueError:
        partial.unlink(missing_ok=True)
        raise
    finally:
        if bar is not None:
            bar.close()
    partial.replace(folder / "samples.jsonl")
    staged = folder / "audit.json.partial"
    staged.write_text(json.dumps(summarize(args, result), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    staged.replace(folder / "audit.json")
    plot_audit(edges(), result.pooled.fractions, result.tolerance, [stat.p_value for stat in result.positions],
               result.level, folder / "audit.png", result.sharpness.sharpening, result.detectable_sharpening)
    print(report(args, result))
    print(f"saved {folder / 'audit.json'}, {folder / 'audit.png'}, {folder / 'samples.jsonl'}")
    return STATUS[result.verdict]


def summarize(args, result) -> dict:
    """audit.json: the command's settings and the result's figures (``AuditResult.to_dict``),
    strict JSON (None where a figure is undefined)."""
    from specbound.audit.auditor import strict_json

    settings = {"engine": args.engine, "target": args.target, "max_new_tokens": args.max_new_tokens,
                "temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p, "seed": args.seed,
                "prompts": args.prompts}
    return strict_json(settings | result.to_dict())


def report(args, result) -> str:
    from specbound.cli.output import format_table

    heading = (f"{result.verdict.upper()}: {args.engine} against {args.target} at level {result.level:g}: "
               f"{result.reason}")
    if result.verdict == "inconclusive":
        remedy = (f"about {result.needed_samples:,} samples (--samples) of these prompts and --max-new-tokens would "
                  "detect a per-position TV of 0.5" if result.needed_samples is not None else
                  "no sample count would do: the engine returned no tokens to score")
        return f"{heading}\n{remedy} ({len(result.samples)} samples, {result.scored} positions scored)"
    shared, sharpness = result.shared, result.sharpness
    lines = [
        heading,
        f"p = {result.p_value:.3g} (pooled {result.pooled.p_value:.3g}, shared contexts {shared.p_value:.3g}, "
        f"sharpness {sharpness.p_value:.3g}); {_detects(result.detectable_tv, 'a per-position TV of', '.4f')} "
        f"({len(result.samples)} samples, {result.scored} positions scored; tolerance {result.tolerance:.3g} mean, "
        f"{result.row_tolerance:.3g} per shared row)",
        f"sampled tokens as if at temperature T/(1 {sharpness.sharpening:+.3f}); "
        f"{_detects(result.detectable_sharpening, 'an error in temperature of', '.3f')} (tolerance "
        f"{result.sharpness_tolerance:.3g} per unit of spread)",
        format_table(["position", "samples", "p (alone)", "edge", "share ≤ edge"],
                     [[stat.position, stat.scored, f"{stat.p_value:.3g}", f"{stat.edge:.1f}", f"{stat.fraction:.4f}"]
                      for stat in result.worst_positions()]),
    ]
    return "\n".join(lines)


def _detects(size: float, what: str, shape: str) -> str:
    """What an audit detects with probability 0.99, or that it detects none of ``what`` up to 1."""
    if size <= 1:
        return f"detects {what} {size:{shape}} with probability 0.99"
    return f"too few positions to detect {what} 1 or less"


def register(subparsers) -> None:
    from specbound.audit.samplers import REQUEST_TIMEOUT
    from specbound.cli.decoding import add_model_arguments, add_sampling_arguments

    parser = subparsers.add_parser("audit", help="test whether a speculative engine samples from its target's law",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("engine", help="specbound:METHOD, llama-cpp-python:draft-model, llama-cpp-python:prompt-lookup, "
                        "transformers:assisted, or an http(s):// endpoint")
    add_model_arguments(parser)
    add_sampling_arguments(parser, max_new_tokens=32)
    parser.add_argument("--samples", type=arguments.integer(1, MAX_SAMPLES), default=512,
                        help=f"continuations in all, spread over the prompts (default 512, at most {MAX_SAMPLES:,})")
    parser.add_argument("--prompts", default="humaneval", help="a prompt set or file (default humaneval)")
    parser.add_argument("--limit", type=arguments.positive_int, default=8, help="prompts of the set (default 8)")
    parser.add_argument("--level", type=below_one(low_open=True), default=1e-3,
                        help="the false-alarm rate at most, in (0, 1) (default 0.001)")
    for option, meaning in TOLERANCE_OPTIONS.items():
        parser.add_argument(option, type=below_one(low_open=False), default=None,
                            help=f"{meaning} a correct engine may show by rounding, in [0, 1) (default: measured "
                            "from the reference's own rounding, specbound.audit.tolerances)")
    parser.add_argument("--num-drafts", type=arguments.positive_int, default=4,
                        help="llama-cpp-python's tokens drafted per step (default 4)")
    parser.add_argument("--server", choices=SERVERS, default="specbound",
                        help="the endpoint's kind: where its replies hold the token ids (default specbound)")
    parser.add_argument("--model", default=None,
                        help="the model name sent to the endpoint (default: --target, the name specbound serve "
                        "gives its model)")
    parser.add_argument("--request-timeout", type=arguments.number(0.0, MAX_REQUEST_SECONDS, low_open=True),
                        default=REQUEST_TIMEOUT, help=f"seconds one request to the endpoint may take, at most "
                        f"{MAX_REQUEST_SECONDS:,} (default {REQUEST_TIMEOUT:g})")
    parser.add_argument("--output", type=arguments.folder, default="audit-results",
                        help="folder for samples.jsonl, audit.json and audit.png (default audit-results)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.set_defaults(handler=run)
