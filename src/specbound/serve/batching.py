"""The decoding loop of a server: continuous batching over the engine's step-level API.

One thread runs it for the server's life. A request (``Job``) takes a batch slot if one of
``max_batch`` is free, else waits in a queue of at most ``max_queue`` (0: none waiting); beyond
them it is refused (``Overloaded``). Before every step the loop moves the waiting requests
into the free slots, runs one step of the batch, sends each request the text its new tokens
made, and lets a request leave as soon as it ends (EOS, its ``max_tokens``, a stop string), is
cancelled or its client disconnected — its cache rows freed before the next step
(``engine.decode.Batch``).

**One batch, whatever the sampling.** The server holds one decoder (over the loaded pair,
with its caches, and under ``auto`` its planner) and one ``Batch`` of it; a request's
``Sampling`` (temperature, top-k, top-p) is its sequence's own (``Batch.add``), applied to
its target and draft rows alike. So a sampling setting costs no decoder or cache of its own:
what the server holds grows with the requests it decodes, not with the settings they name.
``auto``'s planner learns from the steps of every setting.

**Bounded cache.** A request reserves the cache entries it may need (``decode.cells_needed``:
its prompt, ``max_tokens`` and the largest draft tree) from when it is taken until it ends;
with ``max_cache_tokens``, a request whose entries would take the reserved ones past it is
refused for now (``CacheFull``) — unless nothing else is reserved: a request alone is always
taken, so a 429 always means "retry later".

**Same seed, same tokens.** A request's randomness comes from its own generator, seeded by
its ``seed`` (or drawn from the server's seed sequence), so with a ``seed`` it gets the
tokens a solo ``specbound generate`` gives where the forward is batch-invariant (float32
torch models, ``engine.decode``). ``auto`` plans from what the server has seen, so its
tokens also depend on earlier requests.

**Failures stay local.** A request is checked before it queues (``handling``); a step that
raises fails the requests decoding in it (HTTP 500 in their responses), and the batch
starts afresh: the loop, the waiting requests and later ones run on.

**Drain.** ``drain(seconds)`` refuses new requests and lets those in flight run for
``seconds``; then each still unfinished ends with ``Failed`` (503), so that its response
ends properly (a stream with an error event and ``[DONE]``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from specbound.engine.decode import Decoder, Sequence, cells_needed
from specbound.engine.methods import Schedule
from specbound.engine.processing import Sampling
from specbound.serve.text import TextStream

log = logging.getLogger("specbound.serve")
IDLE_WAIT = 0.5  # seconds the loop sleeps when it has nothing to do (woken at once by a request)
SHUT_DOWN = "The server shut down before this request finished."


@dataclass
class Text:
    """New text of a request."""

    text: str


@dataclass
class Finished:
    """A request ended: why (OpenAI's "stop" or "length"), its counts and the method's figures."""

    finish_reason: str
    usage: dict
    specbound: dict


@dataclass
class Failed:
    """A request ended without its answer: the HTTP status and message its response carries."""

    status: int
    message: str


Event = Text | Finished | Failed


@dataclass(eq=False)  # a job is itself: found in the queue by identity
class Job:
    """One request in the loop. ``deliver`` is called from the loop's thread with each
    ``Text``, then one ``Finished`` or ``Failed`` (none for a cancelled request); it must
    not block."""

    prompt_ids: list[int]
    max_tokens: int
    sampling: Sampling
    seed: int
    stops: tuple[str, ...]
    deliver: Callable[[Event], None]
    arrived: float = field(default_factory=time.monotonic)  # when the server received it
    cells: int = 0  # cache entries reserved for it from when it is taken until it ends (set by ``submit``)
    cancelled: bool = False  # set by the request's side; the loop removes it before its next step
    sequence: Sequence | None = None  # once in its batch
    text: TextStream | None = None
    steps_by_method: Counter[str] = field(default_factory=Counter)
    last_tokens_at: float | None = None  # when its latest tokens came


class LoopObserver(Protocol):
    """What the loop reports as it runs (the server's metrics)."""

    def admitted(self, job: Job) -> None: ...

    def tokens(self, count: int, seconds: float, first: bool) -> None:
        """``count`` new tokens of a request, ``seconds`` after its previous ones (``first``:
        after it arrived)."""

    def ended(self, job: Job, event: Event | None) -> None:
        """``job`` left the loop: ``Finished``, ``Failed``, or None (cancelled)."""


class _Unobserved:
    """A ``LoopObserver`` that keeps nothing."""

    def admitted(self, job: Job) -> None:
        pass

    def tokens(self, count: int, seconds: float, first: bool) -> None:
        pass

    def ended(self, job: Job, event: Event | None) -> None:
        pass


class Overloaded(Exception):
    """Every batch slot and queue place is taken."""


class CacheFull(Exception):
    """The cache entries reserved by the requests decoding and waiting leave too few for
    this one (``max_cache_tokens``)."""


class Unavailable(Exception):
    """The loop is draining or stopped."""


class BatchingLoop:
    """The server's decoding loop (module docstring). ``speculator``: the loaded pair;
    ``method``, ``options``: what ``Speculator.decoder_for`` takes ("auto" or an engine
    method and its options); ``max_batch``: sequences decoded at once; ``max_queue``: requests
    waiting when every slot is busy (0: none); ``max_cache_tokens``: cache entries the
    requests decoding and waiting reserve together at most (None: no bound but the slots');
    ``default``: the sampling of the one decoder (a request's own applies to its sequence);
    ``observer``: told what the loop does (the server's metrics)."""

    def __init__(self, speculator, method: str, options: dict, max_batch: int, max_queue: int,
                 max_cache_tokens: int | None = None, default: Sampling | None = None,
                 observer: LoopObserver | None = None):
        self.speculator = speculator
        self.method, self.options = method, dict(options)
        self.max_batch, self.max_queue, self.max_cache_tokens = max_batch, max_queue, max_cache_tokens
        self.observer = observer or _Unobserved()
        decoder, schedule = speculator.decoder_for(default or Sampling(), method, self.options)
        self.decoder: Decoder = decoder
        self.schedule: Schedule = schedule  # the Method, or the Planner under "auto"
        self._batch = self.decoder.start(self.schedule)  # touched by the loop's thread only, as _jobs
        self._jobs: dict[int, Job] = {}  # sequence index -> Job
        self._queue: deque[Job] = deque()
        self._running = 0  # jobs admitted and not ended
        self._reserved = 0  # cache entries of the running and waiting jobs
        self._in_use: Counter[Sampling] = Counter()  # running and waiting jobs per sampling setting
        self._condition = threading.Condition()  # guards the fields above it and the counts
        self._stopping = False
        self._drain_deadline: float | None = None  # set by drain: refuse new jobs, end the rest then
        self.broken = False  # the loop's thread died (a bug; logged): requests are refused with 503
        self._thread = threading.Thread(target=self._run, name="specbound-decoding", daemon=True)
        self.completed = 0  # requests that ended with a Finished
        self.cancelled = 0  # requests dropped before they ended

    # -- the request's side ------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Give ``job`` a batch slot or a queue place and reserve its cache entries;
        ``Overloaded`` when no slot or place is free, ``CacheFull`` when its entries do not
        fit beside those reserved, ``Unavailable`` while draining or stopped."""
        job.cells = cells_needed(len(job.prompt_ids), job.max_tokens, self.schedule)
        with self._condition:
            if self._stopping or self._drain_deadline is not None or self.broken:
                raise Unavailable("the decoding loop stopped" if self.broken else "the server is shutting down")
            if self._running + len(self._queue) >= self.max_batch + self.max_queue:
                raise Overloaded(f"{self._running} requests are decoding and {len(self._queue)} waiting "
                                 f"(--max-batch {self.max_batch}, --max-queue {self.max_queue})")
            limit = self.max_cache_tokens
            if limit is not None and self._reserved and self._reserved + job.cells > limit:
                raise CacheFull(f"the requests decoding and waiting hold {self._reserved:,} of its {limit:,} cache "
                                f"entries (--max-cache-tokens) and this one needs {job.cells:,} (its prompt, "
                                "max_tokens and a draft tree)")
            self._reserved += job.cells
            self._in_use[job.sampling] += 1
            self._queue.append(job)
            self._condition.notify()

    def cancel(self, job: Job) -> None:
        """The request is gone (client disconnected, response abandoned): a waiting one leaves
        the queue now, a running one its batch before the next step; no-op once it ended."""
        with self._condition:
            job.cancelled = True
            if job in self._queue:
                self._queue.remove(job)
                self._release(job)
                self.cancelled += 1
                waiting = True
            else:
                waiting = False
            self._condition.notify()
        if waiting:
            self.observer.ended(job, None)

    def drain(self, seconds: float) -> None:
        """Refuse new requests; end those still unfinished ``seconds`` from now (module docstring)."""
        with self._condition:
            self._drain_deadline = time.monotonic() + seconds
            self._condition.notify()

    def stop(self, timeout: float) -> None:
        with self._condition:
            self._stopping = True
            self._condition.notify()
        self._thread.join(timeout)

    @property
    def running(self) -> int:
        return self._running

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def health(self) -> dict:
        in_batch = len(self._batch.sequences)  # read without the lock: the loop's thread may change it meanwhile
        with self._condition:
            return {"in_batches": in_batch, "tracked": len(self._jobs), "running": self._running,
                    "queued": len(self._queue), "settings": len(self._in_use),
                    "cache_tokens": self._reserved, "max_cache_tokens": self.max_cache_tokens,
                    "broken": self.broken, "completed": self.completed, "cancelled": self.cancelled,
                    "max_batch": self.max_batch, "max_queue": self.max_queue}

    def _release(self, job: Job) -> None:
        """``job`` left (the lock held): its cache entries and its setting are free."""
        self._reserved -= job.cells
        self._in_use[job.sampling] -= 1
        if not self._in_use[job.sampling]:
            del self._in_use[job.sampling]

    # -- the loop's thread --------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        except BaseException:  # a bug: say so at once, refuse new requests, fail the waiting ones
            log.exception("the decoding loop stopped")
            with self._condition:
                self.broken, waiting = True, list(self._queue)
                self._queue.clear()
                for job in waiting:
                    self._release(job)
            for job in waiting:
                job.deliver(Failed(503, "The server's decoding loop stopped."))
            raise

    def _loop(self) -> None:
        while True:
            with self._condition:
                while not self._stopping and not self._queue and not self._running:
                    self._condition.wait(IDLE_WAIT)
                if self._stopping:
                    break
                drained = self._drain_deadline is not None and time.monotonic() >= self._drain_deadline
                admitted = []
                while self._queue and (drained or self._running + len(admitted) < self.max_batch):
                    admitted.append(self._queue.popleft())
                self._running += len(admitted)
            if drained:  # the drain's time is up: what is left ends now
                for job in admitted:
                    self._finish_count(Failed(503, SHUT_DOWN), job)
                self._end_all(SHUT_DOWN)
                admitted = []
            for job in admitted:
                self._admit(job)
            self._drop_cancelled()
            if self._batch.sequences:
                self._step()
        self._end_all(SHUT_DOWN)

    def _end_all(self, message: str) -> None:
        for job in list(self._jobs.values()):
            self._end(job, Failed(503, message))

    def _admit(self, job: Job) -> None:
        if job.cancelled:  # its client left between the queue and here
            self._finish_count(None, job)
            return
        try:
            generator = torch.Generator(device=self.speculator.pair.device).manual_seed(job.seed)
            job.sequence = self._batch.add(job.prompt_ids, job.max_tokens, generator, job.sampling)
        except ValueError as error:  # checked before it queued; a refusal here is still the request's own
            self._finish_count(Failed(400, str(error)), job)
            return
        except Exception:  # noqa: BLE001 — this request fails, not the loop
            log.exception("a request could not join its batch")
            self._finish_count(Failed(500, "The request could not join a batch."), job)
            return
        job.text = TextStream(lambda tokens: self.speculator.pair.decode(tokens, skip_special_tokens=True), job.stops)
        self._jobs[job.sequence.index] = job
        self.observer.admitted(job)

    def _drop_cancelled(self) -> None:
        for job in [job for job in self._jobs.values() if job.cancelled]:
            self._batch.remove(job.sequence)
            del self._jobs[job.sequence.index]
            self._finish_count(None, job)

    def _step(self) -> None:
        try:
            self._step_and_send()
        except Exception:  # noqa: BLE001 — a failing step must not take the loop down
            log.exception("a decoding step failed; its requests fail, the loop runs on")
            jobs = list(self._jobs.values())
            self._jobs.clear()
            self._batch = self.decoder.start(self.schedule)  # its first admission resets the caches
            for job in jobs:
                self._finish_count(Failed(500, "The decoding step of this request failed."), job)

    def _step_and_send(self) -> None:
        emitted = self._batch.step()
        label = self._batch.last_method.name
        now = time.monotonic()
        for sequence, tokens in emitted:
            job = self._jobs[sequence.index]
            job.steps_by_method[label] += 1
            if tokens:
                since = now - (job.arrived if job.last_tokens_at is None else job.last_tokens_at)
                self.observer.tokens(len(tokens), since, job.last_tokens_at is None)
                job.last_tokens_at = now
            piece = job.text.push(tokens)
            if piece:
                job.deliver(Text(piece))
            if job.text.stopped or sequence.done:
                if not sequence.done:
                    self._batch.remove(sequence)
                rest = job.text.finish()
                if rest:
                    job.deliver(Text(rest))
                reason = "length" if sequence.finish_reason == "length" and not job.text.stopped else "stop"
                self._end(job, Finished(reason, _usage(job), self._figures(job)))

    def _end(self, job: Job, event: Event) -> None:
        if not job.sequence.done:
            self._batch.remove(job.sequence)
        del self._jobs[job.sequence.index]
        self._finish_count(event, job)

    def _finish_count(self, event: Event | None, job: Job) -> None:
        """``job`` left the loop (``event`` None: cancelled): its slot and cache entries are free."""
        with self._condition:
            self._running -= 1
            self._release(job)
            self.completed += isinstance(event, Finished)
            self.cancelled += event is None
        self.observer.ended(job, event)
        if event is not None:
            job.deliver(event)

    def _figures(self, job: Job) -> dict:
        """The ``specbound`` object of a response: what decoded it, how speculation did beside
        the optimum for the same drafts, and the new tokens' ids."""
        stats = job.sequence.stats
        steps = sum(job.steps_by_method.values())
        verified = sum(stats.attempts_by_position)
        return {
            "method": self.method if not self.options else
            self.method + "".join(f":{key}={value}" for key, value in sorted(self.options.items())),
            "plan": {label: count / steps for label, count in job.steps_by_method.most_common()} if steps else {},
            "target_calls": stats.target_calls,
            "tokens_per_target_call": len(job.sequence.new_tokens) / stats.target_calls if stats.target_calls else 0.0,
            "drafted_tokens": sum(stats.tree_sizes),
            "accepted_drafts": sum(stats.accepted_lengths),
            "acceptance_rate": stats.acceptance_rate if verified else None,
            **_optimum_figures(stats.optimum.summary()),
            "token_ids": list(job.sequence.new_tokens),  # what ``specbound audit`` reads
        }


def _optimum_figures(summary: dict) -> dict:
    """The verifier's exact acceptance and α* for the same drafts, means over the verified
    positions, and their gap (``engine.optimum``); ``optimum_positions``: how many were
    computed of how many, their standard errors and seconds; ``shared_mass``: the target's
    mass on the tokens the draft can propose, the bound on the acceptance (1 unless the draft
    has another tokenizer)."""
    figures = {key: summary.get(key) for key in ("expected_acceptance", "optimal_acceptance", "acceptance_gap",
                                                 "shared_mass")}
    return figures | {"optimum_positions": {key: summary.get(key) for key in
                                            ("positions", "computed", "standard_error", "seconds")}}


def _usage(job: Job) -> dict:
    completion = len(job.sequence.new_tokens)
    return {"prompt_tokens": len(job.prompt_ids), "completion_tokens": completion,
            "total_tokens": len(job.prompt_ids) + completion}
