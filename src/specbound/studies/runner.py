"""Run a study unit by unit into its results directory, resuming where a run stopped.

A **unit** is one engine generation for one prompt at one setting (a temperature, a
method); a study says which units it has (``Study.units``) and turns one unit into its
records (``Study.run_unit``, ``specbound.studies.base``). The runner skips the units
already on disk, seeds each unit's ``torch.Generator`` from the study seed and the unit
key (``records.unit_seed``), shows a progress bar with an ETA on stderr, and appends each
finished unit. The folder is locked for the whole run: a second run into it is refused at
once (``records.ResultsStore``), and a killed run's lock is released by the OS.

With ``batch_size`` B > 1, up to B consecutive units of the same generation settings
(``Study.batch_key``) decode together (``Study.run_units``): each unit's text, hence its
records, are exactly those of a one-by-one run; only the wall time is shared.
"""

from __future__ import annotations

import sys
import time

import torch
from tqdm import tqdm

from specbound.checks import positive_int
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
    batch_size: int = 1,
) -> StudyResults:
    """Run every unit not yet in ``directory``; return all results read back from disk."""
    positive_int("batch_size", batch_size)
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
            for batch in batches(study, pending, batch_size):
                started = time.perf_counter()
                generators = [torch.Generator().manual_seed(unit_seed(seed, unit.key)) for unit in batch]
                outputs = study.run_units(pair, batch, generators)
                share = (time.perf_counter() - started) / len(batch)
                for unit, output in zip(batch, outputs):
                    store.append_unit(unit.key, output.positions, output.run, {**output.seconds, "total": share})
                    bar.update(1)
        return read_results(directory)


def batches(study: Study, units: list, batch_size: int) -> list[list]:
    """Consecutive units of equal ``batch_key``, at most ``batch_size`` to a batch."""
    groups, current = [], []
    for unit in units:
        if current and (len(current) == batch_size or study.batch_key(unit) != study.batch_key(current[0])):
            groups.append(current)
            current = []
        current.append(unit)
    return groups + ([current] if current else [])


BATCH_SIZES = (1, 2, 4, 8, 16)


def measured_batch_size(target_costs, sizes=BATCH_SIZES) -> int:
    """The batch size that pays on this machine: the largest B of ``sizes`` whose forward of
    B rows costs at most half of B one-row forwards (``engine.costs.Costs``). Where a row
    costs linear time (an AVX2-only CPU in bf16) that is 1; where 16 rows cost little more
    than one, 16."""
    return max(size for size in sizes if size == 1 or target_costs(size) <= 0.5 * size * target_costs(1))
