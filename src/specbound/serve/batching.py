"""The decoding loop of a server: continuous batching over the engine's step-level API.

One thread runs it for the server's life. Requests (``Job``) wait in a bounded queue; at
every step the loop admits as many as ``max_batch`` leaves room for, runs one step of every
batch, sends each request the text its new tokens made, and lets a request leave as soon as
it ends (EOS, its ``max_tokens``, a stop string), is cancelled or its client disconnected —
its cache rows freed before the next step (``engine.decode.Batch``).

**One batch per sampling setting.** A ``Processing`` (temperature, top-k, top-p) is applied
identically to the target's and the draft's logits inside the decoder and its drafter, and
``auto``'s planner keeps its acceptance estimates per setting; so requests are grouped by
their ``Processing``, each group one ``Batch`` of its own decoder (over the same loaded
models), and the loop steps the groups in turn. Requests that share a setting — the common
case, a client's defaults — decode together. The settings a server keeps are bounded
(``max_settings``): each costs a decoder (for ``auto`` also a planner and the draft's
quantised copies).

**Same seed, same tokens.** A request's randomness comes from its own generator, seeded by
its ``seed`` (or drawn from the server's seed sequence), so with a ``seed`` it gets the
tokens a solo ``specbound generate`` gives where the forward is batch-invariant (float32
torch models, ``engine.decode``). ``auto`` plans from what the server has seen, so its
tokens also depend on earlier requests.

**Failures stay local.** A request is checked before it queues (``app``); a step that raises
fails the requests of that group only (HTTP 500 in their responses), whose batch starts
afresh; the loop and every other group run on.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specbound.engine.processing import Processing
from specbound.serve.text import TextStream

log = logging.getLogger("specbound.serve")
IDLE_WAIT = 0.5  # seconds the loop sleeps when it has nothing to do (woken at once by a request)


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
    status: int
    message: str


@dataclass
class Job:
    """One request in the loop. ``deliver`` is called from the loop's thread with each
    ``Text``, then one ``Finished`` or ``Failed``; it must not block."""

    prompt_ids: list[int]
    max_tokens: int
    processing: Processing
    seed: int
    stops: tuple[str, ...]
    deliver: Callable[[object], None]
    cancelled: bool = False  # set by the request's side; the loop removes it before its next step
    sequence: object = None
    text: TextStream | None = None
    steps_by_method: Counter = field(default_factory=Counter)


@dataclass
class _Group:
    """The batch of one sampling setting."""

    decoder: object
    plan: object  # a Method, or auto's Planner
    batch: object
    jobs: dict = field(default_factory=dict)  # sequence index -> Job


class Overloaded(Exception):
    """The queue is full."""


class Unavailable(Exception):
    """The loop is stopping, or stopped."""


class TooManySettings(Exception):
    """A new sampling setting beyond ``max_settings``."""


class BatchingLoop:
    """The server's decoding loop (module docstring). ``speculator``: the loaded pair;
    ``method``, ``options``: what ``Speculator.decoder_for`` takes ("auto" or an engine
    method and its options); ``max_batch``: sequences decoded at once, all groups together;
    ``max_queue``: requests waiting beyond them."""

    def __init__(self, speculator, method: str, options: dict, max_batch: int, max_queue: int,
                 max_settings: int = 16):
        self.speculator = speculator
        self.method, self.options = method, dict(options)
        self.max_batch, self.max_queue, self.max_settings = max_batch, max_queue, max_settings
        self._groups: dict[Processing, _Group] = {}
        self._settings: set[Processing] = set()  # every setting accepted (guarded by the lock)
        self._queue: deque[Job] = deque()
        self._running = 0  # jobs admitted and not ended (read by health)
        self._condition = threading.Condition()
        self._stopping = False
        self.broken = False  # the loop's thread died (a bug; logged): requests are refused with 503
        self._thread = threading.Thread(target=self._run, name="specbound-decoding", daemon=True)
        self.completed = 0  # requests that ended with a Finished
        self.cancelled = 0  # requests dropped from their batch before they ended

    # -- the request's side ------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue ``job``; ``Overloaded`` when the queue is full, ``TooManySettings`` for a
        sampling setting the server cannot add."""
        with self._condition:
            if self._stopping or self.broken:
                raise Unavailable("the server is shutting down" if self._stopping else "the decoding loop stopped")
            if len(self._queue) >= self.max_queue:
                raise Overloaded(f"{len(self._queue)} requests are waiting (--max-queue {self.max_queue})")
            if job.processing not in self._settings:
                if len(self._settings) >= self.max_settings:
                    raise TooManySettings(f"this server decodes at most {self.max_settings} distinct sampling "
                                          "settings (temperature, top_p, top_k); use one it has seen")
                self._settings.add(job.processing)
            self._queue.append(job)
            self._condition.notify()

    def cancel(self, job: Job) -> None:
        """The request is gone (cancelled, client disconnected): drop it before the next step."""
        job.cancelled = True
        with self._condition:
            self._condition.notify()

    def stop(self, timeout: float) -> None:
        with self._condition:
            self._stopping = True
            self._condition.notify()
        self._thread.join(timeout)

    def health(self) -> dict:
        groups = list(self._groups.values())  # one C-level copy: the loop's thread may add a group meanwhile
        with self._condition:
            return {"in_batches": sum(len(group.batch.sequences) for group in groups),
                    "tracked": sum(len(group.jobs) for group in groups),"running": self._running, "queued": len(self._queue), "settings": len(self._settings), "broken": self.broken,
                    "completed": self.completed, "cancelled": self.cancelled, "max_batch": self.max_batch, "max_queue": self.max_queue}

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
                job.deliver(Failed(503, "The server's decoding loop stopped."))
            raise

    def _loop(self) -> None:
        while True:
            with self._condition:
                while not self._stopping and not self._queue and not self._running:
                    self._condition.wait(IDLE_WAIT)
                if self._stopping:
                    break
                admitted = []
                while self._queue and self._running + len(admitted) < self.max_batch:
                    job = self._queue.popleft()
                    if not job.cancelled:
                        admitted.append(job)
                self._running += len(admitted)
            for job in admitted:
                self._admit(job)
            for group in list(self._groups.values()):
                self._drop_cancelled(group)
                if group.batch.sequences:
                    self._step(group)
        for group in self._groups.values():
            for job in list(group.jobs.values()):
                self._end(group, job, Failed(503, "The server shut down before this request finished."))

    def _group(self, processing: Processing) -> _Group:
        group = self._groups.get(processing)
        if group is None:
            decoder, plan = self.speculator.decoder_for(processing, self.method, self.options)
            group = self._groups[processing] = _Group(decoder, plan, decoder.start(plan))
        return group

    def _admit(self, job: Job) -> None:
        try:
            group = self._group(job.processing)
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

    def _drop_cancelled(self, group: _Group) -> None:
        for job in [job for job in group.jobs.values() if job.cancelled]:
            group.batch.remove(job.sequence)
            del group.jobs[job.sequence.index]
            self._finish_count(None, job)
            with self._condition:
                self.cancelled += 1

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
        for sequence, tokens in emitted:
            job = group.jobs[sequence.index]
            job.steps_by_method[label] += 1
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

    def _end(self, group: _Group, job: Job, event) -> None:
        if not job.sequence.done:
            group.batch.remove(job.sequence)
        del group.jobs[job.sequence.index]
        self._finish_count(event, job)

    def _finish_count(self, event, job: Job) -> None:
        with self._condition:
            self._running -= 1
            self.completed += isinstance(event, Finished)
        if event is not None:
            job.deliver(event)

    def _figures(self, job: Job) -> dict:
        """The ``specbound`` object of a response: what decoded it and how speculation did."""
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
        }


def _usage(job: Job) -> dict:
    completion = len(job.sequence.new_tokens)
    return {"prompt_tokens": len(job.prompt_ids), "completion_tokens": completion,
            "total_tokens": len(job.prompt_ids) + completion}
