"""``endpoint_sampler`` against stand-ins for each server kind it names (``samplers.SERVERS``):
the request carries what that server needs to return token ids, the ids are read from where it
puts them, and a reply without them is refused naming ``endpoint``. (Ours is audited over real
HTTP in ``tests/serve/test_serve_audit.py``; llama-server and vLLM are not installed here.)"""

import inspect
import json
import time

import pytest

from support.audit import Endpoint
from specbound.audit.samplers import endpoint_address, endpoint_sampler, probe_endpoint

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


@pytest.mark.parametrize("reply, message", [
    (b"\xff\xfe\x00garbage", "answered bytes that are not UTF-8 text, not JSON"),
    (b"<html>busy</html>", "answered something that is not JSON"),
    ({"choices": [{"finish_reason": "length"}], "specbound": {"token_ids": ["5", "6"]}},
     'returned token ids holding str "5"; expected integers'),
    ({"choices": [{"finish_reason": "length"}], "specbound": {"token_ids": [5, True]}},
     "returned token ids holding bool true; expected integers"),
    ({"choices": [{"finish_reason": "length"}], "specbound": {"token_ids": [[5, 6]]}},
     "returned token ids holding list [5, 6]; expected integers"),
])
def test_a_reply_that_is_not_a_list_of_integer_ids_is_refused_saying_what_came(server, reply, message):
    url, state = server
    state["reply"] = reply
    with pytest.raises(ValueError, match="^endpoint: ") as refusal:
        endpoint_sampler(url, "m", 0.7)([1], 2, 0)
    assert message in str(refusal.value)


def test_a_request_waits_for_its_reply_no_longer_than_the_timeout():
    endpoint = Endpoint(lambda body: time.sleep(3) or REPLIES["specbound"])
    try:
        started = time.perf_counter()
        with pytest.raises(ValueError, match=r"^endpoint: .* did not answer within 0.5 s"):
            endpoint_sampler(endpoint.url, "m", 0.7, timeout=0.5)([1], 2, 0)
        assert time.perf_counter() - started < 2.5
    finally:
        endpoint.close()


def test_the_default_request_timeout_is_a_minute():
    assert inspect.signature(endpoint_sampler).parameters["timeout"].default == 60.0


@pytest.mark.parametrize("url, message", [
    ("http://", "names no host"), ("https://:8000", "names no host"), ("http://host:port", "is not a URL"),
    ("http://host:0", "names port 0"), ("ftp://host", "expected an http:// or https:// URL"),
])
def test_a_url_that_names_no_endpoint_is_refused_without_a_connection(url, message):
    with pytest.raises(ValueError, match="^endpoint: ") as refusal:
        endpoint_address(url)
    assert message in str(refusal.value)
    with pytest.raises(ValueError, match="^endpoint: "):
        endpoint_sampler(url, "m", 0.7)


def test_the_probe_finds_an_endpoint_that_is_down_or_serves_another_model():
    with pytest.raises(ValueError, match="^engine: cannot reach http://127.0.0.1:9/v1/models"):
        probe_endpoint("http://127.0.0.1:9", "m", name="engine")
    endpoint = Endpoint(lambda body: REPLIES["specbound"], models=["default-target"])
    try:
        probe_endpoint(endpoint.url, "default-target")
        probe_endpoint(endpoint.url, "other", server="llama.cpp")  # llama-server ignores the model asked for
        with pytest.raises(ValueError, match="^model: .* serves 'default-target', not 'specbound'"):
            probe_endpoint(endpoint.url, "specbound")
    finally:
        endpoint.close()
    without_models = Endpoint(lambda body: REPLIES["specbound"])  # GET /v1/models: 404
    try:
        probe_endpoint(without_models.url, "anything")
    finally:
        without_models.close()
