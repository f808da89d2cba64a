"""Run a study unit by unit into its results directory, resuming where a run stopped.

A **unit** is one engine generation for one prompt at one setting (a temperature, a
method); a study says which units it has (``Study.units``) and turns one unit into its
records (``Study.run_unit``, ``specbound.studies.base``). The runner skips the units
already on disk, seeds each unit's ``torch.Generator`` from the study seed and the unit
key (``records.unit_seed``), shows a progress bar with an ETA on stderr, and appends each
finished unit. The folder is locked for the whole run: a second run into it is refused at
once (``records.ResultsStore``), and a killed run's lock is released by the OS. The lock,
the settings check and the records' repair come before the models load (``StudyWriter``
first, ``run_pending`` once the pair is there): a refused run, or one with nothing left to
do (``StudyWriter.finished``), loads no model.

With ``batch_size`` B > 1, up to B consecutive units of the same generation settings
(``Study.batch_key``) decode together (``Study.run_units``): each unit's text, hence its
records, are exactly those of a one-by-one run; only the wall time is shared.

``StudyWriter`` (the store, the pending units, the progress bar) and ``run_batch`` are the
two halves of a run, shared with the runs whose batches Ray workers decode
(``studies.distributed``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from specbound.checks import positive_int
from specbound.engine.costs import ROWS
from specbound.datasets import Prompt
from specbound.models.pair import ModelPair
from specbound.studies.base import Study
from specbound.studies.records import SETTINGS_FILE, ResultsStore, StudyResults, read_results, read_settings, unit_seed
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
    with StudyWriter(study, prompts, directory, dataset, seed, progress) as writer:
        return run_pending(study, pair, writer, batch_size)


def run_pending(study: Study, pair: ModelPair, writer: StudyWriter, batch_size: int = 1) -> StudyResults:
    """Store the pair's description in ``writer``'s settings, run its pending units; return
    all results read back from disk."""
    positive_int("batch_size", batch_size)
    writer.store_models(pair.description)
    study.begin(pair, writer.units, writer.directory)
    for batch in batches(study, writer.pending, batch_size):
        writer.append(batch, *run_batch(study, pair, batch, writer.seed))
    return read_results(writer.directory)


def run_batch(study: Study, pair: ModelPair, batch: list, seed: int) -> tuple[list, float]:
    """The outputs of one batch of units, each unit with its own generator seeded from the
    study seed and its key, and the wall time per unit."""
    started = time.perf_counter()
    generators = [torch.Generator().manual_seed(unit_seed(seed, unit.key)) for unit in batch]
    outputs = study.run_units(pair, batch, generators)
    return outputs, (time.perf_counter() - started) / len(batch)


class StudyWriter:
    """The one writer of a study run, wherever its units are decoded. Made before any model
    loads, it takes the results folder (``ResultsStore``, locked until ``close``), checks
    every setting but the models against the stored ones, repairs the records and knows the
    units still ``pending``; ``store_models`` completes the settings once the pair has
    loaded; then it appends finished units and shows the progress bar."""

    def __init__(self, study: Study, prompts: list[Prompt], directory, dataset: str, seed: int, progress: bool):
        self.directory, self.seed, self.progress, self.bar = Path(directory), seed, progress, None
        self.description = f"{study.name} {dataset}"
        self.settings = {
            "study": study.name,
            "dataset": dataset,
            "seed": seed,
            "limit": len(prompts),
            "scoring": f"one {str(SCORING_DTYPE).removeprefix('torch.')} forward per model over each generation, "
            "float64 rows",
            **study.settings(),
        }
        self.store = ResultsStore(directory, self.settings, later=("models",))  # ours until the last unit is written
        try:
            self.units = study.units(prompts)
        except BaseException:
            self.store.close()
            raise
        self.pending = [unit for unit in self.units if unit.key not in self.store.done]

    def finished(self, models: dict) -> bool:
        """Whether every unit is written under these settings already, the stored models
        agreeing with ``models`` (what the options say of the pair before it loads: its
        sources, dtype or backend): then nothing needs a model."""
        if self.pending or not (self.directory / SETTINGS_FILE).is_file():
            return False
        stored = read_settings(self.directory / SETTINGS_FILE).get("models")
        return isinstance(stored, dict) and all(stored.get(key) == value for key, value in models.items())

    def store_models(self, models: dict) -> None:
        """Complete the settings with the loaded pair's description (``ModelPair.description``),
        checked against the stored one, and start the progress bar."""
        items = list(self.settings.items())
        position = list(self.settings).index("limit") + 1  # where settings.json has always held them
        self.store.store_settings(dict(items[:position] + [("models", models)] + items[position:]))
        self.bar = tqdm(
            total=len(self.units), initial=len(self.units) - len(self.pending), desc=self.description,
            unit="run", file=sys.stderr, disable=not self.progress, dynamic_ncols=True,
        )

    def __enter__(self) -> StudyWriter:
        return self

    def __exit__(self, *exception) -> None:
        self.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.store.close()

    def append(self, batch: list, outputs: list, seconds_per_unit: float) -> None:
        """Append a finished batch, unit by unit (the store refuses a unit written before)."""
        for unit, output in zip(batch, outputs):
            seconds = {**output.seconds, "total": seconds_per_unit}
            self.store.append_unit(unit.key, output.positions, output.run, seconds)
            self.bar.update(1)


def batches(study: Study, units: list, batch_size: int) -> list[list]:
    """Consecutive units of equal ``batch_key``, at most ``batch_size`` to a batch."""
    groups, current = [], []
    for unit in units:
        if current and (len(current) == batch_size or study.batch_key(unit) != study.batch_key(current[0])):
            groups.append(current)
            current = []
        current.append(unit)
    return groups + ([current] if current else [])


# every batch the cost book measures; a unit's recorded target rows are float32 until its turn
# (``traces.Trace.target_rows``): 32 units of 128 tokens hold ~2.5 GB
BATCH_SIZES = ROWS
# A batched row pays when its share of the forward is at most this much of a forward alone. The
# margin covers what batching does not shrink (each row's sampling and recorded rows) and the
# noise of the measured costs; without it a saving within that noise would trade the one-row
# records for other exact samples (a forward that is not batch-invariant) for nothing.
PAYING_ROW_SHARE = 0.8


def measured_batch_size(target_costs, sizes=BATCH_SIZES) -> int:
    """The batch size that pays on this machine: the B of ``sizes`` whose forward costs least
    per row (``engine.costs.Costs``; ties to the smaller B), where that row's share is at most
    ``PAYING_ROW_SHARE`` of a one-row forward; else 1. Where a row costs linear time (an
    AVX2-only CPU in bf16) that is 1; where 32 rows cost little more than one, 32."""
    alone = target_costs(1)
    cheapest = min(sizes, key=lambda size: (target_costs(size) / size, size))
    return cheapest if target_costs(cheapest) <= PAYING_ROW_SHARE * cheapest * alone else 1


def machine_batch_size(pair: ModelPair, cache_dir=None) -> int:
    """``measured_batch_size`` for the pair's target on this machine, from its forward costs
    (measured once, then kept in ``<cache>/costs.json``: ``engine.cost_book.CostBook``)."""
    from specbound.engine.cost_book import CostBook
    from specbound.models.gguf import default_cache_dir

    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    costs = CostBook(cache / "costs.json").costs(pair.target, pair.backend.cost_precision(pair.target), pair.device)
    return measured_batch_size(costs)
