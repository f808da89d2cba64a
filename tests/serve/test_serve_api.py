"""The server through the official ``openai`` client: completions and chat, streaming and
not, ``usage`` and the ``specbound`` object in every response, stop strings — and the tokens
of a seeded request are those ``Speculator.generate`` gives with that seed in-process."""

from __future__ import annotations

import openai
import pytest

from support.serving import API_KEY, MODEL
from support.chat_pair import tiny_pair
from specbound.api import Speculator

METHOD_OPTIONS = {"gamma": 3}


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def speculator():
    return Speculator(pair=tiny_pair())


def check_figures(response_like: dict, completion_tokens: int) -> None:
    usage, figures = response_like["usage"], response_like["specbound"]
    assert usage["completion_tokens"] == completion_tokens
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert figures["method"] == "chain:gamma=3" and figures["plan"] == {"chain γ=3": 1.0}
    assert figures["target_calls"] >= 1
    assert figures["tokens_per_target_call"] == pytest.approx(completion_tokens / figures["target_calls"])
    assert 0 <= figures["accepted_drafts"] <= figures["drafted_tokens"]
    assert figures["acceptance_rate"] is None or 0 <= figures["acceptance_rate"] <= 1
    assert len(figures["token_ids"]) == completion_tokens
    counted = figures["optimum_positions"]
    assert counted["positions"] == (0 if figures["acceptance_rate"] is None else counted["positions"])
    if counted["computed"]:
        assert 0 <= figures["expected_acceptance"] <= figures["optimal_acceptance"] + 1e-9 <= 1 + 1e-9
        assert figures["acceptance_gap"] == pytest.approx(figures["optimal_acceptance"] - figures["expected_acceptance"])
    else:
        assert figures["expected_acceptance"] is None and figures["acceptance_gap"] is None


def test_a_seeded_completion_is_what_generate_gives_with_that_seed(client, speculator):
    response = client.completions.create(model=MODEL, prompt="red cat runs", max_tokens=20, seed=5)
    alone = speculator.generate("red cat runs", 20, 0.8, method="chain", seed=5, chat=False, **METHOD_OPTIONS)
    choice = response.choices[0]
    assert choice.text == alone.text
    assert choice.finish_reason == {"eos": "stop", "length": "length"}[alone.finish_reason]
    assert response.usage.completion_tokens == len(alone.tokens)
    assert response.usage.prompt_tokens == 3
    check_figures(response.model_dump(), len(alone.tokens))


def test_a_seeded_chat_turn_is_what_generate_gives_with_the_chat_template(client, speculator):
    for seed in (1, 2):
        response = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "dog sleeps"}],
                                                  max_tokens=24, seed=seed, temperature=0.5)
        alone = speculator.generate("dog sleeps", 24, 0.5, method="chain", seed=seed, **METHOD_OPTIONS)
        assert response.choices[0].message.content == alone.text
        assert response.choices[0].message.role == "assistant"
        assert response.object == "chat.completion" and response.model == MODEL
        check_figures(response.model_dump(), len(alone.tokens))


def test_a_stream_sends_the_text_of_the_whole_response_then_done(client):
    whole = client.completions.create(model=MODEL, prompt="blue", max_tokens=30, seed=9)
    chunks = list(client.completions.create(model=MODEL, prompt="blue", max_tokens=30, seed=9, stream=True))
    assert "".join(chunk.choices[0].text for chunk in chunks) == whole.choices[0].text
    assert [chunk.choices[0].finish_reason for chunk in chunks][-1] == whole.choices[0].finish_reason
    assert all(chunk.choices[0].finish_reason is None for chunk in chunks[:-1])
    assert len({chunk.id for chunk in chunks}) == 1 and chunks[0].object == "text_completion"
    check_figures(chunks[-1].model_dump(), whole.usage.completion_tokens)


def test_a_chat_stream_opens_with_the_role_and_reports_usage_on_a_chunk_of_its_own(client):
    messages = [{"role": "system", "content": "green"}, {"role": "user", "content": "red"},
                {"role": "assistant", "content": "cat"}, {"role": "user", "content": [{"type": "text", "text": "dog"}]}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, seed=3)
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, seed=3, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices) == \
        whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert whole.usage.prompt_tokens == 9  # "system green user red assistant cat user dog assistant"
    check_figures(chunks[-1].model_dump(), whole.usage.completion_tokens)


def test_a_stop_string_ends_the_text_before_it(client):
    whole = client.completions.create(model=MODEL, prompt="red cat", max_tokens=40, seed=11)
    words = whole.choices[0].text.split()
    assert len(words) >= 4, "the seed must give a text long enough to cut"
    stop = words[3] if words.index(words[3]) == 3 else pytest.fail("choose a seed whose 4th word is new")
    for stream in (False, True):
        if stream:
            text = "".join(chunk.choices[0].text for chunk in client.completions.create(
                model=MODEL, prompt="red cat", max_tokens=40, seed=11, stop=[stop, "nothing"], stream=True))
        else:
            cut = client.completions.create(model=MODEL, prompt="red cat", max_tokens=40, seed=11, stop=stop)
            assert cut.choices[0].finish_reason == "stop"
            text = cut.choices[0].text
        assert text == " ".join(words[:3]) + " "


def test_the_model_is_listed_and_health_answers_without_a_key(client, server):
    assert [model.id for model in client.models.list()] == [MODEL]
    health = server.health()
    assert health["status"] == "ok" and health["model"] == MODEL and health["max_batch"] == 8


def test_the_clients_errors_carry_openais_error_object(client):
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="gpt-4", prompt="red")
    assert missing.value.body["param"] == "model" and missing.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=MODEL, prompt="red", n=2)
    assert refused.value.body["param"] == "n"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=client.base_url, api_key="wrong", max_retries=0).models.list()
