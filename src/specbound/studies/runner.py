"""Run a study unit by unit into its results directory, resuming where a run stopped.

A **unit** is one engine generation for one prompt at one setting (a temperature, a
method); a study says which units it has (``Study.units``) and turns one unit into its
records (``Study.run_unit``, ``specbound.studies.base``). The runner skips the units
already on disk, seeds each unit's ``torch.Generator`` from the study seed and the unit
key (``records.unit_seed``), shows a progress bar with an ETA on stderr, and appends each
finished unit. The folder is locked for the whole run: a second run into it is refused at
once (``records.ResultsStore``), and a killed run's lock is released by the OS.
"""

from __future__ import annotations

import sys
import time

import torch
from tqdm import tqdm

from specbound.datasets import Prompt
from specbound.models.pair import ModelPair
from specbound.studies.base import Study
from specbound.studies.records import ResultsStore, StudyResults, read_results, unit_seed
from specbound.studies.traces import SCORING_DTYPE


def run_study(
    study: Study,
    pair: ModelPair,
    prompts: list[Prompt],
    directory,
    dataset: str,
    seed: int = 0,
    progress: bool = True,
) -> StudyResults:
    """Run every unit not yet in ``directory``; return all results read back from disk."""
    settings = {
        "study": study.name,
        "dataset": dataset,
        "seed": seed,
        "limit": len(prompts),
        "models": pair.description,
        "scoring": f"one {str(SCORING_DTYPE).removeprefix('torch.')} forward per model over each generation, "
        "float64 rows",
        **study.settings(),
    }
    with ResultsStore(directory, settings) as store:  # the folder is ours until the last unit is written
        units = study.units(prompts)
        pending = [unit for unit in units if unit.key not in store.done]
        with tqdm(
            total=len(units), initial=len(units) - len(pending), desc=f"{study.name} {dataset}",
            unit="run", file=sys.stderr, disable=not progress, dynamic_ncols=True,
        ) as bar:
            for unit in pending:
                started = time.perf_counter()
                generator = torch.Generator().manual_seed(unit_seed(seed, unit.key))
                output = study.run_unit(pair, unit, generator)
                seconds = {**output.seconds, "total": time.perf_counter() - started}
                store.append_unit(unit.key, output.positions, output.run, seconds)
                bar.update(1)
        return read_results(directory)
