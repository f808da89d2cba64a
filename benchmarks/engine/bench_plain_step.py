"""Our plain decoding against transformers' ``generate`` on one prompt, in alternating rounds.

The end-to-end benchmark (``bench_engine``) compares whole prompts, and on a shared
2-core machine one prompt's ratio moves by ±10% with the load. This one isolates the plain
decoding loop: the same prompt, the same number of tokens (``min_new_tokens`` for
transformers, no EOS stop for ours), sampling at T, rounds alternating which goes first, and
reports each round's ratio ours / transformers, their median and mean, and the share of our
decoding time spent outside the model. Writes the rounds and settings to ``--output`` (a
``benchmarks.record`` envelope).

    python -m benchmarks.engine.bench_plain_step --rounds 8 --max-new-tokens 48
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from benchmarks import record
from specbound.datasets import load_prompts
from specbound.engine import Processing, build_method
from specbound.engine.assembly import assemble
from specbound.models.pair import load_pair


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", default="humaneval")
    parser.add_argument("--prompt-index", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--threads", type=int, default=2)
    record.add_output(parser, "engine/plain_step.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pair = load_pair("default-target", None, float32_twins=False, progress=False)
    decoder = assemble(pair, Processing(args.temperature, vocab_size=pair.vocab_size), build_method("autoregressive"),
                       stop_at_eos=False).decoder
    method = build_method("autoregressive")
    prompt = pair.encode(load_prompts(args.prompts, limit=args.prompt_index + 1)[args.prompt_index].text)
    stop = sorted(pair.eos_token_ids)

    def transformers_speed() -> float:
        torch.manual_seed(0)
        inputs = torch.tensor([prompt])
        started = time.perf_counter()
        output = pair.target.generate(inputs, attention_mask=torch.ones_like(inputs), do_sample=True,
                                      temperature=args.temperature, top_k=None, top_p=None,
                                      max_new_tokens=args.max_new_tokens, min_new_tokens=args.max_new_tokens,
                                      eos_token_id=stop, pad_token_id=stop[0])
        return (output.shape[1] - len(prompt)) / (time.perf_counter() - started)

    def our_speed() -> tuple[float, float]:
        started = time.perf_counter()
        generation = decoder.generate(prompt, method, args.max_new_tokens, torch.Generator().manual_seed(0))
        return len(generation.tokens) / (time.perf_counter() - started), generation.stats.outside_models

    transformers_speed(), our_speed()  # warm-up
    rounds = []
    for index in range(args.rounds):
        if index % 2:
            theirs = transformers_speed()
            ours, outside = our_speed()
        else:
            ours, outside = our_speed()
            theirs = transformers_speed()
        rounds.append({"transformers": theirs, "ours": ours, "ratio": ours / theirs, "outside_models": outside})
        print(f"round {index + 1}: transformers {theirs:.2f} tokens/s, ours {ours:.2f} ({ours / theirs:.3f}), "
              f"outside the model {outside:.1%}", file=sys.stderr)
    ratios = [row["ratio"] for row in rounds]
    result = {"rounds": rounds, "median_ratio": statistics.median(ratios), "mean_ratio": statistics.mean(ratios),
              "settings": vars(args)}
    record.write(args.output, result)
    print(f"{record.machine()['cpu_model']}, {args.threads} threads: ours / transformers generate, median "
          f"{result['median_ratio']:.3f}, mean {result['mean_ratio']:.3f} over {args.rounds} rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
