"""The decoding loop's contracts: seeds, greedy decoding, EOS and length limits, the draft
law handed to the verifier, vocabulary padding, counting."""

import pytest
import torch

from support.models import EOS, VOCAB, tiny_model
from specbound.engine import CausalLM, Decoder, ModelDrafter, Processing, PromptLookupDrafter
from specbound.engine.methods import Levels, Method
from specbound.verifiers import get_verifier
from specbound.engine.methods import build_method

METHODS = {
    "autoregressive": {},
    "chain": {"gamma": 3},
    "tree": {"num_drafts": 2, "depth": 3, "verifier": "rrs"},
    "batch": {"num_drafts": 3, "gamma": 3},
    "decoding_opt": {"gamma": 3, "epsilon": 0.2},
}
PROMPT = [1, 2, 3]


def decoder(target_model, draft_model, processing=Processing(), eos=(EOS,)):
    drafter = ModelDrafter(CausalLM(draft_model), processing)
    return Decoder(CausalLM(target_model), drafter, processing, eos_token_ids=eos)


def greedy_continuation(model, prompt, length):
    tokens = list(prompt)
    for _ in range(length):
        with torch.no_grad():
            tokens.append(int(model(input_ids=torch.tensor([tokens])).logits[0, -1].argmax()))
    return tokens[len(prompt) :]


@pytest.mark.parametrize("name", METHODS)
def test_same_seed_same_tokens(name, target_model, draft_model):
    engine = decoder(target_model, draft_model, eos=())
    method = build_method(name, **METHODS[name])
    runs = [engine.generate(PROMPT, method, 12, torch.Generator().manual_seed(seed)).tokens
            for seed in (7, 7, 8)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


@pytest.mark.parametrize("name", METHODS)
def test_temperature_zero_reproduces_greedy_decoding(name, target_model, draft_model):
    """Every lossless method at T = 0 is greedy decoding, whatever its draws. Decoding-OPT
    with ε > 0 is not (it accepts a draft the target rules out with probability ε: its law
    is tested in ``test_engine_lossless``), so here it runs at ε = 0, where it is lossless."""
    options = {**METHODS[name], "epsilon": 0.0} if name == "decoding_opt" else METHODS[name]
    engine = decoder(target_model, draft_model, Processing(temperature=0), eos=())
    tokens = engine.generate(PROMPT, build_method(name, **options), 10,
                             torch.Generator().manual_seed(0)).tokens
    assert tokens == greedy_continuation(target_model, PROMPT, 10)


def test_identical_draft_at_temperature_zero_accepts_everything(target_model):
    engine = decoder(target_model, target_model, Processing(temperature=0), eos=())
    generation = engine.generate(PROMPT, build_method("chain", gamma=3), 12, torch.Generator())
    stats = generation.stats
    assert stats.acceptance_by_position == [1.0, 1.0, 1.0]
    assert stats.rejections == 0
    assert stats.tokens_per_target_call == 4.0
    assert stats.target_calls == 3 and stats.draft_calls == 9


@pytest.mark.parametrize("name", METHODS)
def test_eos_ends_and_max_new_tokens_cuts(name, target_model, draft_model):
    engine = decoder(target_model, draft_model, eos=(EOS, 4))
    method = build_method(name, **METHODS[name])
    generator = torch.Generator().manual_seed(3)
    reasons = set()
    for _ in range(20):
        generation = engine.generate(PROMPT, method, 5, generator)
        tokens = generation.tokens
        assert 1 <= len(tokens) <= 5
        assert all(token not in (EOS, 4) for token in tokens[:-1])
        if generation.finish_reason == "eos":
            assert tokens[-1] in (EOS, 4)
        else:
            assert generation.finish_reason == "length" and len(tokens) == 5
        assert generation.stats.tokens_generated == len(tokens)
        reasons.add(generation.finish_reason)
    assert reasons == {"eos", "length"}


def test_steps_never_draft_past_the_token_limit(target_model, draft_model):
    """With 2 tokens left a depth-4 tree is cut to depth 1: at most 2 tokens per step."""
    engine = decoder(target_model, draft_model, eos=())
    generation = engine.generate(PROMPT, build_method("tree", num_drafts=2, depth=4), 2,
                                 torch.Generator().manual_seed(0))
    assert generation.stats.draft_calls == 1
    assert len(generation.stats.attempts_by_position) == 1


def test_statistics_add_up(target_model, draft_model):
    engine = decoder(target_model, draft_model, eos=())
    generation = engine.generate(PROMPT, build_method("chain", gamma=3), 30,
                                 torch.Generator().manual_seed(1))
    stats = generation.stats
    assert stats.target_calls == stats.steps == len(stats.accepted_lengths)
    # every step emits its accepted drafts plus one token; only the last may be cut
    emitted = sum(stats.accepted_lengths) + stats.steps
    assert 0 <= emitted - stats.tokens_generated <= 3
    assert stats.rejections == sum(stats.attempts_by_position) - sum(stats.accepts_by_position)
    assert sum(stats.accepted_length_histogram) == stats.steps
    assert stats.tokens_per_target_call == pytest.approx(30 / stats.target_calls)
    assert set(stats.seconds) == {"prefill", "draft", "target", "verify"}
    assert stats.wall_seconds >= sum(stats.seconds.values()) * 0.99
    merged = stats.merge(stats)
    assert merged.tokens_generated == 60 and merged.attempts_by_position == [
        2 * count for count in stats.attempts_by_position]


def test_draft_law_given_to_the_verifier_is_the_law_the_drafts_came_from(target_model, draft_model):
    """Every internal node carries q(·|node's prefix) under the shared processing, and its
    drafts have positive probability under it."""
    processing = Processing(temperature=0.7, top_k=4)
    drafter = ModelDrafter(CausalLM(draft_model), processing)
    drafter.reset([PROMPT])
    method = Method("mixed", Levels((2, 3, 2)), tuple(map(get_verifier, ("rrs", "rrs_without_replacement", "greedy"))))
    tree, = drafter.draft([PROMPT], method, [3], [torch.Generator().manual_seed(0)])
    assert tree.forward_calls == 3
    for node, draft_probs in tree.draft_probs.items():
        path, walk = [], node
        while walk != 0:
            path.append(tree.tokens[walk])
            walk = tree.parents[walk]
        with torch.no_grad():
            logits = draft_model(input_ids=torch.tensor([PROMPT + path[::-1]])).logits[:, -1]
        torch.testing.assert_close(draft_probs, processing.probs(logits)[0], rtol=1e-5, atol=1e-6)
        assert bool(torch.all(draft_probs[tree.draft_tokens[node]] > 0))
        assert len(tree.children[node]) == len(set(tree.draft_tokens[node].tolist()))


def test_distinct_schemes_take_fewer_drafts_when_the_draft_law_is_narrow(target_model, draft_model):
    drafter = ModelDrafter(CausalLM(draft_model), Processing(top_k=2))
    drafter.reset([PROMPT])
    tree, = drafter.draft([PROMPT], build_method("tree", num_drafts=4, depth=1), [1], [torch.Generator()])
    assert sorted(tree.draft_tokens[0].tolist()) == sorted(set(tree.draft_tokens[0].tolist()))
    assert tree.draft_tokens[0].numel() == 2


def test_prompt_lookup_proposes_what_followed_the_latest_match():
    drafter = PromptLookupDrafter(vocab_size=VOCAB, max_ngram=2)
    assert drafter.propose([1, 2, 3, 4, 1, 2, 5, 1, 2], 3) == [5, 1, 2]  # latest "1 2"
    assert drafter.propose([3, 4, 5, 1, 2, 3], 2) == [4, 5]  # falls back to the 1-gram "3"
    assert drafter.propose([1, 2, 3], 2) == []
    tree, = drafter.draft([[1, 2, 3, 1, 2]], build_method("chain", gamma=2), [2], [torch.Generator()])
    assert tree.tokens == [2, 3, 1]
    assert tree.draft_probs[0].tolist() == [0, 0, 0, 1, 0, 0]


def test_prompt_lookup_refuses_branching():
    drafter = PromptLookupDrafter(vocab_size=VOCAB)
    with pytest.raises(ValueError, match="single chain"):
        drafter.draft([[1, 2, 1]], build_method("tree", num_drafts=2, depth=1, verifier="rrs"), [1], [torch.Generator()])


def test_vocabulary_padding_is_masked_and_other_mismatches_refused():
    target = tiny_model(seed=0)  # 6 tokens
    padded_draft = tiny_model(seed=1, vocab_size=VOCAB + 2)  # 2 padding rows
    with pytest.raises(ValueError, match="vocab_size"):
        decoder(target, padded_draft)
    engine = decoder(target, padded_draft, Processing(vocab_size=VOCAB))
    tokens = engine.generate(PROMPT, build_method("chain", gamma=2), 20,
                             torch.Generator().manual_seed(0)).tokens
    assert max(tokens) < VOCAB


@pytest.mark.parametrize(
    "arguments, message",
    [
        (([], 3), "prompt_ids"),
        ((PROMPT, 0), "max_new_tokens"),
    ],
)
def test_bad_arguments_name_the_argument(arguments, message, target_model, draft_model):
    engine = decoder(target_model, draft_model)
    with pytest.raises(ValueError, match=message):
        engine.generate(*arguments, build_method("chain"), torch.Generator())


def test_a_drafting_method_needs_a_drafter(target_model):
    engine = Decoder(CausalLM(target_model), None, Processing())
    with pytest.raises(ValueError, match="drafter"):
        engine.generate(PROMPT, build_method("chain"), 3, torch.Generator())
    assert len(engine.generate(PROMPT, build_method("autoregressive"), 3, torch.Generator()).tokens) == 3


@pytest.mark.parametrize(
    "name, options, message",
    [
        ("beam", {}, "method"),
        ("chain", {"gamma": 0}, "gamma"),
        ("tree", {"num_drafts": 3, "verifier": "spechub"}, "num_drafts"),
        ("tree", {"verifier": "nope"}, "verifier"),
    ],
)
def test_bad_methods_are_refused(name, options, message):
    with pytest.raises(ValueError, match=message):
        build_method(name, **options)


@pytest.mark.parametrize("name", METHODS)
def test_recorded_target_probs_are_the_target_law_of_each_emitted_token(name, target_model, draft_model):
    """Row i must be p(· | prompt, tokens[:i]) — what one full forward over the sequence
    gives — for accepted, residual and bonus tokens alike, up to an EOS or the length cut."""
    processing = Processing(temperature=0.8)
    engine = decoder(target_model, draft_model, processing)
    method = build_method(name, **METHODS[name])
    for seed in range(4):
        generation = engine.generate(PROMPT, method, 11, torch.Generator().manual_seed(seed),
                                     record_target_probs=True)
        tokens = generation.tokens
        with torch.no_grad():
            logits = target_model(input_ids=torch.tensor([PROMPT + tokens[:-1]])).logits[0, len(PROMPT) - 1 :]
        assert generation.target_probs.shape == (len(tokens), VOCAB)
        torch.testing.assert_close(generation.target_probs, processing.probs(logits.float()), atol=1e-5, rtol=0)
    assert engine.generate(PROMPT, method, 5, torch.Generator()).target_probs is None


@pytest.mark.parametrize("name", METHODS)
def test_one_head_call_per_step_keeps_the_law(name, target_model, draft_model):
    """With the target's head applied to every node at once, the emitted tokens' laws are the
    same rows (the head is applied to the same states): same seed, same tokens here."""
    processing = Processing(temperature=0.9)
    method = build_method(name, **METHODS[name])
    tokens = []
    for batch_heads in (False, True):
        engine = Decoder(CausalLM(target_model), ModelDrafter(CausalLM(draft_model), processing), processing,
                         eos_token_ids=[EOS], batch_heads=batch_heads)
        tokens.append([engine.generate(PROMPT, method, 12, torch.Generator().manual_seed(seed)).tokens
                       for seed in range(5)])
    assert tokens[0] == tokens[1]


@pytest.mark.parametrize("name, options", [("tree", {"num_drafts": 2, "depth": 3, "verifier": "rrs"}),
                                           ("chain", {"gamma": 3, "verifier": "block"}),
                                           ("tree", {"num_drafts": 2, "depth": 2, "verifier": "traversal"})])
def test_the_observer_and_the_recorded_expectations_see_one_step_and_change_no_token(name, options, target_model,
                                                                                     draft_model):
    """The observer and ``record_expected`` see a drafted step through one hook, before it
    is verified: the expectation recorded is the method's on the very rows the observer was
    shown, once per drafted step, and watching draws nothing (same seed, same tokens and
    counts as unwatched)."""
    processing = Processing(temperature=0.9)
    engine = decoder(target_model, draft_model, processing)
    method = build_method(name, **options)
    seen = []
    watched = engine.generate(PROMPT, method, 12, torch.Generator().manual_seed(3), record_expected=True,
                              observer=lambda index, tree, rows: seen.append((index, tree, rows)))
    plain = engine.generate(PROMPT, method, 12, torch.Generator().manual_seed(3))
    assert watched.tokens == plain.tokens
    assert watched.stats.accepted_lengths == plain.stats.accepted_lengths
    assert watched.stats.tree_sizes == plain.stats.tree_sizes and not plain.stats.expected_lengths
    assert len(seen) == len(watched.stats.expected_lengths) == sum(1 for size in watched.stats.tree_sizes if size)
    assert [index for index, _, _ in seen] == [0] * len(seen)
    for (_, tree, rows), expected in zip(seen, watched.stats.expected_lengths):
        assert rows.shape == (len(tree), VOCAB)
        assert expected == method.expected_accepted(tree.scored(rows))
