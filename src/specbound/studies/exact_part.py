"""The acceptance study's exact part: each row's tail cut, then every method's exact
acceptance at each number of drafts, in this process or on spawned worker processes
(``ExactPool``). It imports only the math layers (numpy and the compiled loops), so that a
worker, which imports this module to unpickle its task, imports neither torch nor the
studies (``studies/__init__.py`` registers the studies on first use for the same reason)."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import threading
import time
import weakref
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import shared_memory

import numpy as np

from specbound.bounds.rows import RowPairs
from specbound.bounds.tail import cut_tails, scan_guesses
from specbound.studies.acceptance_methods import (attained_optimum, method_acceptance_of, method_refusal_of,
                                                   method_refuses_by_estimate)

POSITIONS_PER_TASK = 1  # a task of the exact part's workers (``ExactPool``)


def unit_exact_part(methods, counts, tail_budget, target_rows, draft_rows, defer=False,
                    only=None) -> dict[int, tuple[np.ndarray, dict, dict]]:
    """``AcceptanceStudy.exact`` for rows in one process: each row's tail cut for every n
    of ``counts``, then every method at each n. The tokens any of a row's cuts keeps are
    sorted by p/q once, each cut's scan order read from that sort (``bounds.tail.scan_guesses``).
    ``defer`` and ``only``: the two rounds of ``ExactPool`` (``exact_acceptances``' ``defer``;
    ``only``, a set of (method, n): those alone are computed, the others left out).
    # [positions, vocab] x2"""
    cuts = [cut_tails(target, draft, tail_budget, counts) for target, draft in zip(target_rows, draft_rows)]
    guesses = [scan_guesses(row_cuts, target, draft)
               for row_cuts, target, draft in zip(cuts, target_rows, draft_rows)]
    exact = {}
    for num_drafts in counts:
        rows = [row_cuts[num_drafts] for row_cuts in cuts]
        tails = np.array([[cut.dropped_target, cut.dropped_draft, cut.bound] for cut in rows]).reshape(len(rows), 3)
        computed = methods if only is None else [method for method in methods if (method, num_drafts) in only]
        exact[num_drafts] = (tails, *exact_acceptances(computed, [(cut.target, cut.draft) for cut in rows], num_drafts,
                                                       [row_guesses[num_drafts] for row_guesses in guesses], defer))
    return exact


_BLAS_LIMITS = []  # a worker's threadpool limits, kept for its life
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
KEPT_FREED_BYTES = 64 << 20  # blocks below this come from the heap; freed memory up to 4x it stays
PARENT_CHECK_SECONDS = 0.25  # how often a worker looks whether its parent still runs


def _exit_with_parent(parent: int) -> None:
    """End this worker once ``parent`` has ended, however it ended (a SIGKILL runs none of
    its cleanup): the parent id of an orphan changes. Linux's PR_SET_PDEATHSIG would not do:
    it fires when the *thread* that spawned the worker ends, not its process."""
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_SECONDS)
    os._exit(1)


def _worker_setup(parent: int) -> None:
    """A worker's BLAS on one thread: the workers already fill the cores, and a threaded BLAS
    under each has them compete for the same cores (two workers gain less over one with it
    than without). And glibc's malloc keeps the memory the worker frees: the exact part
    allocates and frees arrays of a cut row's size (megabytes) at every step, and under
    glibc's adaptive mmap threshold many come as fresh mappings, each paying its page faults
    again (``benchmarks/studies/bench_study_real_rows.py --workers 2`` times the exact part as
    a study runs it).
    Elsewhere than glibc the allocator is left as it is. A thread ends the worker with its
    ``parent`` (``_exit_with_parent``); the resource tracker then ends too, its pipe closed
    by every process that held it."""
    from threadpoolctl import threadpool_limits

    threading.Thread(target=_exit_with_parent, args=(parent,), name="exit-with-parent", daemon=True).start()
    _BLAS_LIMITS.append(threadpool_limits(limits=1, user_api="blas"))
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    libc.mallopt(M_MMAP_THRESHOLD, KEPT_FREED_BYTES)
    libc.mallopt(M_TRIM_THRESHOLD, 4 * KEPT_FREED_BYTES)


class ExactPool:
    """``unit_exact_part`` on worker processes, spawned (not forked: the parent holds torch's
    thread pools) and kept from unit to unit with the shared-memory block they read a unit's
    rows from. The parent writes the rows into the block (one copy; a block kept across units
    costs no page faults) and hands out tasks of ``POSITIONS_PER_TASK`` consecutive
    positions, each to whichever worker is free: a position's cost varies several-fold with
    how many tokens its tail cut keeps, and fixed shares left one worker idle while the other
    finished. When the pool is collected, or at the latest when the interpreter exits, the
    workers are stopped and joined and the block released (``_shut_down``)."""

    def __init__(self, workers: int):
        self.executor = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                            initializer=_worker_setup, initargs=(os.getpid(),))
        self.blocks: list[shared_memory.SharedMemory] = []  # the block in use (none before the first unit)
        weakref.finalize(self, _shut_down, self.executor, self.blocks)

    def exact(self, methods, counts, tail_budget, target_rows, draft_rows) -> dict[int, tuple[np.ndarray, dict, dict]]:
        """``unit_exact_part`` of the rows, computed by the workers, in two rounds: the first
        computes every method but those a row can refuse by estimate, which it only
        estimates (``exact_acceptances``' ``defer``: a task holds some of the rows, and a
        value is thrown away once any row of the unit is refused); the second computes those
        that no row refuses, from the same cuts (rare on real rows, most of which estimate
        RRS without replacement at n ≥ 4 far past its limit: ~2e5 s a row at n = 4 in the
        MMLU report).  # [positions, vocab] x2"""
        shape = (2, *np.shape(target_rows))
        rows = self._rows(shape)
        rows[0], rows[1] = target_rows, draft_rows
        del rows  # the block must export no buffer when it is replaced or released
        parts = self._map(shape, methods, counts, tail_budget, True, None)
        exact = {num_drafts: _joined(parts, num_drafts, methods) for num_drafts in counts}
        pending = {(method, num_drafts) for num_drafts, (_, _, missing) in exact.items()
                   for method, reason in missing.items() if reason is None}
        if pending:
            later = self._map(shape, methods, counts, tail_budget, False, pending)
            for num_drafts, (tails, acceptance, missing) in exact.items():
                _, computed, computed_missing = _joined(later, num_drafts, [m for m, n in pending if n == num_drafts])
                acceptance.update(computed)
                missing.update(computed_missing)
                for method in computed:
                    del missing[method]
                exact[num_drafts] = (tails, {method: acceptance[method] for method in methods if method in acceptance},
                                     missing)
        return exact

    def _map(self, shape, methods, counts, tail_budget, defer, only) -> list:
        """``_shared_exact_part`` of every task of ``POSITIONS_PER_TASK`` positions, in order."""
        tasks = [slice(start, start + POSITIONS_PER_TASK) for start in range(0, shape[1], POSITIONS_PER_TASK)]
        count = len(tasks)
        return list(self.executor.map(_shared_exact_part, [self.blocks[0].name] * count, [shape] * count, tasks,
                                      [methods] * count, [counts] * count, [tail_budget] * count, [defer] * count,
                                      [only] * count))

    def _rows(self, shape) -> np.ndarray:
        """A float64 view of ``shape`` at the start of the block, which is replaced by a larger
        one when it is too small.  # -> [2, positions, vocab]"""
        size = int(np.prod(shape)) * np.dtype(np.float64).itemsize
        if not self.blocks or self.blocks[0].size < size:
            _release(self.blocks)
            self.blocks.append(shared_memory.SharedMemory(create=True, size=size))
        return np.ndarray(shape, np.float64, buffer=self.blocks[0].buf)


def _shut_down(executor: ProcessPoolExecutor, blocks: list) -> None:
    """Stop and join the workers, then release the block. Joined here, not left to the
    executor's own exit hook: an executor collected as the interpreter exits races that
    hook, which can then write to a closed pipe (seen with CPython 3.11)."""
    executor.shutdown()
    _release(blocks)


def _release(blocks: list) -> None:
    for block in blocks:
        block.close()
        block.unlink()
    blocks.clear()


def _joined(parts, num_drafts: int, methods) -> tuple[np.ndarray, dict, dict]:
    """The tasks' results at n joined in position order: the tails, each method's values
    where no task lacks them, and why the first position that lacks a value lacks it (as
    one process reports it), None where the tasks only deferred it (``exact_acceptances``)."""
    missing = {}
    for part in parts:
        for method, reason in part[num_drafts][2].items():
            if missing.get(method) is None:
                missing[method] = reason
    tails = np.concatenate([part[num_drafts][0] for part in parts])
    acceptance = {method: np.concatenate([part[num_drafts][1][method] for part in parts])
                  for method in methods if method not in missing}
    return tails, acceptance, missing


def _shared_exact_part(name, shape, positions, methods, counts, tail_budget, defer=False, only=None):
    """``unit_exact_part`` on the positions ``positions`` (a slice) of the [2, positions,
    vocab] rows in the shared-memory block ``name`` (one task of ``ExactPool``)."""
    shared = shared_memory.SharedMemory(name=name)
    try:
        rows = np.ndarray(shape, np.float64, buffer=shared.buf)[:, positions].copy()
    finally:
        shared.close()
    return unit_exact_part(methods, counts, tail_budget, rows[0], rows[1], defer, only)


def exact_acceptances(methods, pairs, num_drafts: int, scan_guesses=None, defer=False) -> tuple[dict, dict]:
    """method -> exact acceptance at each (target, draft) row pair, and method -> why it has
    no exact value at this size (``method_acceptance``'s ValueError). Each row is checked
    once for the computations and every method reads the same checked form, so its sorts
    and searches are done once for all methods (``bounds.rows.RowPairs``; ``scan_guesses``:
    per row, a guess of its scan order or None, checked before it is used). One call per
    row: batching rows of different lengths by padding costs more than the calls it
    saves. A verifier that attains its scheme's α* by
    construction takes the optimum's values when those are computed before it.

    A method that can refuse a row by estimating its work (``AcceptanceMethod.refusal_of``:
    RRS without replacement at n ≥ 4, past its 20-s limit) is estimated at every row first
    and computed at none when one is refused, with the first refused row's reason: a value
    computed before a later row's refusal would be thrown away (on MMLU prompt 2's rows the
    pool spent about a third of its time so). ``defer`` (``ExactPool``'s first round, whose
    tasks hold a few of a unit's rows): such a method that none of these rows refuses is not
    computed either, its reason None, for the pool to compute once every row is known; the
    rows are then checked once for the estimates and the computations alike (without
    ``defer``, once for each, so that a unit's rows are not all held checked at once)."""
    reused = {}
    for index, method in enumerate(methods):
        if attained_optimum(method, num_drafts) in methods[:index]:
            reused[method] = attained_optimum(method, num_drafts)
    guesses = [None] * len(pairs) if scan_guesses is None else scan_guesses
    computing = [method for method in methods if method not in reused]
    estimated = [method for method in computing if method_refuses_by_estimate(method, num_drafts)]
    kept = list(_checked_rows(pairs, guesses)) if estimated and defer else None
    refused = _first_refusals(estimated, kept or _checked_rows(pairs, guesses), num_drafts) if estimated else {}
    deferred = {method: None for method in estimated if method not in refused} if defer else {}
    computing = [method for method in computing if method not in refused and method not in deferred]
    acceptance, missing = _row_by_row(computing, kept or _checked_rows(pairs, guesses), num_drafts)
    missing = {**refused, **deferred, **missing}
    fallback = [method for method, optimum in reused.items() if optimum in missing]
    computed, computed_missing = _row_by_row(fallback, _checked_rows(pairs, guesses), num_drafts)
    acceptance.update(computed)
    missing.update(computed_missing)
    acceptance.update({method: list(acceptance[optimum]) for method, optimum in reused.items() if optimum in acceptance})
    return {method: acceptance[method] for method in methods if method in acceptance}, missing


def _checked_rows(pairs, guesses):
    """Each (target, draft) pair as checked rows (``RowPairs.checked``), in order, up to
    and with the first that fails its check (its ValueError in its place); one at a time,
    so a row's sorts are let go before the next is checked.  # yields RowPairs [1, vocab]"""
    for (target, draft), guess in zip(pairs, guesses):
        try:
            yield RowPairs.checked(target[None], draft[None], guess)
        except ValueError as error:
            yield error
            return


def _first_refusals(methods, checked, num_drafts: int) -> dict:
    """method -> why the first row of ``checked`` it refuses by estimate is refused
    (``method_refusal_of``), for the methods that refuse one; rows after one that failed
    its check are not asked (``_row_by_row`` reports that one)."""
    refused = {}
    for rows in checked:
        if isinstance(rows, ValueError):
            break
        for method in methods:
            if method not in refused:
                reason = method_refusal_of(method, rows, num_drafts)
                if reason is not None:
                    refused[method] = reason
        if len(refused) == len(methods):
            break
    return refused


def _row_by_row(methods, checked, num_drafts: int) -> tuple[dict, dict]:
    """``exact_acceptances`` without the reuse and the estimates: every method at every
    checked row (``_checked_rows``), rows outer; none are checked without a method."""
    if not methods:
        return {}, {}
    acceptance, missing = {method: [] for method in methods}, {}
    for rows in checked:
        if isinstance(rows, ValueError):
            missing.update({method: str(rows) for method in methods})
            break
        for method in methods:
            if method not in missing:
                try:
                    acceptance[method].append(method_acceptance_of(method, rows, num_drafts)[0])
                except ValueError as error:
                    missing[method] = str(error)
    return {method: values for method, values in acceptance.items() if method not in missing}, missing
