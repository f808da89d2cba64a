"""Request bodies in-process: every refusal names the field and states the rule that was
broken — a stop list too long or of the wrong kind, a temperature or top_p that is not a
finite number (JSON's NaN, Infinity), a body that is not UTF-8, nested too deep, or holding
a lone surrogate."""

from __future__ import annotations

import pytest

from specbound.serve.schemas import MAX_DEPTH, CompletionRequest, RequestError, parse_request

HEAD = b'{"model": "m", "prompt": "red"'

CASES = [
    (HEAD + b', "stop": ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"]}', "stop", "at most 4 stop strings, got 10"),
    (HEAD + b', "stop": 5}', "stop", "a string or a list of at most 4 strings"),
    (HEAD + b', "stop": [1]}', "stop", "a string or a list of at most 4 strings"),
    (HEAD + b', "temperature": NaN}', "temperature", "finite number"),
    (HEAD + b', "top_p": Infinity}', "top_p", "finite number"),
    (b'{"model": "m", "prompt": "\xff"}', None, "not valid UTF-8"),
    (HEAD + b', "user": ' + b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b"}", "user", f"deeper than {MAX_DEPTH} levels"),
    (b'{"model": "m", "prompt": "red \\ud800"}', "prompt", "lone UTF-16 surrogate"),
    (HEAD + b', "\\udc00": 1}', None, "lone UTF-16 surrogate"),
]


@pytest.mark.parametrize("body, param, rule", CASES)
def test_a_refusal_names_the_field_and_states_the_rule(body, param, rule):
    with pytest.raises(RequestError) as refused:
        parse_request(CompletionRequest, body)
    assert refused.value.status == 400 and refused.value.param == param
    assert rule in str(refused.value)


def test_what_the_rules_allow_is_taken():
    request = parse_request(CompletionRequest, HEAD + b', "stop": ["a", "b", "c", "d"], "temperature": 0}')
    assert request.stops == ("a", "b", "c", "d") and request.temperature == 0
