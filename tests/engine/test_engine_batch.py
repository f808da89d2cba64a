"""Batched decoding: sequences decoded together get exactly the tokens each gets alone with
the same generator, ragged prompts, EOS and length cuts included, and batched sampling keeps
the target's sequence law."""

import pytest
import torch

from engine_fixtures import EOS, SIGNIFICANCE, VOCAB, chi_square_pvalue, exact_sequence_law
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
