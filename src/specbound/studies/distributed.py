"""Run a study's units on Ray: a pool of workers, each holding the pair, and one writer here.

The driver (this process) is the study's only writer. It opens the results folder exactly as
``run_study`` does (``runner.StudyWriter``: the folder's lock, the pending units, the
progress bar), cuts the pending units into the same batches (``runner.batches``) and hands
them to a pool of Ray actors. Each actor builds the pair once, from ``pair_spec`` — a
picklable callable without arguments, such as ``functools.partial(load_pair, target,
draft, dtype)`` — and decodes one batch at a time (``runner.run_batch``: every unit's
generator seeded from the study seed and its key), so a unit's records do not depend on the
worker that ran it. Finished batches are appended in the order a local run appends them (a
batch that finishes early waits here for those before it), so ``records.jsonl`` is byte for
byte that of ``run_study`` with the same batch size, and resume, extend and ``specbound
report`` see no difference.

Never written twice, never lost: only pending units are sent; each batch is in flight on one
worker at a time; when that worker dies (killed, out of memory, its node lost) the batch
goes back to the front of the queue, to the next free worker, and a fresh worker replaces
the dead one — at most ``max_retries`` times in a run, after which the run stops keeping
everything written so far. The store refuses a unit it holds already. An exception raised by
the study itself is no worker failure: it stops the run, as it would a local one.
"""

from __future__ import annotations

from collections import deque

import torch

from specbound.checks import positive_int
from specbound.datasets import Prompt
from specbound.studies.base import Study
from specbound.studies.cluster import INSTALL_HINT, check_reachable, import_ray  # noqa: F401  (INSTALL_HINT: the refusal)
from specbound.studies.records import StudyResults, read_results
from specbound.studies.runner import StudyWriter, batches, machine_batch_size, run_batch

class StudyWorker:
    """One Ray actor's state: the pair, built once; it decodes one batch per call."""

    def __init__(self, pair_spec, threads: int):
        torch.set_num_threads(threads)
        self.pair = pair_spec()

    def models(self) -> dict:
        return self.pair.description

    def batch_size(self) -> int:
        return machine_batch_size(self.pair)

    def run(self, study: Study, batch: list, seed: int) -> tuple[list, float]:
        return run_batch(study, self.pair, batch, seed)


class RayWorkers:
    """A pool of ``StudyWorker`` actors on Ray, kept for several study runs (one per dataset).

    Ray is reached as ``ray.init(address)`` finds it — "local": a new instance on this machine;
    "auto" or "head:6379": the running cluster; None: ``$RAY_ADDRESS``, else the cluster last
    started here, else a new instance — unless this process has joined Ray already (then Ray is
    left running at ``close``). By default one worker per node, each with the CPUs of the
    smallest node (a torch model decodes fastest with all of a machine's cores in one
    process, and each worker holds a copy of the pair); ``num_workers`` and
    ``cpus_per_worker`` say otherwise."""

    def __init__(self, pair_spec, address: str | None = None, num_workers: int | None = None,
                 cpus_per_worker: int | None = None, max_retries: int = 3):
        self.ray = import_ray()
        self.started_ray = not self.ray.is_initialized()
        if self.started_ray:
            check_reachable(address)
            self.ray.init(address=address)
        self.actor_class = self.ray.remote(StudyWorker)
        self.pair_spec, self.max_retries, self.workers = pair_spec, max_retries, []
        try:
            nodes = [node["Resources"]["CPU"] for node in self.ray.nodes()
                     if node["Alive"] and node["Resources"].get("CPU")]  # CPUs of each live node
            self.num_workers = positive_int("num_workers", len(nodes) if num_workers is None else num_workers)
            self.cpus_per_worker = positive_int("cpus_per_worker", int(min(nodes)) if cpus_per_worker is None
                                                else cpus_per_worker)
            if self.num_workers * self.cpus_per_worker > sum(nodes):
                raise ValueError(f"num_workers: {self.num_workers} workers of {self.cpus_per_worker} CPUs do not fit "
                                 f"the cluster's {sum(nodes):g} CPUs")
            self.workers = [self._start_worker() for _ in range(self.num_workers)]
            descriptions = self._get([worker.models.remote() for worker in self.workers])
            if any(description != descriptions[0] for description in descriptions):
                raise ValueError(f"pair_spec: the workers loaded different pairs: {descriptions}")
            self.models = descriptions[0]
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> RayWorkers:
        return self

    def __exit__(self, *exception) -> None:
        self.close()

    def close(self) -> None:
        """Stop the workers; shut Ray down when it was started here."""
        for worker in self.workers:
            self.ray.kill(worker)
        self.workers = []
        if self.started_ray and self.ray.is_initialized():
            self.ray.shutdown()

    def _start_worker(self):
        actor = self.actor_class.options(num_cpus=self.cpus_per_worker, scheduling_strategy="SPREAD",
                                         max_restarts=0, max_task_retries=0)  # a dead worker is replaced here
        return actor.remote(self.pair_spec, self.cpus_per_worker)

    def _get(self, references):
        try:
            return self.ray.get(references)
        except self.ray.exceptions.RayActorError as error:
            raise ValueError(f"pair_spec: a worker could not build the pair: {error}") from None

    def batch_size(self) -> int:
        """The batch size that pays on the workers' machines (``runner.measured_batch_size``),
        measured by the first worker."""
        return self.ray.get(self.workers[0].batch_size.remote())

    def run_study(self, study: Study, prompts: list[Prompt], directory, dataset: str, seed: int = 0,
                  batch_size: int = 1, progress: bool = True) -> StudyResults:
        """``runner.run_study`` with the batches decoded by the workers (module docstring)."""
        positive_int("batch_size", batch_size)
        with StudyWriter(study, prompts, directory, dataset, seed, progress) as writer:
            return self.run_pending(study, writer, batch_size)

    def run_pending(self, study: Study, writer: StudyWriter, batch_size: int = 1) -> StudyResults:
        """``runner.run_pending`` with the batches decoded by the workers."""
        positive_int("batch_size", batch_size)
        writer.store_models(self.models)
        queue = deque(enumerate(batches(study, writer.pending, batch_size)))
        idle, in_flight, finished, written, deaths = list(self.workers), {}, {}, 0, 0
        while queue or in_flight:
            while queue and idle:
                worker, (index, batch) = idle.pop(), queue.popleft()
                in_flight[worker.run.remote(study, batch, writer.seed)] = (worker, index, batch)
            [reference], _ = self.ray.wait(list(in_flight), num_returns=1)
            worker, index, batch = in_flight.pop(reference)
            try:
                finished[index] = (batch, *self.ray.get(reference))
            except self.ray.exceptions.RayActorError as error:
                deaths += 1
                if deaths > self.max_retries:
                    raise RuntimeError(f"ray: {deaths} workers died in this run; stopping "
                                       f"(what was written stays, a rerun resumes): {error}") from error
                queue.appendleft((index, batch))
                self.workers.remove(worker)
                worker = self._start_worker()
                self.workers.append(worker)
            idle.append(worker)
            while written in finished:
                writer.append(*finished.pop(written))
                written += 1
        return read_results(writer.directory)


def run_study_on_ray(study: Study, pair_spec, prompts: list[Prompt], directory, dataset: str, seed: int = 0,
                     batch_size: int | None = None, address: str | None = None, progress: bool = True,
                     num_workers: int | None = None, cpus_per_worker: int | None = None,
                     max_retries: int = 3) -> StudyResults:
    """One study run on a fresh pool of Ray workers (``RayWorkers``); ``batch_size`` None:
    the size measured on a worker."""
    with RayWorkers(pair_spec, address, num_workers, cpus_per_worker, max_retries) as workers:
        size = workers.batch_size() if batch_size is None else batch_size
        return workers.run_study(study, prompts, directory, dataset, seed, size, progress)
