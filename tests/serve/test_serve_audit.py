"""``specbound audit`` of our own server: the token ids of each response (``specbound.token_ids``)
follow the served target's law, batched as the server batches them (issue 42)."""

from __future__ import annotations

from support.serving import API_KEY, MODEL
from support.chat_pair import tiny_pair
from specbound.audit import audit
from specbound.audit.samplers import endpoint_sampler

PROMPTS = [[2, 5, 8], [3, 9], [5, 6, 7, 10]]  # token ids of the tiny pair's 12 words


def test_the_server_passes_the_audit_against_its_target(servers):
    server = servers["server"]  # chain γ = 3 at temperature 0.8, the tiny pair with EOS
    sampler = endpoint_sampler(server.url, MODEL, 0.8, api_key=API_KEY, eos_token_ids=(0,))
    result = audit(sampler, tiny_pair().target, PROMPTS, temperature=0.8, max_new_tokens=6, samples=96, seed=0)
    assert result.passed, result.p_value
    assert all(len(record["tokens"]) <= 6 for record in result.samples)
