"""``specbound run``: decode prompts with several methods side by side on real models.

With no arguments: the embedded default pair (Qwen2.5-Coder 1.5B target, 0.5B draft), four
built-in instructions, temperature 0.7, methods autoregressive, chain and auto (the planner:
``specbound.engine.planner``). Prints a table (tokens/s, speedup over autoregressive, tokens
per target call, the acceptance measured, and beside it the verifier's exact acceptance and
the optimum α* for the same drafts with their gap: means over the verified positions,
``engine.optimum``; for a draft with another tokenizer also p(shared), the target's mass on
the tokens both share, which bounds both: ``engine.vocabulary``), auto's plan with its
predicted and measured tokens/s, writes one JSONL record per (prompt, method) as it
finishes and a PNG plot, and prints the text generated for one prompt. Same seed, same
tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING

from specbound import arguments
from specbound.cli.decoding import (
    add_model_arguments,
    add_sampling_arguments,
    check_known_context,
    check_models,
    check_sampling,
    load_speculator,
)
from specbound.cli.inputs import prompt_set
from specbound.cli.output import format_table, writable_folder
from specbound.engine.method_text import parse_method

if TYPE_CHECKING:
    from specbound.engine import RunStats

DEFAULT_METHODS = "autoregressive,chain,auto"


def parse_methods(args) -> dict[str, tuple[str, dict]]:
    """Label → (name, options) of each entry of ``--methods`` (``decoding.parse_method``'s
    ``NAME:KEY=VALUE`` form; ``--gamma``, ``-n``, ``--depth``, ``--verifier`` and
    ``--epsilon`` fill the options an entry leaves out). Two entries naming the same method
    are refused, and so is a flag given that fills no entry's option (it would be ignored)."""
    from specbound.engine.methods import build_method

    entries = [entry.strip() for entry in args.methods.split(",") if entry.strip()]
    if not entries:
        raise ValueError(f"methods: expected a comma-separated list of methods, got {args.methods!r}")
    defaults = {"gamma": args.gamma, "num_drafts": args.num_drafts, "depth": args.depth, "verifier": args.verifier,
                "epsilon": args.epsilon}
    methods, entry_of, filled = {}, {}, set()
    for entry in entries:
        name, options = parse_method(entry, defaults, option="methods")
        filled |= options.keys() - parse_method(entry, option="methods")[1].keys()
        label = "auto" if name == "auto" else build_method(name, **options).name
        if label in methods:
            raise ValueError(f"methods: {entry_of[label]!r} and {entry!r} name one method ({label}) twice; "
                             "give each once in --methods")
        methods[label], entry_of[label] = (name, options), entry
    for key, value in defaults.items():
        if arguments.given(value) and key not in filled:
            raise ValueError(f"{key}: {METHOD_FLAGS[key]} fills an option that none of --methods {args.methods!r} "
                             f"leaves to it; leave it out, or add a method that takes {key}")
    return methods


METHOD_FLAGS = {"gamma": "--gamma", "num_drafts": "-n/--num-drafts", "depth": "--depth", "verifier": "--verifier",
                "epsilon": "--epsilon"}


def summary_rows(totals: dict[str, RunStats]) -> list[dict]:
    """One row per method over all prompts; speedup is against autoregressive's tokens/s."""
    baseline = totals.get("autoregressive")
    rows = []
    for label, stats in totals.items():
        speedup = (
            stats.tokens_per_second / baseline.tokens_per_second
            if baseline is not None and baseline.tokens_per_second
            else None
        )
        rows.append({
            "method": label,
            "tokens": stats.tokens_generated,
            "tokens_per_second": stats.tokens_per_second,
            "decoding_tokens_per_second": stats.decoding_tokens_per_second,
            "speedup": speedup,
            "tokens_per_target_call": stats.tokens_per_target_call,
            "acceptance": stats.acceptance_rate if stats.attempts_by_position else None,
            "optimum": stats.optimum.summary(),  # the exact acceptance and α* for the same drafts (engine.optimum)
            "seconds": stats.seconds,
        })
    return rows


def run(args: argparse.Namespace) -> int:
    methods = parse_methods(args)
    check_sampling(args, list(methods.values()), option="methods")
    prompts = prompt_set(args.prompts, args.limit, "--prompts")
    if not 0 <= args.show < len(prompts):
        raise ValueError(f"show: prompt index {args.show} outside [0, {len(prompts)})")
    check_models(args)
    check_known_context(args)
    output_dir = writable_folder(args.output_dir, "--output-dir")

    import torch  # after the checks: a bad value is refused before torch loads
    from tqdm import tqdm

    from specbound.api import check_context
    from specbound.engine import RunStats, Sampling
    from specbound.plots.run import plot_run

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    speculator = load_speculator(args)
    pair = speculator.pair
    sampling = Sampling(args.temperature, args.top_k, args.top_p)
    encoded = [pair.encode(prompt.text) for prompt in prompts]
    for prompt, prompt_ids in zip(prompts, encoded):
        check_context(len(prompt_ids), args.max_new_tokens, pair.max_positions, f"prompt {prompt.id}")
    decoders = {label: speculator.decoder_for(sampling, name, options) for label, (name, options) in methods.items()}
    for decoder, plan in decoders.values():  # the first forwards of a model are slow: not timed
        if not plan.adaptive:  # a planner learns from every step: no warm-up for it
            decoder.generate(encoded[0], plan, 4, torch.Generator().manual_seed(args.seed))

    results_path = output_dir / "results.jsonl"
    totals = {label: RunStats() for label in methods}
    texts = {}
    with results_path.open("w") as results, tqdm(
        total=len(prompts) * len(methods), desc="decoding", unit="run", file=sys.stderr
    ) as progress:
        for index, (prompt, prompt_ids) in enumerate(zip(prompts, encoded)):
            for label, (decoder, plan) in decoders.items():
                generator = torch.Generator().manual_seed(args.seed + index)
                generation = decoder.generate(prompt_ids, plan, args.max_new_tokens, generator)
                totals[label] = totals[label].merge(generation.stats)
                text = pair.decode(generation.tokens, skip_special_tokens=True)
                if index == args.show:
                    texts[label] = text
                record = {
                    "prompt_id": prompt.id, "method": label, "tokens": generation.tokens,
                    "text": text, "finish_reason": generation.finish_reason,
                    **generation.stats.to_dict(),
                    "optimum": generation.stats.optimum.summary(),
                }
                results.write(json.dumps(record) + "\n")
                results.flush()
                progress.update(1)

    rows = summary_rows(totals)
    planners = {label: plan for label, (_, plan) in decoders.items() if plan.adaptive}
    for row in rows:
        if row["method"] in planners:
            row["plan"], row["predicted_tokens_per_second"] = planners[row["method"]].summary()
    plot_path = output_dir / "run.png"
    plot_run(rows, plot_path)
    (output_dir / "summary.json").write_text(json.dumps({"options": vars_for_json(args), "methods": rows}, indent=2))
    print(f"{len(prompts)} prompts, up to {args.max_new_tokens} new tokens, temperature "
          f"{args.temperature}, seed {args.seed}, drafter {args.drafter}")
    optimum_keys = ["expected_acceptance", "optimal_acceptance", "acceptance_gap"]
    optimum_headers = ["exact", "optimum α*", "gap"]
    if any((row["optimum"].get("shared_mass") or 1) < 1 for row in rows):  # a draft with another tokenizer
        optimum_keys.append("shared_mass")
        optimum_headers.append("p(shared)")
    print(format_table(
        ["method", "tokens", "tokens/s", "speedup", "tokens/target call", "acceptance", *optimum_headers],
        [[row["method"], row["tokens"], _shown(row["tokens_per_second"], 2), _shown(row["speedup"], 2, "×"),
          _shown(row["tokens_per_target_call"], 2), _shown(row["acceptance"], 3),
          *(_shown(row["optimum"][key], 3) for key in optimum_keys)]
         for row in rows],
    ))
    for row in rows:
        if "plan" in row:
            predicted = row["predicted_tokens_per_second"]
            print(f"\n{row['method']}: plans {row['plan'] or '-'}; predicted "
                  f"{'-' if predicted is None else f'{predicted:.2f}'} tokens/s in decoding, measured "
                  f"{row['decoding_tokens_per_second']:.2f} in decoding "
                  f"({row['tokens_per_second']:.2f} with each prompt's prefill)")
    print(f"\nresults: {results_path}\nplot: {plot_path}\n")
    print(f"prompt {prompts[args.show].id}: {prompts[args.show].text}")
    for label, text in texts.items():
        print(f"\n--- {label} ---\n{text}")
    return 0


def vars_for_json(args: argparse.Namespace) -> dict:
    return {key: value for key, value in vars(args).items() if key != "handler"}


def register(subparsers) -> None:
    subparsers.add_parser(
        "run",
        help="decode prompts on real models with several methods side by side",
        description="Speculative decoding on real models: autoregressive, chain and auto "
        "(by default) on the embedded Qwen2.5-Coder pair, with a speed table and a plot.",
    )
    subparsers.choices.defer("run", _add_options)


def _add_options(parser) -> None:
    """``run``'s options, which name the engine's methods (their registry imports the verifiers:
    numba and scipy)."""
    from specbound.engine.methods import METHODS

    add_model_arguments(parser)
    data = parser.add_argument_group("prompts")
    data.add_argument("--prompts", default="instructions",
                      help="built-in set (instructions, summarize, translate_de_en, humaneval) "
                      "or a .jsonl/.txt file")
    data.add_argument("--limit", type=arguments.positive_int, default=4, help="number of prompts (default 4)")
    data.add_argument("--show", type=arguments.non_negative_int, default=0, help="print the texts of this prompt")
    decoding = parser.add_argument_group("decoding")
    decoding.add_argument("--methods", default=DEFAULT_METHODS,
                          help=f"comma-separated, from auto (the planner), {', '.join(METHODS)}, each with its "
                          "options as in generate --method: 'chain:gamma=5,sparse:budget=12:width=2' "
                          f"(default {DEFAULT_METHODS}); the flags below fill the options an entry leaves out")
    decoding.add_argument("--verifier", default=None,
                          help="multi-draft verifier of the tree method (default rrs_without_replacement)")
    decoding.add_argument("-n", "--num-drafts", type=arguments.positive_int, default=arguments.default(2),
                          help="drafts per node (tree, batch)")
    decoding.add_argument("--depth", type=arguments.positive_int, default=arguments.default(2), help="tree depth")
    decoding.add_argument("--gamma", type=arguments.positive_int, default=arguments.default(3),
                          help="lookahead of chain, batch, decoding_*")
    decoding.add_argument("--epsilon", type=arguments.number(0.0), default=None,
                          help="ε of decoding_opt/uno (default 0.1)")
    add_sampling_arguments(parser, max_new_tokens=64)
    parser.add_argument("--output-dir", type=arguments.folder, default="specbound-run", help="where results go")
    parser.add_argument("--threads", type=arguments.integer(1, os.cpu_count() or 1), default=None,
                        help="torch CPU threads (at most the CPU count)")
    parser.set_defaults(handler=run)


def _shown(value, decimals: int, unit: str = "") -> str | None:
    """A measured figure as the table shows it (the JSON keeps every digit); None stays None."""
    return None if value is None else f"{value:.{decimals}f}{unit}"
