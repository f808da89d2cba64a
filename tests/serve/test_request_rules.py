"""A refused request field is told the rule it broke (``serve.schemas.parse_request``): a NaN
temperature was told it "should be less than or equal to 2", ten stop sequences that each
"should be a valid string"."""

import json

import pytest

from specbound.serve.schemas import MAX_STOPS, ChatCompletionRequest, RequestError, parse_request

MESSAGES = [{"role": "user", "content": "hi"}]


def refusal(body: bytes) -> RequestError:
    with pytest.raises(RequestError) as refused:
        parse_request(ChatCompletionRequest, body)
    assert refused.value.status == 400
    return refused.value


@pytest.mark.parametrize("field", ["temperature", "top_p"])
def test_a_nan_sampling_number_is_told_it_must_be_finite(field):
    error = refusal(b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "%s": NaN}' % field.encode())
    assert error.param == field and "finite number" in str(error) and "less than" not in str(error)


@pytest.mark.parametrize("stop, rule", [
    (["x"] * 10, f"at most {MAX_STOPS} stop sequences, got 10"),
    (["x", 5], "a string or a list of strings (item 1 is int)"),
    (5, "a string or a list of strings, got int"),
])
def test_stop_sequences_are_told_the_rule_they_break(stop, rule):
    error = refusal(json.dumps({"model": "m", "messages": MESSAGES, "stop": stop}).encode())
    assert error.param == "stop" and rule in str(error) and "valid string" not in str(error)


@pytest.mark.parametrize("stop", ["x", ["x"] * MAX_STOPS, [], None])
def test_stop_sequences_within_the_rule_are_taken(stop):
    body = json.dumps({"model": "m", "messages": MESSAGES, "stop": stop}).encode()
    request = parse_request(ChatCompletionRequest, body)
    assert request.stops == ((stop,) if isinstance(stop, str) else tuple(stop or ()))
