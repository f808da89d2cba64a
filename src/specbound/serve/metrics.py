"""``GET /metrics``: what the server has done, in Prometheus' text format (``prometheus_client``).

Names take vLLM's (and where vLLM has none, llama.cpp's server's) after a ``specbound:``
prefix, so that a dashboard built for either reads them:

- ``specbound:request_success_total{finished_reason}`` requests answered whole ("stop",
  "length"); ``specbound:request_failure_total{reason}`` those that were not ("cancelled":
  the client left; "error": a failed step or the drain's time up);
  ``specbound:requests_refused_total{status}`` those refused before decoding (400, 413, 429…);
- ``specbound:prompt_tokens_total``, ``specbound:generation_tokens_total`` (llama.cpp's
  ``tokens_predicted_total``), ``specbound:target_calls_total``;
- ``specbound:spec_decode_num_drafts_total`` (verification steps that had drafts),
  ``specbound:spec_decode_num_draft_tokens_total``, ``specbound:spec_decode_num_accepted_tokens_total``;
- gauges ``specbound:num_requests_running`` and ``specbound:num_requests_waiting`` (llama.cpp's
  ``requests_processing`` and ``requests_deferred``);
- histograms ``specbound:time_to_first_token_seconds`` (arrival to the first token),
  ``specbound:inter_token_latency_seconds`` (between a request's tokens: a step that emits k
  tokens after a wait w counts k times w / k) and ``specbound:e2e_request_latency_seconds``
  (arrival to the end of a request answered whole).

Each server has a registry of its own (``CollectorRegistry``): two in one process do not mix.
"""

from __future__ import annotations

import time

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from specbound.serve.batching import BatchingLoop, Event, Finished, Job

PREFIX = "specbound:"
CONTENT_TYPE = CONTENT_TYPE_LATEST
FIRST_TOKEN_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                       40.0, 80.0)
TOKEN_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
REQUEST_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0)


class ServerMetrics:
    """The counters of one server; the decoding loop reports to it (``batching.LoopObserver``),
    the request handling its refusals."""

    def __init__(self):
        self.registry = CollectorRegistry(auto_describe=True)

        def counter(name: str, text: str, labels=()) -> Counter:
            return Counter(PREFIX + name, text, labels, registry=self.registry)

        self.success = counter("request_success", "Requests answered whole, by finish reason.", ["finished_reason"])
        self.failure = counter("request_failure", "Requests ended without their answer.", ["reason"])
        self.refused = counter("requests_refused", "Requests refused before decoding, by HTTP status.", ["status"])
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of the requests admitted to a batch.")
        self.generation_tokens = counter("generation_tokens", "Tokens generated.")
        self.target_calls = counter("target_calls", "Target model calls (verification steps) of ended requests.")
        self.drafts = counter("spec_decode_num_drafts", "Verification steps that had drafts, of ended requests.")
        self.draft_tokens = counter("spec_decode_num_draft_tokens", "Drafted tokens, of ended requests.")
        self.accepted_tokens = counter("spec_decode_num_accepted_tokens", "Accepted draft tokens, of ended requests.")
        self.running = Gauge(PREFIX + "num_requests_running", "Requests in a batch.", registry=self.registry)
        self.waiting = Gauge(PREFIX + "num_requests_waiting", "Requests waiting for a batch slot.",
                             registry=self.registry)
        self.first_token = Histogram(PREFIX + "time_to_first_token_seconds", "From arrival to the first token.",
                                     buckets=FIRST_TOKEN_BUCKETS, registry=self.registry)
        self.token_gap = Histogram(PREFIX + "inter_token_latency_seconds", "Between a request's tokens.",
                                   buckets=TOKEN_GAP_BUCKETS, registry=self.registry)
        self.latency = Histogram(PREFIX + "e2e_request_latency_seconds", "From arrival to the end of a request "
                                 "answered whole.", buckets=REQUEST_BUCKETS, registry=self.registry)

    def watch(self, loop: BatchingLoop) -> None:
        """Read the running and waiting requests from ``loop`` at every scrape."""
        self.running.set_function(lambda: loop.running)
        self.waiting.set_function(lambda: loop.waiting)

    def text(self) -> bytes:
        """The exposition, in Prometheus' text format."""
        return generate_latest(self.registry)

    def refusal(self, status: int) -> None:
        self.refused.labels(str(status)).inc()

    # -- batching.LoopObserver ----------------------------------------------------------------
    def admitted(self, job: Job) -> None:
        self.prompt_tokens.inc(len(job.prompt_ids))

    def tokens(self, count: int, seconds: float, first: bool) -> None:
        self.generation_tokens.inc(count)
        if first:
            self.first_token.observe(seconds)
            return
        for _ in range(count):
            self.token_gap.observe(seconds / count)

    def ended(self, job: Job, event: Event | None) -> None:
        if isinstance(event, Finished):
            self.success.labels(event.finish_reason).inc()
            self.latency.observe(time.monotonic() - job.arrived)
        else:
            self.failure.labels("cancelled" if event is None else "error").inc()
        if job.sequence is None:
            return
        stats = job.sequence.stats
        self.target_calls.inc(stats.target_calls)
        self.drafts.inc(sum(1 for size in stats.tree_sizes if size))
        self.draft_tokens.inc(sum(stats.tree_sizes))
        self.accepted_tokens.inc(sum(stats.accepted_lengths))
