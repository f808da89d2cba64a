"""``Speculator.generate`` and a long prompt: a prompt and ``max_new_tokens`` beyond the models'
context are refused before any forward, naming the argument to change; a prompt longer than a
prefill chunk (``engine.backends.PREFILL_CHUNK``) is prefilled with its predicted seconds and a
progress bar per model on standard error, or silently without ``progress``."""

import pytest

from support.models import EOS, VOCAB, noisy_copy, tiny_model
from specbound.api import Speculator
from specbound.engine.backends import PREFILL_CHUNK
from specbound.models.pair import ModelPair


def pair_with_context(target_positions: int, draft_positions: int | None = None) -> ModelPair:
    """The engine tests' tiny pair, its position embeddings (rotary: any length) set to hold
    the given positions."""
    target = tiny_model(seed=0)
    draft = noisy_copy(target, seed=1, noise=0.5)
    target.config.max_position_embeddings = target_positions
    draft.config.max_position_embeddings = draft_positions or target_positions
    return ModelPair(target, draft, VOCAB, (EOS,), encode=lambda text: [1, 2, 3])


def forward_counter(pair: ModelPair) -> list:
    calls = []
    for model in (pair.target, pair.draft):
        model.base_model.register_forward_hook(lambda *arguments: calls.append(1))
    return calls


def test_a_prompt_and_new_tokens_beyond_the_context_are_refused_before_any_forward():
    pair = pair_with_context(64, draft_positions=48)
    calls = forward_counter(pair)
    speculator = Speculator(pair=pair, progress=False)
    with pytest.raises(ValueError, match="^max_new_tokens: 10 new tokens after the prompt's 40 exceed the models' "
                       "context of 48 positions; ask for at most 8 "):
        speculator.generate([1, 2] * 20, max_new_tokens=10, method="chain")
    with pytest.raises(ValueError, match="^prompt: 48 tokens, and the models' context holds 48 positions"):
        speculator.generate([1, 2] * 24, max_new_tokens=1, method="chain")
    assert calls == []
    assert len(speculator.generate([1, 2] * 20, max_new_tokens=8, method="chain", temperature=0).tokens) <= 8


@pytest.mark.parametrize("method", ["chain", "auto"])
def test_a_long_prefill_shows_its_estimate_and_progress_on_stderr(method, tmp_path, capsys):
    """The estimate needs the models' measured costs: ``auto`` measures them (into the
    cache), a fixed method prefills without one."""
    tokens = 2 * PREFILL_CHUNK + 100
    speculator = Speculator(pair=pair_with_context(4096), cache_dir=tmp_path)
    speculator.generate([1, 2, 3, 4] * (tokens // 4), max_new_tokens=2, method=method, temperature=0)
    shown = capsys.readouterr().err
    assert f"specbound: prefilling {tokens:,} prompt tokens" in shown
    assert ("s on this machine (from its measured forward costs" in shown) == (method == "auto")
    prefilled = tokens - 1  # the last prompt token is fed with the first step
    assert "prefill target: 100%" in shown and f"{prefilled}/{prefilled}" in shown
    if method == "chain":  # the draft prefills when it first drafts
        assert "prefill draft: 100%" in shown


def test_without_progress_a_long_prefill_is_silent(tmp_path, capsys):
    speculator = Speculator(pair=pair_with_context(4096), progress=False, cache_dir=tmp_path)
    speculator.generate([1, 2, 3, 4] * PREFILL_CHUNK, max_new_tokens=2, method="chain")
    assert capsys.readouterr().err == ""
