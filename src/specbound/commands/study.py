"""``specbound study acceptance|rejections|bias``: rerun the papers' experiments on a real
model pair (SPEC §5; see ``specbound.studies``).

Each run writes ``<out>/<study>/<dataset>/`` (settings, append-only per-position records,
timings) and resumes there when interrupted; ``specbound report <out>`` renders every study
found below ``<out>``. A progress bar with an ETA goes to stderr; the summary table to
stdout.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from specbound.commands.output import format_table
from specbound.datasets import DATASETS, load_prompts
from specbound.studies import tables
from specbound.studies.acceptance import DEFAULT_TAIL_BUDGET, METHODS, AcceptanceStudy
from specbound.studies.bias import BIASED_METHODS, BiasStudy
from specbound.studies.pair import load_pair
from specbound.studies.rejections import RejectionsStudy
from specbound.studies.runner import run_study

DEFAULT_OUT = Path("specbound-results")
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def _list(kind):
    def parse(text: str) -> list:
        try:
            return [kind(value) for value in text.split(",") if value.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}") from None

    return parse


def _lookahead(text: str):
    """'inf' (K = ∞, to the horizon) or a positive integer γ."""
    if text.strip().lower() in ("inf", "∞"):
        return None
    return int(text)


def _names(choices):
    def parse(text: str) -> list[str]:
        names = [name.strip() for name in text.split(",") if name.strip()]
        unknown = [name for name in names if name not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown)}; choose from {', '.join(choices)}")
        return names

    return parse


def build_study(args):
    options = {"temperatures": args.temperature, "max_new_tokens": args.max_new_tokens,
               "top_k": args.top_k, "top_p": args.top_p}
    if args.study == "acceptance":
        return AcceptanceStudy(num_drafts=args.num_drafts, methods=args.methods, generation_gamma=args.gamma,
                               tail_budget=args.tail_budget, workers=args.workers, **options)
    if args.study == "rejections":
        return RejectionsStudy(lookaheads=args.lookaheads, batch_sizes=args.batch_sizes,
                               batch_lookahead=args.batch_lookahead, **options)
    return BiasStudy(epsilons=args.epsilons, methods=args.methods, gamma=args.gamma, **options)


def summary_tables(results) -> list[tuple[str, tuple]]:
    study = results.settings["study"]
    if study == "acceptance":
        named = [("exact acceptance per token (± s.e. over prompts)", tables.acceptance_table([results])),
                 ("gap to the optimum α* − α", tables.gap_table(results))]
        for by in ("temperature", "num_drafts"):
            key = "temperatures" if by == "temperature" else "num_drafts"
            if len(results.settings[key]) > 1:
                named.append((f"acceptance vs {by}", tables.ablation_table(results, by)))
        return named
    if study == "rejections":
        return [("rejections per sequence: measured vs predicted (± s.e. over prompts)",
                 tables.rejections_table(results))]
    return [("Decoding-OPT vs Decoding-UNO: exact per-token bias and rejection, measured speed",
             tables.bias_table(results))]


def run(args: argparse.Namespace) -> int:
    study = build_study(args)  # checks the settings before any model is loaded
    prompt_sets = [load_prompts(name, args.limit) for name in args.dataset]
    pair = load_pair(args.target, args.draft, DTYPES[args.dtype], progress=not args.quiet,
                     float32_twins=False if args.no_twins else None)
    for prompts in prompt_sets:
        dataset = prompts[0].dataset
        directory = Path(args.out) / study.name / dataset
        results = run_study(study, pair, prompts, directory, dataset, seed=args.seed, progress=not args.quiet)
        print(f"{study.name} study, dataset {dataset}: {len(results.runs)} runs, "
              f"{results.total_seconds / 60:.1f} min; results in {directory}")
        for title, (headers, rows) in summary_tables(results):
            print(f"\n{title}")
            print(format_table(headers, rows))
        print()
    print(f"report: specbound report {args.out}", file=sys.stderr)
    return 0


def _common(parser) -> None:
    parser.add_argument("--dataset", type=_list(str), default=["humaneval"],
                        help=f"prompt sets, comma-separated: {', '.join(DATASETS)} or a JSONL/text file "
                        "(default humaneval)")
    parser.add_argument("--temperature", type=_list(float), default=[0.7],
                        help="temperatures, comma-separated (default 0.7; ablation: 0.1,0.4,0.7,1.0)")
    parser.add_argument("--limit", type=int, help="only the first LIMIT prompts of each set")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="tokens per generation (default 128)")
    parser.add_argument("--top-k", type=int, help="top-k, applied to target and draft alike")
    parser.add_argument("--top-p", type=float, help="top-p, applied to target and draft alike")
    parser.add_argument("--seed", type=int, default=0, help="seed of every unit's generator (default 0)")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help=f"results folder (default {DEFAULT_OUT})")
    parser.add_argument("--target", default="default-target",
                        help="target model: embedded name, .gguf file or HF folder (default default-target)")
    parser.add_argument("--draft", default="default-draft", help="draft model (default default-draft)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16", help="model dtype (bfloat16)")
    parser.add_argument("--no-twins", action="store_true",
                        help="no float32 copies of bf16 models for prefill and scoring (saves ~8 GB, slower on CPU)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "study",
        help="rerun the papers' experiments on a real model pair",
        description="Exact acceptance of every method against the optimum (acceptance), Yin's predicted vs "
        "the engine's measured rejections (rejections), Decoding-OPT vs UNO bias and speed (bias).",
    )
    studies = parser.add_subparsers(dest="study", required=True, metavar="STUDY")
    acceptance = studies.add_parser("acceptance", help="exact per-position acceptance of every method and α* [HU]")
    _common(acceptance)
    acceptance.add_argument("--num-drafts", type=_list(int), default=[3],
                            help="numbers of drafts n, comma-separated (default 3; ablation: 2,3,4,6)")
    acceptance.add_argument("--methods", type=_names(METHODS), default=list(METHODS),
                            help=f"methods, comma-separated (default all: {', '.join(METHODS)})")
    acceptance.add_argument("--gamma", type=int, default=0,
                            help="lookahead of the lossless chain that generates the text; 0 = autoregressive "
                            "(default 0: fastest on CPUs without bf16 units)")
    acceptance.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1),
                            help="processes for the exact computations (default: 2, or 1 on one core)")
    acceptance.add_argument("--tail-budget", type=float, default=DEFAULT_TAIL_BUDGET,
                            help=f"drop each row's least likely tokens before the exact computations while the "
                            f"bound on the move of the acceptances (proven for α*, tested for the verifiers) stays below this "
                            f"(default {DEFAULT_TAIL_BUDGET:g}, recorded per position; 0 = exact)")
    rejections = studies.add_parser("rejections", help="predicted vs measured rejections along real text [YIN]")
    _common(rejections)
    rejections.add_argument("--lookaheads", type=_list(_lookahead), default=[None, 2, 4, 8],
                            help="single-draft lookaheads γ, 'inf' = to the horizon (default inf,2,4,8)")
    rejections.add_argument("--batch-sizes", type=_list(int), default=[1, 2, 4, 8],
                            help="batch SD draft counts M (default 1,2,4,8)")
    rejections.add_argument("--batch-lookahead", type=_lookahead, default=None,
                            help="lookahead of the batch runs (default inf, the paper's K = ∞; costly)")
    bias = studies.add_parser("bias", help="Decoding-OPT vs Decoding-UNO: exact bias, rejection, speed [YIN]")
    _common(bias)
    bias.add_argument("--epsilons", type=_list(float), default=[0.1, 0.2, 0.4, 0.8],
                      help="ε values (default 0.1,0.2,0.4,0.8)")
    bias.add_argument("--methods", type=_names(BIASED_METHODS), default=list(BIASED_METHODS),
                      help="biased methods (default decoding_opt,decoding_uno)")
    bias.add_argument("--gamma", type=int, default=4, help="lookahead γ of every chain (default 4)")
    parser.set_defaults(handler=run)
