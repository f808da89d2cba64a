"""Request bodies in-process: a refusal names the field and states the rule that was broken
— a top_p that is not a finite number (JSON's Infinity), a body that is not UTF-8, nested too
deep, or holding a lone surrogate (the stop and NaN cases: ``test_request_rules``)."""

from __future__ import annotations

import pytest

from specbound.serve.schemas import MAX_DEPTH, CompletionRequest, RequestError, parse_request

HEAD = b'{"model": "m", "prompt": "red"'

CASES = [
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
    request = parse_request(CompletionRequest, HEAD + b', "temperature": 0, "user": "\\ud83d\\ude00"}')
    assert request.temperature == 0 and request.user == "\U0001f600"  # a surrogate pair is one character
