"""Suffix decoding (``engine.suffix``): the structure's counts and cap, the trees it drafts
within a method's shape, their exact optimality (every node reached with its path's target
probability), the target's sequence law on both backends with a global history present
(the pooled χ² test of ``test_engine_lossless`` at level SIGNIFICANCE = 0.001, 400
sequences, whose power is stated there), and the history across sequences and batches."""

import numpy as np
import pytest
import torch

from support.models import EOS, SIGNIFICANCE, VOCAB, chi_square_pvalue, exact_sequence_law
from support.lossless import llamacpp_law
from specbound.engine import CausalLM, Decoder, Processing
from specbound.engine.methods import Budget, Levels, build_method
from specbound.engine.drafters import ModelDrafter, PromptLookupDrafter
from specbound.engine.replay import replay
from specbound.engine.suffix import MIN_MATCH, SuffixDrafter, SuffixHistory, SuffixText, best_first, continuations

PROMPT = [2, 1]
NEW_TOKENS = 3
SAMPLES = 400
CASES = {  # method options; every per-node verifier here draws distinct tokens, traversal decides a whole tree
    "chain": ("chain", {"gamma": 2}),
    "tree-rrs_without_replacement": ("tree", {"num_drafts": 2, "depth": 2}),
    "tree-greedy": ("tree", {"num_drafts": 2, "depth": 2, "verifier": "greedy"}),
    "sparse-traversal": ("sparse", {"budget": 5, "depth": 2, "width": 3, "verifier": "traversal"}),
}


def likely_outputs(target_model, prompt=PROMPT, count=6):
    """The target's ``count`` likeliest continuations of ``prompt`` (3 tokens): earlier
    outputs that predict this prompt's continuation well, and branch where it does."""
    law = exact_sequence_law(target_model, prompt, Processing(), NEW_TOKENS)
    return sorted(law, key=law.get, reverse=True)[:count]


def history_of(outputs, before=PROMPT) -> SuffixHistory:
    history = SuffixHistory()
    for output in outputs:
        history.add(list(output), before)
    return history


def suffix_decoder(target_lm, history, min_match=MIN_MATCH):
    return Decoder(target_lm, SuffixDrafter(VOCAB, history, min_match=min_match), Processing(), eos_token_ids=[EOS])


# -- the structure ------------------------------------------------------------------------
def test_continuations_count_what_followed_the_longest_suffix():
    texts = [[SuffixText([5, 1, 2, 3, 9, 1, 2, 4, 7, 1, 2, 3, 8])]]
    total, trie = continuations(texts, [0, 1, 2], depth=2)
    assert total == 3  # "1 2" three times: the longest suffix found (with 0 before it, never)
    assert {token: count for token, (count, _) in trie.items()} == {3: 2, 4: 1}
    assert {token: count for token, (count, _) in trie[3][1].items()} == {9: 1, 8: 1}
    assert continuations(texts, [6, 6], depth=2) == (0, {})
    assert continuations(texts, [0, 2], depth=2, min_match=2) == (0, {})  # only "2" matches: too short
    total, trie = continuations(texts, [0, 2], depth=1)  # ... but long enough by default: "2" three times
    assert total == 3 and {token: count for token, (count, _) in trie.items()} == {3: 2, 4: 1}
    assert continuations(texts, [0, 2, 3, 9], depth=2, min_match=4) == (0, {})  # "2 3 9" is 3 tokens


def test_each_source_gets_its_own_share_of_the_occurrences():
    """A request whose own text repeats its last two tokens more than ``max_occurrences``
    times still drafts from a longer match in the history."""
    own = SuffixText([7, 1, 2] * 10)
    history = [SuffixText([3, 1, 2, 5])]
    assert continuations([[own], history], [3, 1, 2], depth=1, max_occurrences=4) == (1, {5: [1, {}]})
    assert continuations([[own, *history]], [3, 1, 2], depth=1, max_occurrences=4)[0] == 4  # starved of it


def test_the_current_context_is_read_up_to_its_last_token():
    text = SuffixText([1, 2, 3])
    text.extend([1, 2])
    total, trie = continuations([[text]], [1, 2, 3, 1, 2], depth=3)
    assert total == 1 and list(trie) == [3] and list(trie[3][1]) == [1]  # the continuation runs into the context


def test_history_evicts_the_oldest_outputs_beyond_its_cap():
    history = SuffixHistory(max_tokens=10, max_match=2)
    history.add([1, 2, 3], before=[7, 8, 9])  # kept with the 2 tokens before it: 5 tokens
    snapshot = history.snapshot()
    history.add([4, 5, 6, 7], before=[9])
    assert history.num_tokens == 10 and len(history) == 2
    history.add([8], before=[])
    assert len(history) == 2 and history.num_tokens == 6  # the first output went
    assert len(snapshot) == 1 and snapshot[0].tokens == [8, 9, 1, 2, 3]  # a snapshot keeps what it held
    history.add(list(range(30)))
    assert history.num_tokens == 10 and history.snapshot()[-1].tokens == list(range(20, 30))


def test_a_history_output_is_continued_from_its_first_token_on():
    history = SuffixHistory(max_match=3)
    history.add([3, 4], before=[9, 1, 1, 2])
    text = history.snapshot()[0]
    assert text.tokens == [1, 1, 2, 3, 4]
    assert text.occurrences((1, 2), 10) == [2] and text.occurrences((1, 1), 10) == []  # 1 → 2 is context only


def test_trees_keep_the_likeliest_continuations_within_the_shape():
    texts = [[SuffixText([1, 2, 3, 1, 2, 3, 1, 2, 4, 1, 2, 5, 5, 0])]]
    total, trie = continuations(texts, [1, 2], depth=3)
    assert total == 4 and list(trie) == [5, 4, 3]  # newest occurrence first: it wins ties
    chain = best_first(trie, total, Levels((1, 1, 1)), depth=3)
    assert [token for _, token, _ in chain] == [3, 1, 2]  # the most frequent path
    tree = best_first(trie, total, Levels((2, 1)), depth=2)
    assert tree == [(0, 3, 2), (1, 1, 2), (0, 5, 1), (3, 5, 1)]  # two children at the root, one below
    budget = best_first(trie, total, Budget(nodes=4, max_depth=3, width=2, max_children=2), depth=3)
    assert budget == [(0, 3, 2), (1, 1, 2), (2, 2, 2), (0, 5, 1)]
    assert best_first(trie, total, Budget(4, 3, 2, 2, min_value=0.25), depth=3) == budget[:3]
    assert best_first(trie, total, Budget(5, 2, width=1, max_children=2), depth=2) == budget[:2]


def test_a_budgeted_tree_holds_the_chain_before_likelier_branches():
    """The chain takes the most frequent first token (3, thrice), then the newest of the
    continuations seen once; a branch seen twice (4 4) is likelier by count, but comes after."""
    text = SuffixText([1, 2, 3, 7, 1, 2, 3, 8, 1, 2, 4, 4, 1, 2, 4, 4, 1, 2, 3, 9])
    total, trie = continuations([[text]], [1, 2], depth=2)
    chain = best_first(trie, total, Levels((1, 1)), depth=2)
    assert chain == [(0, 3, 3), (1, 9, 1)]
    assert best_first(trie, total, Budget(nodes=3, max_depth=2, width=2, max_children=2), depth=2) == [
        *chain, (0, 4, 2)]


def test_a_budgeted_tree_holds_the_chain_of_its_depth():
    """Three continuations seen once each: equal estimates, so the tree follows the newest
    (the chain's) to full depth before it branches: it holds every node the chain drafts."""
    text = SuffixText([1, 2, 3, 4, 5, 6, 7, 1, 2, 5, 4, 3, 2, 1, 1, 2, 4, 4, 4, 4, 4, 0])
    total, trie = continuations([[text]], [1, 2], depth=5)
    chain = best_first(trie, total, Levels((1,) * 5), depth=5)
    tree = best_first(trie, total, Budget(nodes=8, max_depth=5, width=3, max_children=3), depth=5)
    assert [token for _, token, _ in chain] == [4, 4, 4, 4, 4]  # the newest occurrence's
    assert tree[:5] == chain and tree[5:] == [(0, 5, 1), (6, 4, 1), (7, 3, 1)]  # then the next newest, deep first


# -- the drafted trees and their verification ----------------------------------------------
def path_probabilities(tree, target_rows) -> np.ndarray:
    """p(path to v) for every node v ≠ root: the target's probabilities along v's path.  # -> [nodes − 1]"""
    rows = target_rows.double().numpy()
    rows /= rows.sum(axis=1, keepdims=True)
    reach = np.ones(len(tree))
    for node in range(1, len(tree)):
        reach[node] = reach[tree.parents[node]] * rows[tree.parents[node], tree.tokens[node]]
    return reach[1:]


def drafted_steps(target_model, name, seeds):
    """(exact E[accepted | drafted tree], Σ_v p(path to v), whether the tree branches) per drafted step."""
    method_name, options = CASES[name]
    method = build_method(method_name, **options)
    steps = []

    def observe(index, tree, target_rows):
        steps.append((method.expected_accepted(tree.scored(target_rows)), path_probabilities(tree, target_rows).sum(),
                      any(len(drafts) > 1 for drafts in tree.draft_tokens.values())))

    decoder = suffix_decoder(CausalLM(target_model), history_of(likely_outputs(target_model)))
    for seed in seeds:
        decoder.generate(PROMPT, method, 6, torch.Generator().manual_seed(seed), observer=observe)
    assert any(branches for *_, branches in steps)
    return steps


def test_greedy_suffix_trees_reach_every_node_with_its_target_path_probability(target_model):
    """Greedy draws the children in order of count, a fixed order: the exact E[accepted | tree]
    is Σ_v p(path to v), the most any lossless verifier of a fixed tree accepts (``engine.suffix``)."""
    for expected, optimum, _ in drafted_steps(target_model, "tree-greedy", range(6)):
        assert expected == pytest.approx(optimum, abs=1e-9)


@pytest.mark.parametrize("name", ["tree-rrs_without_replacement", "sparse-traversal"])
def test_suffix_trees_drawn_in_random_order_reach_the_optimum_on_average(name, target_model):
    """Without replacement the children come in an order drawn from q, and the exact
    E[accepted | tree, order] varies with it; over the order it is Σ_v p(path to v), so the
    mean difference over the drafted steps is 0 (within 4 standard errors), though single
    steps differ."""
    steps = drafted_steps(target_model, name, range(40))
    differences = np.array([expected - optimum for expected, optimum, _ in steps])
    assert np.abs(differences).max() > 1e-3
    assert abs(differences.mean()) < 4 * differences.std(ddof=1) / np.sqrt(len(differences))


@pytest.mark.parametrize("name, options", [("tree", {"num_drafts": 2, "depth": 2, "verifier": "kseq"}),
                                           ("sparse", {"budget": 4, "depth": 2, "verifier": "global_resolution"})])
def test_a_verifier_of_independent_drafts_is_refused_before_any_token(name, options, target_model):
    decoder = suffix_decoder(CausalLM(target_model), SuffixHistory())  # nothing to draft from: refused all the same
    with pytest.raises(ValueError, match="^method: suffix drafts are a fixed set"):
        decoder.generate(PROMPT, build_method(name, **options), 3, torch.Generator())


def sample_sequences(decoder, method, batched):
    generators = [torch.Generator().manual_seed(index) for index in range(SAMPLES)]
    if batched:
        return [tuple(g.tokens) for g in decoder.generate_batch([PROMPT] * SAMPLES, method, NEW_TOKENS, generators)]
    return [tuple(decoder.generate(PROMPT, method, NEW_TOKENS, generator).tokens) for generator in generators]


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_suffix_drafts_generate_the_target_sequence_law(case, target_model):
    """Batched: every sequence drafts from the same history (the target's likeliest outputs)."""
    name, options = case
    decoder = suffix_decoder(CausalLM(target_model), history_of(likely_outputs(target_model)))
    samples = sample_sequences(decoder, build_method(name, **options), batched=True)
    assert decoder.drafter.history.num_tokens > 6 * 5  # the 400 outputs joined it as their rows left
    assert chi_square_pvalue(samples, exact_sequence_law(target_model, PROMPT, Processing(), NEW_TOKENS)) > SIGNIFICANCE


@pytest.mark.slow
def test_suffix_drafts_from_earlier_outputs_generate_the_target_sequence_law(target_model):
    """One sequence after another: each drafts from the outputs of all before it."""
    decoder = suffix_decoder(CausalLM(target_model), SuffixHistory())
    samples = sample_sequences(decoder, build_method("sparse", budget=5, depth=2, width=3), batched=False)
    assert len(decoder.drafter.history) == SAMPLES
    assert chi_square_pvalue(samples, exact_sequence_law(target_model, PROMPT, Processing(), NEW_TOKENS)) > SIGNIFICANCE


@pytest.mark.parametrize("name", ["tree-rrs_without_replacement",
                                  pytest.param("sparse-traversal", marks=pytest.mark.slow)])
def test_suffix_drafts_on_llama_cpp_generate_the_target_sequence_law(name, target_model, draft_model, tmp_path):
    from specbound.engine.backends import llamacpp

    if not llamacpp.llama_cpp_available():
        pytest.skip("llama-cpp-python is not installed")
    from specbound.models.tiny import write_gguf

    model = llamacpp.LlamaCppModel(write_gguf(target_model, tmp_path / "target.gguf"), threads=1)
    method_name, options = CASES[name]
    decoder = suffix_decoder(llamacpp.LlamaCppLM(model, context_cells=256), history_of(likely_outputs(target_model)))
    samples = sample_sequences(decoder, build_method(method_name, **options), batched=False)
    law = llamacpp_law(llamacpp.LlamaCppLM(model, context_cells=256), PROMPT, Processing(), NEW_TOKENS)
    assert chi_square_pvalue(samples, law) > SIGNIFICANCE


# -- history across sequences and batches ---------------------------------------------------
def test_a_sequence_drafts_from_the_outputs_of_those_before_it(target_model):
    decoder = suffix_decoder(CausalLM(target_model), SuffixHistory(), min_match=2)
    method = build_method("sparse", budget=6, depth=3, width=3)
    prompt = [3, 4]  # nothing to match in the prompt alone
    first = decoder.generate(prompt, method, 8, torch.Generator().manual_seed(0))
    assert first.stats.tree_sizes[0] == 0
    assert decoder.drafter.history.snapshot()[-1].tokens[-len(first.tokens):] == first.tokens  # the whole output
    second = decoder.generate(prompt, method, 8, torch.Generator().manual_seed(0))
    assert second.stats.tree_sizes[0] > 0  # drafted from the first's output at once


PROMPTS = [[1, 2, 3], [4], [2, 5, 1, 3, 3, 1], [3, 3], [1, 2, 1, 2]]


@pytest.mark.parametrize("name", ["chain", "sparse-traversal"])
def test_each_sequence_of_a_batch_gets_the_tokens_it_gets_alone_with_a_history(name, target_model):
    """Alone, each sequence drafts from the history as it is; batched, the ones that finish
    first add their outputs meanwhile, which the others must not see."""
    method_name, options = CASES[name]
    method = build_method(method_name, **options)
    outputs = likely_outputs(target_model)
    alone = []
    for row, prompt in enumerate(PROMPTS):
        decoder = suffix_decoder(CausalLM(target_model), history_of(outputs))
        alone.append(decoder.generate(prompt, method, 4 + 2 * row, torch.Generator().manual_seed(row)))
    decoder = suffix_decoder(CausalLM(target_model), history_of(outputs))
    batch = decoder.start(method)
    together = [batch.add(prompt, 4 + 2 * row, torch.Generator().manual_seed(row))
                for row, prompt in enumerate(PROMPTS)]
    while batch.sequences:
        batch.step()
    assert len(decoder.drafter.history) == len(outputs) + len(PROMPTS)
    for single, sequence in zip(alone, together):
        assert sequence.new_tokens == single.tokens
        assert sequence.stats.tree_sizes == single.stats.tree_sizes


# -- auto, the API and a server ---------------------------------------------------------------
def test_auto_with_suffix_drafts_is_lossless(target_model, draft_model):
    """auto choosing step by step among plain decoding, the draft model, prompt lookup and
    suffix drafts (one drafter behind the other) keeps the target's law; suffix is chosen."""
    from specbound.engine import ModelDrafter, PromptLookupDrafter
    from specbound.engine.costs import Costs
    from specbound.engine.drafters import DrafterChoice
    from specbound.engine.planner import Planner, default_candidates
    from specbound.engine.precisions import AS_LOADED

    free = Costs({1: 1.0, 16: 1.0})  # rows free: drafting pays
    planner = Planner(free, {AS_LOADED: Costs({1: 0.5, 16: 0.5})}, default_candidates(2, lookup=True, suffix=True),
                      replan_every=1)
    drafters = {"model": ModelDrafter(CausalLM(draft_model), Processing(), planner.variant_for_rows),
                "lookup": PromptLookupDrafter(VOCAB),
                "suffix": SuffixDrafter(VOCAB, history_of(likely_outputs(target_model)))}
    decoder = Decoder(CausalLM(target_model), DrafterChoice(drafters), Processing(), eos_token_ids=[EOS])
    generator = torch.Generator().manual_seed(0)
    samples = [tuple(decoder.generate(PROMPT, planner, NEW_TOKENS, generator).tokens) for _ in range(SAMPLES)]
    assert {label.split()[0] for _, label, _ in planner.history} >= {"suffix"}
    assert chi_square_pvalue(samples, exact_sequence_law(target_model, PROMPT, Processing(), NEW_TOKENS)) > SIGNIFICANCE


def test_a_second_request_to_a_server_drafts_from_the_first():
    """One server (its decoding loop in-process, one decoder): the same greedy request twice;
    the second drafts the first's answer from the start, so it takes fewer target calls."""
    import queue

    from specbound.api import Speculator
    from specbound.engine.processing import Sampling
    from specbound.models.tiny import tiny_pair
    from specbound.serve.batching import BatchingLoop, Finished, Job

    speculator = Speculator(pair=tiny_pair(), drafter="suffix", progress=False)
    loop = BatchingLoop(speculator, "sparse", {"budget": 6, "depth": 3, "width": 3}, max_batch=2, max_queue=2)
    loop.start()
    figures = []
    try:
        for _ in range(2):
            events = queue.Queue()
            loop.submit(Job([1, 2, 3, 4, 5], 16, Sampling(0.0), 7, (), events.put))
            event = events.get(timeout=30)
            while not isinstance(event, Finished):
                event = events.get(timeout=30)
            figures.append(event.specbound)
    finally:
        loop.stop(10)
    first, second = figures
    assert second["token_ids"] == first["token_ids"]  # greedy: the target's argmax path both times
    assert second["target_calls"] < first["target_calls"]


# -- replay ---------------------------------------------------------------------------------
@pytest.mark.parametrize("case", [*CASES.values(), ("chain", {"gamma": 3}, "prompt-lookup")],
                         ids=[*CASES.keys(), "chain-prompt-lookup"])
def test_replaying_the_engine_s_output_gives_its_accepted_lengths_step_by_step(case, target_model):
    """``replay`` of a text the engine emitted accepts at every step what the engine accepted:
    a lossless verifier of fixed drafts accepts the deepest drafted path its own emitted
    tokens begin with, pointwise (``engine.replay``). Each output joins both suffix
    drafters' histories, so later sequences draft from a history that grew alike."""
    name, options, *lookup = case
    method = build_method(name, **options)
    if lookup:
        decoder = Decoder(CausalLM(target_model), PromptLookupDrafter(VOCAB), Processing(), eos_token_ids=[EOS])
        replayer, prompt = PromptLookupDrafter(VOCAB), [1, 2, 3, 1, 2, 3, 1, 2]
    else:
        decoder = suffix_decoder(CausalLM(target_model), history_of(likely_outputs(target_model)))
        replayer, prompt = SuffixDrafter(VOCAB, history_of(likely_outputs(target_model))), PROMPT
    drafted = 0
    for seed in range(30):
        generation = decoder.generate(prompt, method, 6, torch.Generator().manual_seed(seed))
        accepted = replay(replayer, method, prompt, generation.tokens, 6)
        assert accepted == generation.stats.accepted_lengths, seed
        drafted += sum(accepted)
    assert drafted >= 20  # drafts were accepted: the comparison was not of empty steps
    if not lookup:
        assert replayer.history.num_tokens == decoder.drafter.history.num_tokens


def test_replay_refuses_what_it_cannot_replay(target_model, draft_model):
    method = build_method("chain", gamma=2)
    with pytest.raises(ValueError, match="^text: 4 tokens"):
        replay(SuffixDrafter(VOCAB), method, PROMPT, [1, 2, 3, 4], 3)
    with pytest.raises(ValueError, match="^prompt: empty"):
        replay(SuffixDrafter(VOCAB), method, [], [1], 3)
    with pytest.raises(ValueError, match="^method: suffix drafts are a fixed set"):
        replay(SuffixDrafter(VOCAB), build_method("tree", num_drafts=2, depth=2, verifier="kseq"), PROMPT, [1], 3)
    with pytest.raises(ValueError, match="^drafter: its drafts are a draft model's draws"):
        replay(ModelDrafter(CausalLM(draft_model), Processing()), method, PROMPT, [1], 3)
