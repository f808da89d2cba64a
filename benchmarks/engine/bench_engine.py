"""Our engine against transformers' generate, side by side on the same pair and prompts.

Runs, interleaved prompt by prompt so that load drift hits every method alike:
- ``hf generate``: ``model.generate`` (sampling, temperature T, no top-k/top-p);
- ``hf assisted``: ``generate(assistant_model=draft)`` with transformers' default schedule;
- ``hf assisted-4``: the same with a constant 4 draft tokens;
- ``hf lookup``: ``generate(prompt_lookup_num_tokens=4)`` (with --lookup);
- ours: autoregressive, the methods of ``--ours`` (each draft forward at the draft precision
  measured fastest for its rows), ``auto`` (the planner, learning across the prompts as a
  server would), and a prompt-lookup chain (with --lookup).
Prints tokens/s per method and its ratio to hf generate, to the better hf assisted run and
to our autoregressive, with tokens per target call; writes one JSON line per (prompt,
method) with the settings to --output as soon as it finishes, after the run's envelope
(``benchmarks.record``); rerunning with the same --output skips what is there and prints the
table of all it holds.

    python -m benchmarks.engine.bench_engine --prompts humaneval --limit 8 --max-new-tokens 128 --threads 2
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from tqdm import tqdm

from benchmarks import record
from specbound.datasets import load_prompts
from specbound.engine import Decoder, Processing, PromptLookupDrafter, build_method
from specbound.engine.assembly import assemble
from specbound.engine.backends.torch import CausalLM
from specbound.engine.backends.torch_quantize import quantize
from specbound.models.pair import load_pair

DEFAULT_OURS = "chain:gamma=4,chain:gamma=6,sparse:budget=12:depth=6:width=3"


def parse_ours(text: str) -> list[tuple[str, dict]]:
    """'tree:num_drafts=2:depth=3,chain:gamma=4' -> [(name, options), ...]"""
    methods = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, *pairs = item.split(":")
        options = {}
        for pair in pairs:
            key, value = pair.split("=")
            options[key] = value if key == "verifier" else int(value)
        methods.append((name, options))
    return methods


def hf_runner(target, temperature, stop_ids, **options):
    def run(prompt_ids, seed, max_new_tokens):
        torch.manual_seed(seed)  # transformers samples from the global generator
        inputs = torch.tensor([prompt_ids], device=target.device)
        output = target.generate(
            inputs, attention_mask=torch.ones_like(inputs), do_sample=True,
            temperature=temperature, top_k=None, top_p=None, max_new_tokens=max_new_tokens,
            eos_token_id=sorted(stop_ids), pad_token_id=sorted(stop_ids)[0], **options,
        )
        return output[0, len(prompt_ids):].tolist(), {}

    return run


def engine_runner(decoder, method):
    def run(prompt_ids, seed, max_new_tokens):
        generator = torch.Generator(device=decoder.target.device).manual_seed(seed)
        generation = decoder.generate(prompt_ids, method, max_new_tokens, generator)
        return generation.tokens, generation.stats.to_dict()

    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="default-target")
    parser.add_argument("--draft", default="default-draft")
    parser.add_argument("--target-precision", default="bf16", help="bf16 (as loaded), int8 or int4, for both engines")
    parser.add_argument("--prompts", default="humaneval")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--ours", default=DEFAULT_OURS)
    parser.add_argument("--no-auto", action="store_true", help="leave out the planner")
    parser.add_argument("--no-hf", action="store_true", help="leave out transformers' runs")
    parser.add_argument("--lookup", action="store_true", help="add prompt-lookup runs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    record.add_output(parser, "engine/bench_engine.jsonl")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    pair = load_pair(args.target, args.draft, float32_twins=False, progress=False)
    if args.target_precision != "bf16":
        pair = pair.with_target(quantize(pair.target, args.target_precision))
    pair = pair.to(args.device)
    processing = Processing(args.temperature, vocab_size=pair.vocab_size)
    decoder, planner = assemble(pair, processing)  # drafts at the fastest measured precision per forward
    plain = assemble(pair, processing, build_method("autoregressive")).decoder
    runners = {}
    if not args.no_hf:
        hf = dict(temperature=args.temperature, stop_ids=pair.eos_token_ids)
        runners["hf generate"] = hf_runner(pair.target, **hf)
        runners["hf assisted"] = hf_runner(pair.target, assistant_model=pair.draft, **hf)
        constant = dict(num_assistant_tokens=4, num_assistant_tokens_schedule="constant",
                        assistant_confidence_threshold=0.0)

        def assisted_constant(prompt_ids, seed, max_new_tokens):
            config = pair.draft.generation_config
            saved = {key: getattr(config, key) for key in constant}
            for key, value in constant.items():
                setattr(config, key, value)
            try:
                return runners["hf assisted"](prompt_ids, seed, max_new_tokens)
            finally:
                for key, value in saved.items():
                    setattr(config, key, value)

        runners["hf assisted-4"] = assisted_constant
        if args.lookup:
            runners["hf lookup"] = hf_runner(pair.target, prompt_lookup_num_tokens=4, **hf)
    runners["ours autoregressive"] = engine_runner(plain, build_method("autoregressive"))
    for name, options in parse_ours(args.ours):
        method = build_method(name, **options)
        runners[f"ours {method.name}"] = engine_runner(decoder, method)
    if not args.no_auto:
        runners["ours auto"] = engine_runner(decoder, planner)
    if args.lookup:
        lookup = Decoder(CausalLM(pair.target), PromptLookupDrafter(pair.vocab_size), processing, pair.eos_token_ids)
        runners["ours lookup chain γ=4"] = engine_runner(lookup, build_method("chain", gamma=4))

    prompts = load_prompts(args.prompts, limit=args.limit)
    encoded = [pair.encode(prompt.text) for prompt in prompts]
    settings = {"device": args.device, "threads": args.threads, "temperature": args.temperature,
                "max_new_tokens": args.max_new_tokens, "prompts": args.prompts, "target_precision": args.target_precision}
    run_interleaved(prompts, encoded, runners, args.output, settings, args.seed, args.max_new_tokens,
                    extra=lambda label: {"plan": planner.describe()} if label == "ours auto" else {})
    report(args.output, list(runners))
    return 0


def run_interleaved(prompts, encoded, runners: dict, output: Path, settings: dict, seed: int, max_new_tokens: int,
                    extra=lambda label: {}) -> None:
    """Every runner on every prompt, prompt by prompt (so that load drift hits all alike),
    each (prompt, runner) appended to the record ``output`` as one line as soon as it finishes with
    ``settings`` and ``extra(label)``; what ``output`` already holds is skipped. Each runner
    is first warmed up on a short prompt, not recorded — but a planner (a label with "auto"),
    whose warm-up is its own learning."""
    done = {(result["prompt_id"], result["method"]) for result in record.results(output)}
    lines = record.Lines(output)
    for label, runner in runners.items():
        if "auto" not in label:
            runner(encoded[0][:32], seed, 3)
    jobs = [(index, label) for index in range(len(prompts)) for label in runners]
    for index, label in tqdm(jobs, desc="bench", file=sys.stderr):
        if (prompts[index].id, label) in done:
            continue
        started = time.perf_counter()
        tokens, stats = runners[label](encoded[index], seed + index, max_new_tokens)
        seconds = time.perf_counter() - started
        lines.append({"prompt_id": prompts[index].id, "method": label, "prompt_tokens": len(encoded[index]),
                      "new_tokens": len(tokens), "seconds": seconds, "stats": stats, **settings, **extra(label)})


def report(path: Path, labels: list[str]) -> None:
    """Tokens/s per method and its ratios; for ours, tokens per target call and the share of
    the decoding time (prefill excluded) spent outside the models' forwards."""
    tokens, seconds, calls = defaultdict(int), defaultdict(float), defaultdict(int)
    decoding, outside = defaultdict(float), defaultdict(float)
    for result in record.results(path):
        tokens[result["method"]] += result["new_tokens"]
        seconds[result["method"]] += result["seconds"]
        stats = result["stats"] or {}
        calls[result["method"]] += stats.get("target_calls", 0)
        if "model_seconds" in stats:
            spent = stats["wall_seconds"] - stats["seconds"]["prefill"]
            decoding[result["method"]] += spent
            outside[result["method"]] += spent - stats["model_seconds"]
    speed = {label: tokens[label] / seconds[label] for label in labels if seconds[label]}
    assisted = max(speed.get("hf assisted", 0.0), speed.get("hf assisted-4", 0.0))
    base_hf, base_ours = speed.get("hf generate"), speed.get("ours autoregressive")
    print("| method | tokens/s | vs hf generate | vs better hf assisted | vs our autoregressive | tokens/call "
          "| outside models |")
    print("|---|---|---|---|---|---|---|")
    for label in labels:
        if label not in speed:
            continue
        ratio = lambda base: f"{speed[label] / base:.2f}" if base else "—"  # noqa: E731
        per_call = f"{tokens[label] / calls[label]:.2f}" if calls[label] else ""
        share = f"{outside[label] / decoding[label]:.1%}" if decoding[label] else ""
        print(f"| {label} | {speed[label]:.2f} | {ratio(base_hf)} | {ratio(assisted)} | {ratio(base_ours)} "
              f"| {per_call} | {share} |")


if __name__ == "__main__":
    sys.exit(main())
