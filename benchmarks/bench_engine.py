"""Our engine against transformers' generate, side by side on the same pair and prompts.

Runs, interleaved prompt by prompt so that load drift hits every method alike:
- ``hf-plain``: ``model.generate`` (sampling, temperature T, no top-k/top-p);
- ``hf-assisted``: ``generate(assistant_model=draft)`` with transformers' defaults
  (up to 20 draft tokens, stopping when the draft's confidence drops below 0.4);
- ``hf-assisted-4``: the same with a constant 4 draft tokens;
- ``hf-lookup``: ``generate(prompt_lookup_num_tokens=4)`` (only with --lookup);
- ours: autoregressive, chains and trees (``--ours``), plus a prompt-lookup chain with
  --lookup.
Prints tokens/s per method and its ratio to hf-plain and to the better assisted run, and
writes one JSONL line per (repeat, prompt, method) to --output as soon as it finishes;
rerunning with the same --output skips what is already there.

With --overhead it measures instead the verification cost of one tree node (target
logits → probabilities, then the verifier) for each verifier against one target forward
of one token, both as the minimum over repeats in the same process (the least disturbed
figure on a shared machine).

    python benchmarks/bench_engine.py --limit 4 --max-new-tokens 64
    python benchmarks/bench_engine.py --overhead
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from tqdm import tqdm

from specbound.datasets import load_prompts
from specbound.engine import CausalLM, Decoder, ModelDrafter, Processing, PromptLookupDrafter
from specbound.models.chat import encode_prompt, stop_token_ids
from specbound.engine.methods import build_method
from specbound.drafts import get_draft_scheme
from specbound.models.loading import check_shared_vocabulary, load_model
from specbound.verifiers import get_verifier

DEFAULT_OURS = "chain:gamma=2,chain:gamma=3,tree:num_drafts=2:depth=2,batch:num_drafts=2:gamma=2"


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
        inputs = torch.tensor([prompt_ids])
        output = target.generate(
            inputs, attention_mask=torch.ones_like(inputs), do_sample=True,
            temperature=temperature, top_k=None, top_p=None, max_new_tokens=max_new_tokens,
            eos_token_id=sorted(stop_ids), pad_token_id=sorted(stop_ids)[0], **options,
        )
        return output[0, len(prompt_ids):].tolist()

    return run


def engine_runner(decoder, method):
    def run(prompt_ids, seed, max_new_tokens):
        generation = decoder.generate(prompt_ids, method, max_new_tokens,
                                      torch.Generator().manual_seed(seed))
        return generation.tokens, generation.stats.to_dict()

    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="default-target")
    parser.add_argument("--draft", default="default-draft")
    parser.add_argument("--prompts", default="instructions")
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--ours", default=DEFAULT_OURS)
    parser.add_argument("--lookup", action="store_true", help="add prompt-lookup runs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--overhead", action="store_true", help="measure verification overhead only")
    parser.add_argument("--output", default="benchmarks/results/bench_engine.jsonl")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    target = load_model(args.target)
    draft = load_model(args.draft)
    vocab_size = check_shared_vocabulary(target, draft)
    stop_ids = stop_token_ids(target.tokenizer, target.model)
    processing = Processing(args.temperature, vocab_size=vocab_size)
    model_decoder = Decoder(CausalLM(target.model), ModelDrafter(CausalLM(draft.model), processing),
                            processing, stop_ids)
    lookup_decoder = Decoder(model_decoder.target, PromptLookupDrafter(vocab_size), processing, stop_ids)
    if args.overhead:
        prompt_ids = encode_prompt(target.tokenizer, load_prompts(args.prompts, limit=1)[0].text)
        measure_overhead(model_decoder, draft.model, prompt_ids)
        return 0

    hf_options = dict(temperature=args.temperature, stop_ids=stop_ids)
    runners = {
        "hf-plain": hf_runner(target.model, **hf_options),
        "hf-assisted": hf_runner(target.model, assistant_model=draft.model,
                                 **hf_options),
    }
    constant_draft = dict(num_assistant_tokens=4, num_assistant_tokens_schedule="constant",
                          assistant_confidence_threshold=0.0)

    def assisted_constant(prompt_ids, seed, max_new_tokens):
        config = draft.model.generation_config
        saved = {key: getattr(config, key) for key in constant_draft}
        for key, value in constant_draft.items():
            setattr(config, key, value)
        try:
            return runners["hf-assisted"](prompt_ids, seed, max_new_tokens)
        finally:
            for key, value in saved.items():
                setattr(config, key, value)

    runners["hf-assisted-4"] = assisted_constant
    runners["ours autoregressive"] = engine_runner(model_decoder, build_method("autoregressive"))
    for name, options in parse_ours(args.ours):
        method = build_method(name, **options)
        runners[f"ours {method.name}"] = engine_runner(model_decoder, method)
    if args.lookup:
        runners["hf-lookup"] = hf_runner(target.model, prompt_lookup_num_tokens=4,
                                         **hf_options)
        runners["ours lookup chain γ=4"] = engine_runner(lookup_decoder, build_method("chain", gamma=4))

    prompts = load_prompts(args.prompts, limit=args.limit)
    encoded = [encode_prompt(target.tokenizer, prompt.text) for prompt in prompts]
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    done = set()
    if output.exists():
        done = {(r["repeat"], r["prompt_id"], r["method"]) for r in map(json.loads, output.open())}
    for runner in runners.values():  # warm-up, not recorded
        runner(encoded[0], args.seed, 3)

    jobs = [(repeat, index, label) for repeat in range(args.repeats)
            for index in range(len(prompts)) for label in runners]
    with output.open("a") as results:
        for repeat, index, label in tqdm(jobs, desc="bench", file=sys.stderr):
            key = (repeat, prompts[index].id, label)
            if key in done:
                continue
            started = time.perf_counter()
            result = runners[label](encoded[index], args.seed + 1000 * repeat + index,
                                    args.max_new_tokens)
            seconds = time.perf_counter() - started
            tokens, stats = result if isinstance(result, tuple) else (result, {})
            record = {"repeat": repeat, "prompt_id": prompts[index].id, "method": label,
                      "new_tokens": len(tokens), "seconds": seconds, "stats": stats}
            results.write(json.dumps(record) + "\n")
            results.flush()

    report(output, list(runners))
    return 0


def minimum_seconds(function, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - started)
    return best


OVERHEAD_VERIFIERS = {"single": 1, "rrs": 2, "rrs_without_replacement": 2, "greedy": 2,
                      "spechub": 2, "kseq": 2}


def measure_overhead(decoder, draft_model, prompt_ids, repeats: int = 15) -> None:
    """Per tree node: processing + verifier seconds over one 1-token target forward."""
    target = decoder.target
    target.reset()
    target.extend(prompt_ids[:-1])

    def one_token_forward():
        target.extend_tree(prompt_ids[-1:], [target.length - 1]).logits([-1])
        target.commit([])

    forward = minimum_seconds(one_token_forward, repeats)
    target_logits = target.extend_tree(prompt_ids[-1:], [target.length - 1]).logits([-1])
    target.commit([])
    with torch.no_grad():
        draft_logits = draft_model(input_ids=torch.tensor([prompt_ids])).logits[:, -1].float()
    draft_probs = decoder.processing.probs(draft_logits)
    generator = torch.Generator().manual_seed(0)
    print(f"one target forward (1 token): {forward * 1000:.1f} ms")
    for name, num_drafts in OVERHEAD_VERIFIERS.items():
        verifier = get_verifier(name)
        drafts = get_draft_scheme(verifier.scheme).sample_torch(draft_probs, num_drafts, generator)

        def verify_node():
            target_probs = decoder.processing.probs(target_logits)
            verifier.verify_torch(target_probs, draft_probs, drafts, generator)

        node = minimum_seconds(verify_node, repeats)
        print(f"{name:25s} n={num_drafts}: {node * 1000:6.2f} ms per node = {node / forward:6.2%} "
              "of a target forward")


def report(path: Path, labels: list[str]) -> None:
    """Tokens/s per method and its ratios; for our methods also tokens per target call and
    the verification overhead: verify seconds per step over target seconds per call."""
    tokens, seconds = defaultdict(int), defaultdict(float)
    phase = defaultdict(lambda: defaultdict(float))
    for record in map(json.loads, path.open()):
        label = record["method"]
        tokens[label] += record["new_tokens"]
        seconds[label] += record["seconds"]
        stats = record["stats"]
        for key in ("target_calls", "steps"):
            phase[label][key] += stats.get(key, 0)
        for key, value in stats.get("seconds", {}).items():
            phase[label][key] += value
    speed = {label: tokens[label] / seconds[label] for label in labels if seconds[label]}
    assisted = max(speed.get("hf-assisted", 0.0), speed.get("hf-assisted-4", 0.0))
    print(f"{'method':40s} {'tokens':>6s} {'tok/s':>6s} {'/plain':>6s} {'/assisted':>9s} "
          f"{'tok/call':>8s} {'verify/target':>13s}")
    for label in labels:
        if label not in speed:
            continue
        calls = phase[label]["target_calls"]
        per_call = f"{tokens[label] / calls:8.2f}" if calls else f"{'':8s}"
        overhead = (
            f"{(phase[label]['verify'] / phase[label]['steps']) / (phase[label]['target'] / calls):13.2%}"
            if calls else ""
        )
        print(f"{label:40s} {tokens[label]:6d} {speed[label]:6.2f} {speed[label] / speed['hf-plain']:6.2f} "
              f"{speed[label] / assisted if assisted else float('nan'):9.2f} {per_call} {overhead}")


if __name__ == "__main__":
    sys.exit(main())
