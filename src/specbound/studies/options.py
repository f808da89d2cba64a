"""Every study's name, help, report position, record fields, command-line options and
presets, in a module that imports neither torch nor the engine's registries: ``specbound
study`` builds its whole parser from ``STUDY_OPTIONS`` and refuses an unknown study, a bad
option or preset in a moment — a size beyond the drafted tokens one target call verifies
(``engine.drafted``) as its option is parsed, settings that span options by the entry's
``check`` (``sizes``) — and ``records`` checks a study's files by its fields, before the
studies (``base.STUDIES``, whose modules import torch) load. ``base.register_study`` gives each
study class its entry's ``help``, ``order``, ``record_fields``, ``presets`` and
``add_arguments``; what the options build (``Study.from_arguments``) stays with the class.

The method names below are the registries' (``acceptance_methods.acceptance_methods``,
the verifiers that are not lossless), spelled out so that reading them imports no
registry; ``tests/studies/test_study_command.py`` checks that they agree.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from specbound import arguments
from specbound.engine.drafted import check_drafted
from specbound.studies.fields import (GENERATION_FIELDS, GENERATION_SETTINGS, INTEGER, MAPPING, NUMBER, TEXT,
                                      RecordFields, list_of, mapping_of, optional)
from specbound.studies.sizes import check_some_configuration, drafted_lookahead

# The acceptance study's methods: α* of every draft scheme, then the scalable lossless verifiers.
ACCEPTANCE_METHODS = ("optimal_with_replacement", "optimal_without_replacement", "optimal_greedy",
                      "optimal_spechub", "single", "rrs", "rrs_without_replacement", "kseq", "greedy", "spechub",
                      "global_resolution")
BIASED_METHODS = ("decoding_opt", "decoding_uno")  # the verifiers that trade bias for speed
DEFAULT_TAIL_BUDGET = 1e-6
LARGEST_TAIL_BUDGET = 1e-3
DEFAULT_OPTIMUM_LIMIT = 1_000_000  # LP entries per step: chains γ ≤ 3 and trees n×1 on a 6-token vocabulary
DECIDERS = ("multistep", "tokenwise")
# Hu et al.'s tasks (Alpaca, CNN/DailyMail, WMT'14 De-En, MT-Bench) as far as prompt sets exist here:
# the authored stand-ins for the first three, the real MT-Bench and MMLU sets, and the edit set
HU2025_DATASETS = ("instructions", "summarize", "translate_de_en", "mt_bench", "mmlu", "edit")
DRAFTERS = ("model", "suffix")  # who drafts in the acceptance study: the draft model, or suffix decoding



# What each study's records and settings hold (checked as they are read: ``records``).
ACCEPTANCE_FIELDS = RecordFields(
    position={"prompt_id": TEXT, "temperature": NUMBER, "num_drafts": INTEGER, "position": INTEGER,
              "token": INTEGER, "acceptance": mapping_of(NUMBER), "tail_mass": list_of(NUMBER),
              "tail_bound": NUMBER},
    run={"prompt_id": TEXT, "temperature": NUMBER, "unavailable": MAPPING, **GENERATION_FIELDS},
    key=("num_drafts", "position"),
    settings={**GENERATION_SETTINGS, "num_drafts": list_of(INTEGER), "methods": list_of(TEXT),
              "tail_budget": NUMBER},
)

REJECTIONS_FIELDS = RecordFields(
    position={"prompt_id": TEXT, "temperature": NUMBER, "config": TEXT, "position": INTEGER, "token": INTEGER,
              "total_variation": NUMBER, "expected_rejection": NUMBER, "round_start": NUMBER},
    run={"prompt_id": TEXT, "temperature": NUMBER, "config": TEXT, "num_drafts": INTEGER,
         "lookahead": optional(INTEGER), "horizon": INTEGER, "measured": mapping_of(NUMBER),
         "predicted": mapping_of(NUMBER), "theorem_rejections": NUMBER, "sum_total_variation": NUMBER,
         **GENERATION_FIELDS},
    key=("position",),
    settings={**GENERATION_SETTINGS, "configs": list_of(TEXT)},
)

BIAS_FIELDS = RecordFields(
    position={"prompt_id": TEXT, "temperature": NUMBER, "config": TEXT, "position": INTEGER, "token": INTEGER,
              "total_variation": NUMBER, "points": list_of(MAPPING)},
    run={"prompt_id": TEXT, "temperature": NUMBER, "config": TEXT, "method": TEXT, "epsilon": NUMBER,
         **GENERATION_FIELDS},
    key=("position",),
    settings={**GENERATION_SETTINGS, "epsilons": list_of(NUMBER), "methods": list_of(TEXT), "gamma": INTEGER},
)

MULTISTEP_FIELDS = RecordFields(
    position={"prompt_id": TEXT, "temperature": NUMBER, "config": TEXT, "step": INTEGER, "depth": INTEGER,
              "tree_size": INTEGER, "accepted": INTEGER, "expected": mapping_of(NUMBER),
              "ladder": optional(mapping_of(NUMBER))},
    run={"prompt_id": TEXT, "temperature": NUMBER, "config": TEXT, "family": TEXT, "size": INTEGER,
         "depth": INTEGER, "decide": TEXT, "verifiers": mapping_of(TEXT), "decided_by": TEXT, "optimum": TEXT,
         **GENERATION_FIELDS},
    key=("step",),
    settings={**GENERATION_SETTINGS, "configs": list_of(TEXT), "decide": TEXT, "optimum_limit": INTEGER},
)


@dataclass(frozen=True)
class StudyPreset:
    """Named settings of a study run (``specbound study NAME --preset PRESET``): option
    dest -> value; an option given explicitly wins over its preset value."""

    help: str
    settings: dict


@dataclass(frozen=True)
class StudyOptions:
    """What ``specbound study NAME`` and ``specbound report`` know of a study before it
    loads: its one-line help, its position in the report, what its records hold, its own
    options (``add_arguments(parser)``), its presets (name -> ``StudyPreset``) and the check
    of its settings that span options (``check(args)``, raising ValueError)."""

    name: str
    help: str
    order: int
    record_fields: RecordFields
    add_arguments: Callable[[argparse.ArgumentParser], None]
    presets: dict = field(default_factory=dict)
    check: Callable[[argparse.Namespace], None] = lambda args: None


HU2025 = StudyPreset(
    help=f"Hu et al. (ICLR 2025)'s acceptance table: up to 1024 prompts per task (--limit 1024) x 128 tokens "
    f"(--max-new-tokens 128) on every available task of {','.join(HU2025_DATASETS)} (--dataset; sets whose package "
    "is not installed are left out, with the command that installs them), --num-drafts 2,3,4,6, every method, "
    "--temperature 0.7",
    settings={"dataset": list(HU2025_DATASETS), "limit": 1024, "max_new_tokens": 128, "temperature": [0.7],
              "num_drafts": [2, 3, 4, 6], "methods": list(ACCEPTANCE_METHODS)},
)


def acceptance_arguments(parser: argparse.ArgumentParser) -> None:
    methods = list(ACCEPTANCE_METHODS)
    parser.add_argument("--num-drafts", type=arguments.comma_list(arguments.positive_int),
                        default=arguments.default([3]),
                        help="numbers of drafts n, comma-separated (default 3; ablation: 2,3,4,6)")
    parser.add_argument("--methods", type=arguments.names(methods), default=arguments.default(methods),
                        help=f"methods, comma-separated (default all: {', '.join(methods)})")
    parser.add_argument("--gamma", type=_drafted(arguments.non_negative_int, "chain", "gamma"),
                        default=arguments.default(0),
                        help="lookahead of the lossless chain that generates the text; 0 = autoregressive "
                        "(default 0)")
    parser.add_argument("--workers", type=arguments.integer(1, os.cpu_count() or 1),
                        default=arguments.default(min(2, os.cpu_count() or 1)),
                        help="processes for the exact computations (default: 2, or 1 on one core)")
    parser.add_argument("--tail-budget", type=arguments.number(0.0, LARGEST_TAIL_BUDGET),
                        default=arguments.default(DEFAULT_TAIL_BUDGET),
                        help="drop each row's least likely tokens before the exact computations while the "
                        "bound on the move of the acceptances (proven for α*, tested for the verifiers) stays "
                        f"below this (default {DEFAULT_TAIL_BUDGET:g}, recorded per position; 0 = exact)")
    parser.add_argument("--drafter", choices=DRAFTERS, default="model",
                        help="who drafts: the draft model (default) or suffix decoding, which loads none: the exact "
                        "acceptance p(S) of its drafts S at every position (S a fixed set: also α*) beside its "
                        "chain's, and the tokens per target call of its tree and chain replayed on each text; its "
                        "history of earlier outputs spans the prompts, in unit order. The draft model's options, "
                        "--preset and --ray are refused with it (docs/studies.md)")
    parser.add_argument("--suffix-tree", type=_drafted(_positives("/", 4, "16/8/4/3"), "sparse", "budget", "depth"),
                        default=arguments.default([16, 8, 4, 3]),
                        help="with --drafter suffix: the tree BUDGET/DEPTH/WIDTH/CHILDREN (nodes, levels, nodes a "
                        "level, children a node) against its chain of DEPTH (default 16/8/4/3)")


# What ``--drafter suffix`` leaves unused or cannot do: option -> why.
SUFFIX_REFUSES = {  # --preset first: it sets --num-drafts and --methods
    "--preset": "sets the draft model's methods, which --drafter suffix does not run",
    "--draft": "chooses the draft model, which --drafter suffix does not load (it drafts from the text)",
    "--num-drafts": "sets the draft model's methods, which --drafter suffix does not run",
    "--methods": "chooses the draft model's methods, which --drafter suffix does not run",
    "--gamma": "generates the text with the draft model, which --drafter suffix does not load",
    "--tail-budget": "cuts the draft model's rows; --drafter suffix reads whole target rows",
    "--workers": "spreads the draft model's exact part, which --drafter suffix does not run",
    "--ray": "spreads units over workers, while --drafter suffix drafts from every earlier unit's output, "
             "kept in one process",
}


def apply_drafter(args: argparse.Namespace) -> None:
    """With ``--drafter suffix``: refuse, before anything loads, an option given that it
    leaves unused or cannot honour (``SUFFIX_REFUSES``), then ask for no draft model
    (``args.draft`` None). Without it, refuse ``--suffix-tree``, which only it reads."""
    if getattr(args, "drafter", "model") != "suffix":
        if arguments.given(getattr(args, "suffix_tree", None)):
            raise ValueError("suffix_tree: --suffix-tree shapes suffix decoding's tree; give --drafter suffix "
                             "or leave --suffix-tree out")
        return
    for flag, why in SUFFIX_REFUSES.items():
        dest = flag.removeprefix("--").replace("-", "_")
        if arguments.given(getattr(args, dest, None)):
            raise ValueError(f"{dest}: {flag} {why}; leave {flag} out or use --drafter model")
    args.draft = None


def rejections_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lookaheads", type=arguments.comma_list(arguments.lookahead), default=[None, 2, 4, 8],
                        help="single-draft lookaheads γ, 'inf' = to the horizon (default inf,2,4,8)")
    parser.add_argument("--batch-sizes", type=arguments.comma_list(arguments.positive_int), default=[1, 2, 4, 8],
                        help="batch SD draft counts M (default 1,2,4,8)")
    parser.add_argument("--batch-lookahead", type=arguments.lookahead, default=None,
                        help="lookahead of the batch runs (default inf, the paper's K = ∞; costly)")


def bias_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--epsilons", type=arguments.comma_list(arguments.number(0.0)), default=[0.1, 0.2, 0.4, 0.8],
                        help="ε values (default 0.1,0.2,0.4,0.8)")
    parser.add_argument("--methods", type=arguments.names(BIASED_METHODS), default=list(BIASED_METHODS),
                        help="biased methods (default decoding_opt,decoding_uno)")
    parser.add_argument("--gamma", type=_drafted(arguments.positive_int, "chain", "gamma"), default=4,
                        help="lookahead γ of every chain (default 4)")


def multistep_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gammas", type=_option_list(_drafted(_positive, "chain", "gamma"), "2,4"), default=[2, 4],
                        help="chain lookaheads γ (default 2,4; 'none': no chains)")
    parser.add_argument("--trees", type=_option_list(_drafted(_pair_of_positives("x"), "tree", "num_drafts", "depth"),
                                                     "2x2,3x3"),
                        default=[(2, 2), (3, 3)],
                        help="trees NxD: N drafts per node (without replacement), D levels "
                        "(default 2x2,3x3; 'none': no trees)")
    parser.add_argument("--iid-trees", default=[],
                        type=_option_list(_drafted(_pair_of_positives("x"), "tree", "num_drafts", "depth"), "2x2"),
                        help="trees NxD drafted i.i.d. (with replacement), decided by UniVer with Global "
                        "Resolution plans; token-wise RRS and traversal on the same trees (default none)")
    parser.add_argument("--sparse", type=_option_list(_drafted(_pair_of_positives("/"), "sparse", "budget", "depth"),
                                                      "8/4"), default=[],
                        help="budgeted sparse trees BUDGET/DEPTH (width 4, at most 4 children a node; "
                        "default none)")
    parser.add_argument("--decide", choices=DECIDERS, default="multistep",
                        help="the verifier whose decisions the engine follows: block/traversal (multistep, "
                        "default) or token-wise")
    parser.add_argument("--optimum-limit", type=_entries, default=DEFAULT_OPTIMUM_LIMIT,
                        help="largest LP of the multi-step optimum, in entries per step "
                        f"(default {DEFAULT_OPTIMUM_LIMIT:,}: tiny vocabularies only; 0: never)")


def multistep_check(args: argparse.Namespace) -> None:
    check_some_configuration(args.gammas, args.trees, args.sparse, args.iid_trees)


def rejections_check(args: argparse.Namespace) -> None:
    """Every chain's and batch's lookahead over the horizon (--max-new-tokens), as the study
    builds its configurations (``rejections.decoding_configs``)."""
    for num_drafts, lookahead in ([(1, lookahead) for lookahead in args.lookaheads]
                                  + [(size, args.batch_lookahead) for size in args.batch_sizes]):
        drafted_lookahead(num_drafts, lookahead, args.max_new_tokens)


def _drafted(parse, method: str, *sizes: str):
    """``parse``, then the engine's limit on the drafted tokens one target call verifies
    (``engine.drafted.check_drafted``) for ``method`` at the sizes it read (named ``sizes``,
    in order): a value beyond it is refused as the option is parsed."""
    def parse_within_limit(text: str):
        value = parse(text)
        if value is not None:
            try:
                check_drafted(method, **dict(zip(sizes, value if isinstance(value, tuple) else (value,))))
            except ValueError as error:
                raise argparse.ArgumentTypeError(str(error)) from None
        return value

    return parse_within_limit


def _option_list(parse_item, example: str):
    """A comma-separated option value, each item by ``parse_item`` (None: refused); 'none' -> []."""
    def parse(text: str) -> list:
        if text.strip().lower() == "none":
            return []
        values = []
        for item in (value.strip() for value in text.split(",") if value.strip()):
            value = parse_item(item)
            if value is None:
                raise argparse.ArgumentTypeError(f"expected a comma-separated list like {example!r} or 'none', "
                                                 f"got {item!r}")
            values.append(value)
        if not values:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list like {example!r} or 'none'")
        return values

    return parse


def _positive(text: str) -> int | None:
    return int(text) if text.isdigit() and int(text) > 0 else None


def _entries(text: str) -> int:
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"expected a non-negative integer (LP entries), got {text!r}")
    return int(text)


def _positives(separator: str, count: int, example: str):
    """``count`` positive integers joined by ``separator`` (a tuple), refused naming ``example``."""
    def parse(text: str) -> tuple[int, ...]:
        parts = [_positive(part.strip()) for part in text.split(separator)]
        if len(parts) != count or None in parts:
            raise argparse.ArgumentTypeError(f"expected {count} positive integers like {example!r}, got {text!r}")
        return tuple(parts)

    return parse


def _pair_of_positives(separator: str):
    def parse(text: str) -> tuple[int, int] | None:
        parts = [_positive(part.strip()) for part in text.replace("×", "x").split(separator)]
        return tuple(parts) if len(parts) == 2 and None not in parts else None

    return parse


STUDY_OPTIONS: dict[str, StudyOptions] = {options.name: options for options in (
    StudyOptions("acceptance", "exact per-position acceptance of every method and α* [HU]", 0, ACCEPTANCE_FIELDS,
                 acceptance_arguments, {"hu2025": HU2025}),
    StudyOptions("bias", "Decoding-OPT vs Decoding-UNO: exact bias, rejection, speed [YIN]", 2, BIAS_FIELDS,
                 bias_arguments),
    StudyOptions("multistep", "token-wise vs block vs traversal verification on the same drafted steps, and the "
                 "multi-step optimum", 3, MULTISTEP_FIELDS, multistep_arguments, check=multistep_check),
    StudyOptions("rejections", "predicted vs measured rejections along real text [YIN]", 1, REJECTIONS_FIELDS,
                 rejections_arguments, check=rejections_check),
)}
