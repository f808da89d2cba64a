"""``specbound study NAME``: rerun one of the papers' experiments on a real model pair
(SPEC.md §5); one subcommand per study (``specbound.studies.options.STUDY_OPTIONS``: its
options and presets, read without torch, so every refusal of an option, a model that is
none, a held results folder or an unreachable ``--ray`` comes before the studies and their
models load, and none of them leaves a results folder behind).

Each run writes ``<out>/<study>/<dataset>/`` (settings, append-only per-position records,
timings) and resumes there when interrupted; ``specbound report <out>`` renders every study
found below ``<out>``. A progress bar with an ETA goes to stderr; the summary tables to
stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import re
import sys
from pathlib import Path

from specbound import arguments
from specbound.checks import positive_int
from specbound.cli.decoding import MAX_NEW_TOKENS
from specbound.cli.inputs import check_model_sources, check_study_settings, prompt_set
from specbound.cli.output import format_table, writable_folder
from specbound.datasets import DATASETS
from specbound.engine.backends import CHOICES as BACKENDS
from specbound.models import DTYPES
from specbound.models.backends import resolve_backend
from specbound.studies.cluster import check_reachable, import_ray
from specbound.studies.options import STUDY_OPTIONS, apply_drafter
from specbound.studies.records import check_free

DEFAULT_OUT = Path("specbound-results")
LOCAL_RAY = "local"  # --ray without an address: ray.init's name for a new Ray instance on this machine
RAY_ADDRESS = re.compile(r"(ray://)?(\[[0-9A-Fa-f:]+\]|[\w.-]+):(\d{1,5})")


def run(args: argparse.Namespace) -> int:
    preset_datasets = apply_preset(args)
    STUDY_OPTIONS[args.study].check(args)  # settings that span options (studies.sizes), before anything loads
    apply_drafter(args)  # --drafter suffix: no draft model, and the options it leaves unused refused
    check_model_sources({"target": args.target, "draft": args.draft})
    prompt_sets = [prompt_set(name, args.limit, "--dataset") for name in args.dataset if name not in preset_datasets
                   or _available(name)]
    if args.batch_size is not None:
        positive_int("--batch-size", args.batch_size)
    writable_folder(args.out, "--out", keep=False)  # made by the study's writers, once every check has passed
    for prompts in prompt_sets:
        directory = Path(args.out) / args.study / prompts[0].dataset
        check_study_settings(directory, "out")
        check_free(directory)  # another run's folder is refused now; StudyWriter takes the lock below
    if args.ray is not None:
        import_ray()
        check_reachable(args.ray, "--ray")
    import torch  # the studies and the engine, after every check of the options above

    from specbound.models.pair import load_pair
    from specbound.studies import STUDIES
    from specbound.studies.distributed import RayWorkers
    from specbound.studies.records import read_results
    from specbound.studies.runner import StudyWriter, machine_batch_size, run_pending

    generation = {"temperatures": args.temperature, "max_new_tokens": args.max_new_tokens,
                  "top_k": args.top_k, "top_p": args.top_p}
    study = STUDIES[args.study].from_arguments(args, generation)  # checks the settings before any model loads
    backend = resolve_backend(args.backend, [args.target, args.draft])
    pair_spec = functools.partial(load_pair, args.target, args.draft, getattr(torch, args.dtype),
                                  progress=not args.quiet and args.ray is None,
                                  float32_twins=False if args.no_twins or not backend.float32_twins else None,
                                  backend=backend.name)
    with contextlib.ExitStack() as stack:
        writers = [stack.enter_context(StudyWriter(study, prompts, Path(args.out) / study.name / prompts[0].dataset,
                                                   prompts[0].dataset, args.seed, not args.quiet))
                   for prompts in prompt_sets]  # every folder locked and its records checked before a model loads
        if all(writer.finished(asked_models(args, backend)) for writer in writers):
            print("nothing left to do: every unit is written already", file=sys.stderr)
            outcomes = (read_results(writer.directory) for writer in writers)
        else:
            if args.ray is None:
                pair = pair_spec()
                run_one = functools.partial(run_pending, study, pair)
                measure, where = functools.partial(machine_batch_size, pair), "this machine"
            else:  # each Ray worker loads the pair, once for every dataset
                workers = stack.enter_context(RayWorkers(pair_spec, address=args.ray))
                run_one = functools.partial(workers.run_pending, study)
                measure, where = workers.batch_size, "a worker"
            batch_size = args.batch_size or measure()
            print(f"batch size {batch_size} ({'--batch-size' if args.batch_size else f'measured on {where}'})",
                  file=sys.stderr)
            outcomes = (run_one(writer, batch_size=batch_size) for writer in writers)  # each printed as it ends
        for writer, results in zip(writers, outcomes):
            print(f"{study.name} study, dataset {results.settings['dataset']}: {len(results.runs)} runs, "
                  f"{results.total_seconds / 60:.1f} min; results in {writer.directory}")
            for title, (headers, rows) in study.summary_tables(results):
                print(f"\n{title}")
                print(format_table(headers, rows))
            print()
    print(f"report: specbound report {args.out}", file=sys.stderr)
    return 0


def asked_models(args: argparse.Namespace, backend) -> dict:
    """What the options say of the pair's description (``ModelPair.description``) before it
    loads: its sources and what ``backend`` records of its settings
    (``Backend.settings_description``: the dtype and float32 twins on torch)."""
    return {"target": args.target, "draft": args.draft,
            **backend.settings_description(args.dtype, not args.no_twins and args.dtype == "bfloat16")}


class Unset:
    """The default of an option a preset sets, while the command line has not given it."""

    def __init__(self, value):
        self.value = value

    def __repr__(self) -> str:
        return repr(self.value)


def apply_preset(args: argparse.Namespace) -> list[str]:
    """Replace every option left at its default by the value of ``--preset`` (or by the
    default without one); options given explicitly stay. Returns the prompt sets the
    preset chose (the ones its study leaves out when their package is missing)."""
    preset = STUDY_OPTIONS[args.study].presets[args.preset] if getattr(args, "preset", None) else None
    chosen = []
    for dest, value in vars(args).items():
        if isinstance(value, Unset):
            use_preset = preset is not None and dest in preset.settings
            setattr(args, dest, preset.settings[dest] if use_preset else value.value)
            chosen += list(preset.settings[dest]) if use_preset and dest == "dataset" else []
    return chosen


def _available(dataset: str) -> bool:
    """Whether a preset's prompt set can be read here; if not, say why on stderr."""
    try:
        prompt_set(dataset, 1, "--dataset")
    except ValueError as error:
        print(f"preset: leaving out {error}", file=sys.stderr)
        return False
    return True


def ray_address(text: str) -> str:
    """A Ray address as ``ray.init`` takes it: local, auto, HOST:PORT or ray://HOST:PORT."""
    match = RAY_ADDRESS.fullmatch(text)
    if text in (LOCAL_RAY, "auto") or (match and 0 < int(match[3]) < 2**16):
        return text
    raise argparse.ArgumentTypeError(f"expected local, auto, HOST:PORT or ray://HOST:PORT, got {text!r}")


def _common(parser) -> None:
    parser.add_argument("--dataset", type=arguments.comma_list(str), default=["humaneval"],
                        help=f"prompt sets, comma-separated: {', '.join(DATASETS)} or a JSONL/text file "
                        "(default humaneval)")
    parser.add_argument("--temperature", type=arguments.comma_list(arguments.number(0.0)), default=[0.7],
                        help="temperatures, comma-separated (default 0.7; ablation: 0.1,0.4,0.7,1.0)")
    parser.add_argument("--limit", type=arguments.positive_int, help="only the first LIMIT prompts of each set")
    parser.add_argument("--max-new-tokens", type=arguments.integer(1, MAX_NEW_TOKENS), default=128,
                        help="tokens per generation (default 128)")
    parser.add_argument("--top-k", type=arguments.positive_int, help="top-k, applied to target and draft alike")
    parser.add_argument("--top-p", type=arguments.number(0.0, 1.0, low_open=True),
                        help="top-p, applied to target and draft alike")
    parser.add_argument("--seed", type=arguments.seed, default=0, help="seed of every unit's generator (default 0)")
    parser.add_argument("--out", type=arguments.folder, default=str(DEFAULT_OUT),
                        help=f"results folder (default {DEFAULT_OUT})")
    parser.add_argument("--target", default="default-target",
                        help="target model: embedded name, .gguf file or HF folder (default default-target)")
    parser.add_argument("--draft", default=arguments.default("default-draft"),
                        help="draft model (default default-draft)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16", help="model dtype (bfloat16)")
    parser.add_argument("--backend", choices=list(BACKENDS), default="auto",
                        help="llama.cpp (GGUF files as they are; rows as llama.cpp computes them), torch (the "
                        "models in --dtype, scored through float32 twins), or auto: llama.cpp for GGUF models "
                        "when llama-cpp-python is installed (default)")
    parser.add_argument("--no-twins", action="store_true",
                        help="no float32 copies of bf16 models for scoring and prefill (saves ~8 GB; they "
                             "prefill only where float32 is measured faster than bf16 on this CPU)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--batch-size", type=int,
                        help="units decoded together (default: the size measured to pay on this machine, "
                        "kept in the cache's costs.json)")
    parser.add_argument("--ray", nargs="?", const=LOCAL_RAY, type=ray_address, metavar="ADDRESS",
                        help="decode the units on Ray workers, each loading the pair once: a local Ray instance, "
                        "or the cluster at ADDRESS (e.g. auto); needs pip install 'specbound[distributed]'")


def register(subparsers) -> None:
    parser = subparsers.add_parser("study", help="rerun the papers' experiments on a real model pair")
    parser.set_defaults(handler=run)
    subparsers.choices.defer("study", _add_studies)


def _add_studies(parser) -> None:
    """One subcommand per study, with its own options and presets, read from
    ``studies.options.STUDY_OPTIONS`` (which imports no torch) on the command's first use."""
    parser.description = "; ".join(f"{name}: {study.help}" for name, study in STUDY_OPTIONS.items())
    studies = parser.add_subparsers(dest="study", required=True, metavar="STUDY")
    for name, study in STUDY_OPTIONS.items():
        subparser = studies.add_parser(name, help=study.help, description=study.help)
        _common(subparser)
        study.add_arguments(subparser)
        if study.presets:
            subparser.add_argument("--preset", choices=sorted(study.presets),
                                   help="; ".join(f"{name}: {preset.help}" for name, preset in study.presets.items())
                                   + "; options given explicitly override the preset's")
            preset_options = {dest for preset in study.presets.values() for dest in preset.settings}
            subparser.set_defaults(**{dest: Unset(subparser.get_default(dest)) for dest in preset_options})
