"""``endpoint_sampler`` against stand-ins for each server kind it names (``samplers.SERVERS``):
the request carries what that server needs to return token ids, the ids are read from where it
puts them, and a reply without them is refused naming ``endpoint``. (Ours is audited over real
HTTP in ``tests/serve/test_serve_audit.py``; llama-server and vLLM are not installed here.)"""

import json

import pytest

from audit_fixtures import Endpoint
from specbound.audit.samplers import endpoint_sampler

EOS = 9
REPLIES = {  # a server kind -> its /v1/completions reply holding the sampled ids [5, 6]
    "specbound": {"choices": [{"text": "", "finish_reason": "length"}], "specbound": {"token_ids": [5, 6]}},
    "llama.cpp": {"choices": [{"text": "", "finish_reason": "length", "tokens": [5, 6]}]},
    "vllm": {"choices": [{"text": "", "finish_reason": "length", "token_ids": [5, 6]}]},
}
ASKED = {"specbound": {}, "llama.cpp": {"return_tokens": True}, "vllm": {"return_token_ids": True}}


@pytest.fixture
def server():
    """A local endpoint answering every POST with ``state["reply"]``, keeping the bodies it got."""
    state = {"reply": {}, "bodies": []}

    def reply(body):
        state["bodies"].append(body)
        return state["reply"]

    endpoint = Endpoint(reply)
    yield endpoint.url, state
    endpoint.close()


@pytest.mark.parametrize("kind", sorted(REPLIES))
def test_each_server_kind_is_asked_for_its_ids_and_read_where_it_puts_them(server, kind):
    url, state = server
    state["reply"] = REPLIES[kind]
    sample = endpoint_sampler(url, "m", 0.7, top_k=5, server=kind, eos_token_ids=(EOS,))
    assert sample([1, 2, 3], 2, 11) == [5, 6]
    body = state["bodies"][-1]
    assert body["prompt"] == [1, 2, 3] and body["max_tokens"] == 2 and body["seed"] == 11
    assert body["temperature"] == 0.7 and body["top_k"] == 5
    assert all(body[key] == value for key, value in ASKED[kind].items())


@pytest.mark.parametrize("kind", sorted(REPLIES))
def test_a_reply_that_stopped_on_eos_gets_it_back(server, kind):
    """Servers leave the EOS token out of the ids of a reply that stopped on it."""
    url, state = server
    reply = json.loads(json.dumps(REPLIES[kind]))
    reply["choices"][0]["finish_reason"] = "stop"
    state["reply"] = reply
    assert endpoint_sampler(url, "m", 0.7, server=kind, eos_token_ids=(EOS,))([1], 4, 0) == [5, 6, EOS]


@pytest.mark.parametrize("kind", ["llama.cpp", "vllm"])
def test_a_reply_without_ids_is_refused_naming_endpoint(server, kind):
    url, state = server
    state["reply"] = {"choices": [{"text": "hi", "finish_reason": "length"}]}
    with pytest.raises(ValueError, match="^endpoint: .* returned no token ids"):
        endpoint_sampler(url, "m", 0.7, server=kind)([1], 2, 0)


def test_an_unreachable_endpoint_is_refused_naming_it():
    with pytest.raises(ValueError, match="^endpoint: cannot reach"):
        endpoint_sampler("http://127.0.0.1:9", "m", 0.7, timeout=5)([1], 2, 0)
