"""``GET /metrics``: Prometheus' text format, vLLM's names after a ``specbound:`` prefix, and
counts that agree with the responses: between two scrapes, two requests add their prompt
and completion tokens, target calls, drafted and accepted tokens (as their ``specbound``
objects report them), two successes, two first-token times and two latencies; nothing is
left running or waiting."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from support.serving import MODEL

NAMES = ["request_success", "request_failure", "requests_refused", "prompt_tokens", "generation_tokens",
         "target_calls", "spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens",
         "num_requests_running", "num_requests_waiting", "time_to_first_token_seconds", "inter_token_latency_seconds",
         "e2e_request_latency_seconds"]


def scrape(server) -> tuple[set[str], dict]:
    response = httpx.get(f"{server.url}/metrics", timeout=30)  # no key needed
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    families = list(text_string_to_metric_families(response.text))
    samples = {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
               for family in families for sample in family.samples}
    return {family.name for family in families}, samples


def test_metrics_count_what_the_responses_report(server):
    names, before = scrape(server)
    assert {"specbound:" + name for name in NAMES} <= names
    bodies = [{"model": MODEL, "prompt": "red cat", "max_tokens": 12, "seed": 3},
              {"model": MODEL, "messages": [{"role": "user", "content": "dog"}], "max_tokens": 9, "seed": 4}]
    replies = [httpx.post(f"{server.url}/v1/{'chat/completions' if 'messages' in body else 'completions'}",
                          json=body, headers=server.headers, timeout=60).json() for body in bodies]
    _, after = scrape(server)

    def added(name: str, **labels) -> float:
        key = ("specbound:" + name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    def total(field: str, part: str = "usage") -> int:
        return sum(reply[part][field] for reply in replies)

    assert added("prompt_tokens_total") == total("prompt_tokens")
    assert added("generation_tokens_total") == total("completion_tokens")
    assert added("target_calls_total") == total("target_calls", "specbound")
    assert added("spec_decode_num_draft_tokens_total") == total("drafted_tokens", "specbound")
    assert added("spec_decode_num_accepted_tokens_total") == total("accepted_drafts", "specbound")
    assert 1 <= added("spec_decode_num_drafts_total") <= total("target_calls", "specbound")
    reasons = [reply["choices"][0]["finish_reason"] for reply in replies]
    assert sum(added("request_success_total", finished_reason=reason) for reason in set(reasons)) == 2
    assert added("time_to_first_token_seconds_count") == added("e2e_request_latency_seconds_count") == 2
    assert added("inter_token_latency_seconds_count") <= total("completion_tokens") - 2
    assert after[("specbound:num_requests_running", ())] == after[("specbound:num_requests_waiting", ())] == 0
