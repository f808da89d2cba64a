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
tokens are drawn, spread over the prompts of ``--prompts``. The verdict, the p-value, the
per-position TV and the error in temperature this many samples detect with probability 0.99,
and the worst positions are printed; ``--output`` receives ``samples.jsonl`` (written as the samples come, under a
``.partial`` name until the run ends), ``audit.json`` and ``audit.png``. Bad input (an
unreachable endpoint, one that returns no token ids, a sampler that fails or returns ids
outside the reference's vocabulary) ends with one line and status 2, leaving no partial file.
The status is 0 when the engine passes and 3 when it fails.
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


def parse_engine(text: str) -> tuple[str, str, dict]:
    """(kind, name, options): ("specbound", METHOD, options), ("endpoint", URL, {}) or one of
    ``OTHER_ENGINES`` as (kind, mode, {}); ValueError naming ``engine``."""
    if text.startswith(("http://", "https://")):
        return "endpoint", text, {}
    if text.startswith("specbound:"):
        method, options = parse_method(text.removeprefix("specbound:"), option="engine")
        if method == "auto":
            raise ValueError("engine: audit a fixed method (specbound:chain, specbound:tree:num_drafts=2, ...), "
                             "not auto")
        return "specbound", method, options
    if text in OTHER_ENGINES:
        kind, mode = text.split(":")
        return kind, mode, {}
    raise ValueError(f"engine: expected specbound:METHOD, {', '.join(OTHER_ENGINES)} or an http(s):// URL, "
                     f"got {text!r}")


def run(args: argparse.Namespace) -> int:
    for option in ("level", "tolerance", "row_tolerance", "sharpness_tolerance", "variance_tolerance"):  # below 1
        if getattr(args, option) is not None and getattr(args, option) >= 1:
            raise ValueError(f"{option}: expected a number below 1, got {getattr(args, option):g}")
    kind, name, options = parse_engine(args.engine)
    from specbound.cli.inputs import prompt_set
    from specbound.cli.output import writable_folder

    texts = [prompt.text for prompt in prompt_set(args.prompts, args.limit, "--prompts")]
    folder = writable_folder(args.output, "--output")
    sampler, reference, pair = build_engine(args, kind, name, options)
    prompt_ids = [pair.encode(text) for text in texts]
    return audit_and_report(args, sampler, reference, prompt_ids, pair.vocab_size, folder)


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
        sampler = samplers.endpoint_sampler(name, args.model, args.temperature, args.top_k or 0, args.top_p or 1.0,
                                            args.server, os.environ.get("SPECBOUND_API_KEY"), pair.eos_token_ids)
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
FAILED_STATUS = 3  # the audit ran and the engine failed it (1 is an internal error, 2 bad input)
CONTEXT = 4096  # llama-cpp-python's context for its engines: prompt and new tokens


def _backend(args) -> str:
    from specbound.models.backends import resolve_backend

    return resolve_backend(args.backend, [args.target])


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
    summary = summarize(args, result)
    staged = folder / "audit.json.partial"
    staged.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    staged.replace(folder / "audit.json")
    plot_audit(edges(), result.pooled.fractions, result.tolerance, [stat.p_value for stat in result.positions],
               result.level, folder / "audit.png", result.sharpness.sharpening, result.detectable_sharpening)
    print(report(summary))
    print(f"saved {folder / 'audit.json'}, {folder / 'audit.png'}, {folder / 'samples.jsonl'}")
    return 0 if result.passed else FAILED_STATUS


def summarize(args, result) -> dict:
    return {
        "engine": args.engine, "target": args.target, "passed": result.passed, "p_value": result.p_value,
        "level": result.level, "detectable_tv": result.detectable_tv, "tolerance": result.tolerance,
        "row_tolerance": result.row_tolerance, "sharpness_tolerance": result.sharpness_tolerance,
        "variance_tolerance": result.variance_tolerance, "detectable_sharpening": result.detectable_sharpening,
        "samples": len(result.samples), "max_new_tokens": args.max_new_tokens,
        "positions_scored": result.scored, "temperature": args.temperature, "top_k": args.top_k,
        "top_p": args.top_p, "seed": args.seed, "prompts": args.prompts,
        "pooled": {"p_value": result.pooled.p_value, "edge": result.pooled.edge, "fraction": result.pooled.fraction},
        "shared_context": {"p_value": result.shared.p_value, "position": result.shared.position,
                           "prompt": result.shared.prompt, "token": result.shared.token,
                           "observed": result.shared.observed, "expected": result.shared.expected,
                           "samples": result.shared.samples},
        "sharpness": {"p_value": result.sharpness.p_value, "sharpening": result.sharpness.sharpening,
                      "total": result.sharpness.total, "spread": result.sharpness.spread,
                      "variance": result.sharpness.variance},
        "worst_positions": [vars(stat) for stat in result.worst_positions()],
        "seconds": result.seconds,
    }


def report(summary: dict) -> str:
    from specbound.cli.output import format_table

    verdict = "PASSED" if summary["passed"] else "FAILED"
    shared, sharpness = summary["shared_context"], summary["sharpness"]
    lines = [
        f"{verdict}: {summary['engine']} against {summary['target']} at level {summary['level']:g} "
        f"(p = {summary['p_value']:.3g}; pooled {summary['pooled']['p_value']:.3g}, shared contexts "
        f"{shared['p_value']:.3g}, sharpness {sharpness['p_value']:.3g})",
        f"detects a per-position TV of {summary['detectable_tv']:.4f} with probability 0.99 "
        f"({summary['samples']} samples, {summary['positions_scored']} positions scored; tolerance "
        f"{summary['tolerance']:g} mean, {summary['row_tolerance']:g} per shared row)",
        f"sampled tokens as if at temperature T/(1 {sharpness['sharpening']:+.3f}); detects an error of "
        f"{summary['detectable_sharpening']:.3f} in temperature with probability 0.99 (tolerance "
        f"{summary['sharpness_tolerance']:g} per unit of spread)",
        format_table(["position", "samples", "p (alone)", "edge", "share ≤ edge"],
                     [[stat["position"], stat["scored"], f"{stat['p_value']:.3g}", f"{stat['edge']:.1f}",
                       f"{stat['fraction']:.4f}"] for stat in summary["worst_positions"]]),
    ]
    return "\n".join(lines)


def register(subparsers) -> None:
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
    parser.add_argument("--level", type=arguments.number(0.0, 1.0, low_open=True), default=1e-3,
                        help="the false-alarm rate at most (default 0.001)")
    for option, meaning in TOLERANCE_OPTIONS.items():
        parser.add_argument(option, type=arguments.number(0.0, 1.0), default=None,
                            help=f"{meaning} a correct engine may show by rounding (default: what the reference's "
                            "backend states, specbound.engine.backends.Rounding)")
    parser.add_argument("--num-drafts", type=arguments.positive_int, default=4,
                        help="llama-cpp-python's tokens drafted per step (default 4)")
    parser.add_argument("--server", choices=SERVERS, default="specbound",
                        help="the endpoint's kind: where its replies hold the token ids (default specbound)")
    parser.add_argument("--model", default="specbound", help="the model name sent to the endpoint")
    parser.add_argument("--output", type=arguments.folder, default="audit-results",
                        help="folder for samples.jsonl, audit.json and audit.png (default audit-results)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.set_defaults(handler=run)
