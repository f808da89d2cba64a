"""The decoding loop of a server: continuous batching over the engine's step-level API.

One thread runs it for the server's life. A request (``Job``) takes a batch slot if one of
``max_batch`` is free, else waits in a queue of at most ``max_queue`` (0: no waiting); beyond
them it is refused (``Overloaded``). Before every step the loop moves the waiting requests
into the free slots, runs one step of every batch, sends each request the text its new tokens
made, and lets a request leave as soon as it ends (EOS, its ``max_tokens``, a stop string), is
cancelled or its client disconnected — its cache rows freed before the next step
(``engine.decode.Batch``).

**One batch per sampling setting.** A ``Sampling`` (temperature, top-k, top-p) is applied
identically to the target's and the draft's logits inside the decoder and its drafter, and
``auto``'s planner keeps its acceptance estimates per setting; so requests are grouped by
their ``Sampling``, each group one ``Batch`` of its own decoder (over the same loaded
models), and the loop steps the groups in turn. Requests that share a setting — the common
case, a client's defaults — decode together. The settings *in use* (with a running or waiting
request) are bounded by ``max_settings``: a new setting while ``max_settings`` others are in
use is refused for now (``SettingsBusy``), and a setting whose last request ended no longer
counts. Each setting costs a decoder with its caches (for ``auto`` also a planner and the
draft's quantised copies): an idle setting's group is kept for its next request until a new
setting needs the room — at most ``max_settings`` groups besides the default's, the least
recently used idle one forgotten first (``Speculator.release_decoder``).

**Same seed, same tokens.** A request's randomness comes from its own generator, seeded by
its ``seed`` (or drawn from the server's seed sequence), so with a ``seed`` it gets the
tokens a solo ``specbound generate`` gives where the forward is batch-invariant (float32
torch models, ``engine.decode``). ``auto`` plans from what the server has seen, so its
tokens also depend on earlier requests.

**Failures stay local.** A request is checked before it queues (``handling``); a step that
raises fails the requests of that group only (HTTP 500 in their responses), whose batch
starts afresh; the loop and every other group run on.

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

from specbound.engine.decode import Batch, Decoder, Sequence
from specbound.engine.methods import Method
from specbound.engine.planner import Planner
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
    cancelled: bool = False  # set by the request's side; the loop removes it before its next step
    sequence: Sequence | None = None  # once in its batch
    text: TextStream | None = None
    steps_by_method: Counter[str] = field(default_factory=Counter)
    last_tokens_at: float | None = None  # when its latest tokens came


@dataclass(eq=False)
class _Group:
    """The batch of one sampling setting."""

    decoder: Decoder
    plan: Method | Planner
    batch: Batch
    jobs: dict[int, Job] = field(default_factory=dict)  # sequence index -> Job


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


class SettingsBusy(Exception):
    """A new sampling setting while ``max_settings`` others are in use."""


class Unavailable(Exception):
    """The loop is draining or stopped."""


class BatchingLoop:
    """The server's decoding loop (module docstring). ``speculator``: the loaded pair;
    ``method``, ``options``: what ``Speculator.decoder_for`` takes ("auto" or an engine
    method and its options); ``max_batch``: sequences decoded at once, all groups together;
    ``max_queue``: requests waiting when every slot is busy (0: none); ``max_settings``:
    sampling settings in use at once; ``default``: the setting whose batch is never forgotten
    (the server's own); ``observer``: told what the loop does (the server's metrics)."""

    def __init__(self, speculator, method: str, options: dict, max_batch: int, max_queue: int,
                 max_settings: int = 16, default: Sampling | None = None,
                 observer: LoopObserver | None = None):
        self.speculator = speculator
        self.method, self.options = method, dict(options)
        self.max_batch, self.max_queue, self.max_settings = max_batch, max_queue, max_settings
        self.default = default
        self.observer = observer or _Unobserved()
        self._groups: dict[Sampling, _Group] = {}  # touched by the loop's thread only
        self._in_use: Counter[Sampling] = Counter()  # running and waiting jobs per setting
        self._queue: deque[Job] = deque()
        self._running = 0  # jobs admitted and not ended
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
        """Give ``job`` a batch slot or a queue place; ``Overloaded`` when none is free,
        ``SettingsBusy`` for a new sampling setting beyond ``max_settings`` in use,
        ``Unavailable`` while draining or stopped."""
        with self._condition:
            if self._stopping or self._drain_deadline is not None or self.broken:
                raise Unavailable("the decoding loop stopped" if self.broken else "the server is shutting down")
            if self._running + len(self._queue) >= self.max_batch + self.max_queue:
                raise Overloaded(f"{self._running} requests are decoding and {len(self._queue)} waiting "
                                 f"(--max-batch {self.max_batch}, --max-queue {self.max_queue})")
            if job.sampling not in self._in_use and len(self._in_use) >= self.max_settings:
                raise SettingsBusy(f"{len(self._in_use)} other sampling settings (temperature, top_p, top_k) are "
                                   f"in use (--max-settings {self.max_settings})")
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
                self._release(job.sampling)
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
        groups = list(self._groups.values())  # one C-level copy: the loop's thread may change them meanwhile
        with self._condition:
            return {"in_batches": sum(len(group.batch.sequences) for group in groups),
                    "tracked": sum(len(group.jobs) for group in groups), "running": self._running,
                    "queued": len(self._queue), "settings": len(self._in_use), "groups": len(groups),
                    "broken": self.broken, "completed": self.completed, "cancelled": self.cancelled,
                    "max_batch": self.max_batch, "max_queue": self.max_queue}

    def _release(self, sampling: Sampling) -> None:
        """One job of ``sampling`` left (the lock held)."""
        self._in_use[sampling] -= 1
        if not self._in_use[sampling]:
            del self._in_use[sampling]

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
                    self._release(job.sampling)
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
            for group in list(self._groups.values()):
                self._drop_cancelled(group)
                if group.batch.sequences:
                    self._step(group)
        self._end_all(SHUT_DOWN)

    def _end_all(self, message: str) -> None:
        for group in self._groups.values():
            for job in list(group.jobs.values()):
                self._end(group, job, Failed(503, message))

    def _group(self, sampling: Sampling) -> _Group:
        group = self._groups.pop(sampling, None)
        if group is None:
            self._forget_idle()
            decoder, plan = self.speculator.decoder_for(sampling, self.method, self.options)
            group = _Group(decoder, plan, decoder.start(plan))
        self._groups[sampling] = group  # last: the most recently used
        return group

    def _forget_idle(self) -> None:
        """Make room for a new setting's group: while ``max_settings`` groups besides the
        default's are kept, forget the least recently used one no request uses, its decoder
        with it."""
        with self._condition:
            idle = [sampling for sampling, group in self._groups.items()
                    if not group.jobs and sampling not in self._in_use and sampling != self.default]
        kept = len(self._groups) - (self.default in self._groups)
        for sampling in idle[: max(0, kept - self.max_settings + 1)]:
            del self._groups[sampling]
            self.speculator.release_decoder(sampling, self.method, self.options)

    def _admit(self, job: Job) -> None:
        if job.cancelled:  # its client left between the queue and here
            self._finish_count(None, job)
            return
        try:
            group = self._group(job.sampling)
            generator = torch.Generator(device=self.speculator.pair.device).manual_seed(job.seed)
            job.sequence = group.batch.add(job.prompt_ids, job.max_tokens, generator)
        except ValueError as error:  # checked before it queued; a refusal here is still the request's own
            self._finish_count(Failed(400, str(error)), job)
            return
        except Exception:  # noqa: BLE001 — e.g. a decoder that cannot be built: this request fails, not the loop
            log.exception("a request could not join its batch")
            self._finish_count(Failed(500, "The request could not join a batch."), job)
            return
        job.text = TextStream(lambda tokens: self.speculator.pair.decode(tokens, skip_special_tokens=True), job.stops)
        group.jobs[job.sequence.index] = job
        self.observer.admitted(job)

    def _drop_cancelled(self, group: _Group) -> None:
        for job in [job for job in group.jobs.values() if job.cancelled]:
            group.batch.remove(job.sequence)
            del group.jobs[job.sequence.index]
            self._finish_count(None, job)

    def _step(self, group: _Group) -> None:
        try:
            self._step_and_send(group)
        except Exception:  # noqa: BLE001 — a failing step must not take the loop or other groups down
            log.exception("a decoding step failed; its group's requests fail, the loop runs on")
            jobs = list(group.jobs.values())
            group.jobs.clear()
            group.batch = group.decoder.start(group.plan)  # its first admission resets the caches
            for job in jobs:
                self._finish_count(Failed(500, "The decoding step of this request failed."), job)

    def _step_and_send(self, group: _Group) -> None:
        emitted = group.batch.step()
        label = group.batch.last_method.name
        now = time.monotonic()
        for sequence, tokens in emitted:
            job = group.jobs[sequence.index]
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
                    group.batch.remove(sequence)
                rest = job.text.finish()
                if rest:
                    job.deliver(Text(rest))
                reason = "length" if sequence.finish_reason == "length" and not job.text.stopped else "stop"
                self._end(group, job, Finished(reason, _usage(job), self._figures(job)))

    def _end(self, group: _Group, job: Job, event: Event) -> None:
        if not job.sequence.done:
            group.batch.remove(job.sequence)
        del group.jobs[job.sequence.index]
        self._finish_count(event, job)

    def _finish_count(self, event: Event | None, job: Job) -> None:
        """``job`` left the loop (``event`` None: cancelled): its slot and setting are free."""
        with self._condition:
            self._running -= 1
            self._release(job.sampling)
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
    computed of how many, their standard errors and seconds."""
    figures = {key: summary[key] for key in ("expected_acceptance", "optimal_acceptance", "acceptance_gap")}
    return figures | {"optimum_positions": {key: summary.get(key) for key in
                                            ("positions", "computed", "standard_error", "seconds")}}


def _usage(job: Job) -> dict:
    completion = len(job.sequence.new_tokens)
    return {"prompt_tokens": len(job.prompt_ids), "completion_tokens": completion,
            "total_tokens": len(job.prompt_ids) + completion}
