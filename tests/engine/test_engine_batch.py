"""Batched decoding: sequences decoded together get exactly the tokens each gets alone with
the same generator, ragged prompts, EOS and length cuts included, and batched sampling keeps
the target's sequence law."""

import pytest
import torch

from support.models import EOS, SIGNIFICANCE, VOCAB, chi_square_pvalue, exact_sequence_law
from specbound.engine import CausalLM, Decoder, ModelDrafter, Processing, PromptLookupDrafter
from specbound.engine.methods import build_method

PROMPTS = [[1, 2, 3], [4], [2, 5, 1, 3, 3, 1], [3, 3], [1, 2, 1, 2]]
METHODS = {
    "autoregressive": {},
    "chain": {"gamma": 3},
    "tree": {"num_drafts": 2, "depth": 2},
    "tree-kseq": {"num_drafts": 2, "depth": 2, "verifier": "kseq"},
    "sparse": {"budget": 6, "depth": 3, "width": 3},
    "batch": {"num_drafts": 2, "gamma": 3},
    "decoding_opt": {"gamma": 2, "epsilon": 0.2},
}


def decoder(target_model, draft_model, processing=Processing(), eos=(EOS,)):
    return Decoder(CausalLM(target_model), ModelDrafter(CausalLM(draft_model), processing), processing, eos)


@pytest.mark.parametrize("name", METHODS)
def test_each_sequence_of_a_batch_gets_the_tokens_it_gets_alone(name, target_model, draft_model):
    engine = decoder(target_model, draft_model, Processing(temperature=0.9))
    method = build_method(name.split("-")[0], **METHODS[name])
    for seed in range(3):
        alone = [engine.generate(prompt, method, 9, torch.Generator().manual_seed(seed * 10 + row))
                 for row, prompt in enumerate(PROMPTS)]
        together = engine.generate_batch(PROMPTS, method, 9,
                                         [torch.Generator().manual_seed(seed * 10 + row) for row in range(len(PROMPTS))])
        for single, batched in zip(alone, together):
            assert batched.tokens == single.tokens
            assert batched.finish_reason == single.finish_reason
            assert batched.stats.accepted_lengths == single.stats.accepted_lengths
    assert {generation.finish_reason for generation in together} <= {"eos", "length"}


def test_prompt_lookup_batches_too(target_model):
    processing = Processing()
    engine = Decoder(CausalLM(target_model), PromptLookupDrafter(VOCAB), processing, (EOS,))
    method = build_method("chain", gamma=3)
    alone = [engine.generate(prompt, method, 8, torch.Generator().manual_seed(row)).tokens
             for row, prompt in enumerate(PROMPTS)]
    together = engine.generate_batch(PROMPTS, method, 8, [torch.Generator().manual_seed(row) for row in range(5)])
    assert [generation.tokens for generation in together] == alone


@pytest.mark.parametrize("name", ["chain", "sparse"])
def test_suffix_decoding_batches_too(name, target_model):
    """Each row drafts from the history as it was when it started; the outputs of the rows
    that finish first join it meanwhile and change no other row's tokens."""
    from specbound.engine.suffix import SuffixDrafter, SuffixHistory

    def engine():
        history = SuffixHistory()
        history.add([2, 3, 1, 2, 4, 4, 1, 2, 3], before=[1])
        return Decoder(CausalLM(target_model), SuffixDrafter(VOCAB, history), Processing(), (EOS,))

    method = build_method(name, **{"chain": {"gamma": 3}, "sparse": {"budget": 6, "depth": 3, "width": 3}}[name])
    alone = [engine().generate(prompt, method, 8, torch.Generator().manual_seed(row)).tokens
             for row, prompt in enumerate(PROMPTS)]
    together = engine().generate_batch(PROMPTS, method, 8, [torch.Generator().manual_seed(row) for row in range(5)])
    assert [generation.tokens for generation in together] == alone


@pytest.mark.parametrize("name", ["chain", "sparse"])
def test_batched_decoding_generates_the_target_sequence_law(name, target_model, draft_model):
    """400 sequences in batches of 8 (each its own generator), the pooled χ² test of
    ``test_engine_lossless`` at level SIGNIFICANCE."""
    processing = Processing()
    engine = decoder(target_model, draft_model, processing)
    method = build_method(name, **{"chain": {"gamma": 2}, "sparse": {"budget": 5, "depth": 2, "width": 3}}[name])
    samples = []
    for batch in range(50):
        generators = [torch.Generator().manual_seed(1000 * batch + row) for row in range(8)]
        samples += [tuple(g.tokens) for g in engine.generate_batch([[1]] * 8, method, 3, generators)]
    law = exact_sequence_law(target_model, [1], processing, 3)
    assert chi_square_pvalue(samples, law) > SIGNIFICANCE


def test_a_streamer_gets_the_prompt_then_every_token_once(target_model, draft_model):
    class Collect:
        def __init__(self):
            self.parts, self.ended = [], False

        def put(self, value):
            self.parts.append(value.tolist())

        def end(self):
            self.ended = True

    streamer = Collect()
    generation = decoder(target_model, draft_model).generate([1, 2], build_method("chain", gamma=3), 10,
                                                             torch.Generator().manual_seed(0), streamer=streamer)
    assert streamer.parts[0] == [1, 2] and streamer.ended
    assert sum(streamer.parts[1:], []) == generation.tokens


def test_prompts_longer_than_the_positions_are_refused(target_model, draft_model):
    engine = decoder(target_model, draft_model)
    limit = target_model.config.max_position_embeddings
    with pytest.raises(ValueError, match="max_position_embeddings"):
        engine.generate([1] * (limit - 2), build_method("chain"), 5, torch.Generator())


@pytest.mark.parametrize("name", ["autoregressive", "chain", "sparse", "tree-kseq"])
def test_sequences_joining_and_leaving_a_running_batch_get_the_tokens_they_get_alone(name, target_model,
                                                                                     draft_model):
    """The step-level API: sequences join between steps (each with its own token limit),
    one is removed mid-way; every one that runs to its end gets its solo tokens."""
    engine = decoder(target_model, draft_model, Processing(temperature=0.9))
    method = build_method(name.split("-")[0], **METHODS[name])
    limits = [9, 5, 12, 7, 10]
    alone = [engine.generate(prompt, method, limit, torch.Generator().manual_seed(40 + row)).tokens
             for row, (prompt, limit) in enumerate(zip(PROMPTS, limits))]
    batch = engine.start(method)
    joined = {}
    removed = None
    for step in range(200):
        if step in (0, 1, 3):  # two join at once, then one by one into the running batch
            for row in {0: [0, 1], 1: [2], 3: [3, 4]}[step]:
                joined[row] = batch.add(PROMPTS[row], limits[row], torch.Generator().manual_seed(40 + row))
        if step == 4:
            assert batch.active, "every sequence ended before one could be removed"
            removed = batch.active[len(batch.active) // 2]
            batch.remove(removed)
            assert removed.done and removed.finish_reason == "removed"
            assert engine.target.batch_size == len(batch.active) and removed not in batch.sequences
        batch.step()
        assert engine.target.batch_size == len(batch.active)
        if step > 3 and not batch.sequences:
            break
    assert not batch.sequences and batch.step() == []
    for row, sequence in joined.items():
        if sequence is not removed:
            assert sequence.new_tokens == alone[row], row
            assert batch.generation(sequence).tokens == alone[row]
    removed_row = next(row for row, sequence in joined.items() if sequence is removed)
    assert removed.new_tokens == alone[removed_row][: len(removed.new_tokens)]


def test_a_batch_reopens_after_it_emptied(target_model, draft_model):
    """Every sequence gone, the next one resets the caches and decodes as it would alone."""
    engine = decoder(target_model, draft_model)
    method = build_method("chain", gamma=3)
    batch = engine.start(method)
    first = batch.add([1, 2], 4, torch.Generator().manual_seed(0))
    while batch.sequences:
        batch.step()
    second = batch.add([3, 1, 4], 6, torch.Generator().manual_seed(1))
    while batch.sequences:
        batch.step()
    assert first.new_tokens == engine.generate([1, 2], method, 4, torch.Generator().manual_seed(0)).tokens
    assert second.new_tokens == engine.generate([3, 1, 4], method, 6, torch.Generator().manual_seed(1)).tokens


def test_a_bad_sequence_is_refused_when_added_and_the_batch_runs_on(target_model, draft_model):
    engine = decoder(target_model, draft_model)
    batch = engine.start(build_method("chain", gamma=2))
    kept = batch.add([1, 2], 3, torch.Generator().manual_seed(0))
    limit = target_model.config.max_position_embeddings
    for prompt, limit_tokens, message in (([], 3, "prompt_ids"), ([1] * limit, 3, "max_position_embeddings"),
                                          ([1, VOCAB], 3, "prompt_ids"), ([1], 0, "max_new_tokens")):
        with pytest.raises(ValueError, match=message):
            batch.add(prompt, limit_tokens, torch.Generator())
    while batch.sequences:
        batch.step()
    assert len(kept.new_tokens) == 3 or kept.finish_reason == "eos"


def test_an_added_row_scores_as_the_same_sequence_alone(target_model):
    """CausalLM.add_row: the new row, prefilled, gives the logits its sequence gets in a
    cache of its own, and the rows already there keep theirs."""
    from specbound.engine import CausalLM
    from specbound.engine.backends import Entries

    batched, alone = CausalLM(target_model), CausalLM(target_model)
    batched.reset(1)
    batched.prefill(0, [1, 2, 3, 4])
    before = batched.score([Entries.chain([5])]).logits(0)
    batched.commit([[]])
    assert batched.add_row() == 1 and batched.lengths == [4, 0]
    batched.prefill(1, [2, 5])
    scores = batched.score([Entries.chain([5]), Entries([3, 1], [-1, -1])])
    alone.reset(1)
    alone.prefill(0, [2, 5])
    expected = alone.score([Entries([3, 1], [-1, -1])]).logits(0)
    torch.testing.assert_close(scores.logits(1), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(scores.logits(0), before, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="commit"):
        batched.add_row()
    batched.commit([[0], [1]])
    assert batched.lengths == [5, 3]
