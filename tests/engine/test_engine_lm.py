"""The LM wrapper: tree attention scores every node as a separate forward would, alone or
with other sequences of different lengths in one batch, and committing a path (rollback of
the rest) leaves a cache equal to recomputing from scratch."""

import pytest
import torch
from transformers import Qwen2ForCausalLM

from support.models import extend, tiny_config, tiny_model
from specbound.engine.backends import Entries
from specbound.engine.backends.torch import CausalLM

PROMPT = [1, 2, 3, 4]
# A tree below the prompt: node tokens and parents (index into this list, -1 = last prompt token).
TREE_TOKENS = [5, 1, 2, 3, 3, 0, 4]
TREE_PARENTS = [-1, -1, 0, 0, 1, 3, 5]


def full_forward_logits(model, token_ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([token_ids])).logits[0, -1].float()


def node_prefix(node):
    path = []
    while node != -1:
        path.append(TREE_TOKENS[node])
        node = TREE_PARENTS[node]
    return PROMPT + path[::-1]


def score_tree(lm, tokens=TREE_TOKENS, parents=TREE_PARENTS):
    return lm.score([Entries(tokens, parents)]).logits(0)


@pytest.mark.parametrize("architecture", ["qwen2", "llama"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_tree_forward_equals_separate_forwards(architecture, attention):
    model = tiny_model(seed=3, architecture=architecture, attention=attention)
    lm = CausalLM(model)
    extend(lm, PROMPT)
    tree_logits = score_tree(lm)
    assert lm.forward_calls == 2
    for node in range(len(TREE_TOKENS)):
        expected = full_forward_logits(model, node_prefix(node))
        torch.testing.assert_close(tree_logits[node], expected, rtol=1e-5, atol=1e-5)


def test_tree_mask_is_honoured():
    """Control: the same flattened tree under a plain causal mask gives other logits, so
    the equality above depends on the tree mask being used."""
    model = tiny_model(seed=3)
    lm = CausalLM(model)
    extend(lm, PROMPT)
    tree_logits = score_tree(lm)
    causal_logits = full_forward_logits(model, PROMPT + TREE_TOKENS)
    assert (tree_logits[-1] - causal_logits).abs().max() > 1e-2


@pytest.mark.parametrize("path", [[], [0], [1], [0, 3], [1, 4], [0, 3, 5, 6]])
def test_commit_path_equals_recomputing(path):
    model = tiny_model(seed=4)
    lm = CausalLM(model)
    extend(lm, PROMPT)
    score_tree(lm)
    lm.commit([path])
    committed = PROMPT + [TREE_TOKENS[node] for node in path]
    assert lm.lengths == [len(committed)] and lm.cache.length == len(committed)  # nothing pending is kept
    next_logits = extend(lm, [2, 5])
    torch.testing.assert_close(next_logits[-1], full_forward_logits(model, committed + [2, 5]),
                               rtol=1e-5, atol=1e-5)
    # and a second tree on top of the rolled-back cache is still exact
    tree_logits = score_tree(lm, [3, 1], [-1, 0])
    torch.testing.assert_close(tree_logits[1], full_forward_logits(model, committed + [2, 5, 3, 1]),
                               rtol=1e-5, atol=1e-5)


def test_tree_from_an_empty_cache():
    """With nothing committed, root nodes take parent −1 and position 0."""
    model = tiny_model(seed=5)
    lm = CausalLM(model)
    logits = score_tree(lm, [1, 2, 3], [-1, 0, 0])
    torch.testing.assert_close(logits[2], full_forward_logits(model, [1, 3]), rtol=1e-5, atol=1e-5)


def test_commit_rejects_a_path_that_is_not_a_chain():
    lm = CausalLM(tiny_model(seed=4))
    extend(lm, PROMPT)
    score_tree(lm)
    with pytest.raises(ValueError, match="paths"):
        lm.commit([[0, 4]])  # node 4 is a child of node 1


def test_bad_parents_are_refused():
    lm = CausalLM(tiny_model(seed=4))
    extend(lm, PROMPT)
    with pytest.raises(ValueError, match="parent"):
        score_tree(lm, [1, 2], [-1, 1])  # a parent not yet created
    with pytest.raises(ValueError, match="token_ids"):
        extend(lm, [99])


class DoubledLogits(Qwen2ForCausalLM):
    """A model whose logits are not head(base_model(x)): the wrapper must fall back to
    full logits from every forward."""

    def forward(self, *args, **kwargs):
        output = super().forward(*args, **kwargs)
        output.logits = 2 * output.logits
        return output


def test_models_with_extra_logit_processing_are_scored_exactly():
    torch.manual_seed(6)
    model = DoubledLogits(tiny_config()).eval()
    lm = CausalLM(model)
    extend(lm, PROMPT)
    tree_logits = score_tree(lm)
    for node in range(len(TREE_TOKENS)):
        expected = full_forward_logits(model, node_prefix(node))
        torch.testing.assert_close(tree_logits[node], expected, rtol=1e-5, atol=1e-5)


ROW_PROMPTS = [[1, 2, 3, 4], [2, 5], [3, 1, 4, 1, 5, 2]]
ROW_TREES = [(TREE_TOKENS, TREE_PARENTS), ([4, 4, 1], [-1, 0, 0]), ([2], [-1])]


def batched(model, prompts=ROW_PROMPTS):
    lm = CausalLM(model)
    lm.reset(len(prompts))
    for row, prompt in enumerate(prompts):
        lm.prefill(row, prompt)
    return lm


def prefix_of(prompt, tokens, parents, node):
    path = []
    while node != -1:
        path.append(tokens[node])
        node = parents[node]
    return prompt + path[::-1]


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_a_batch_of_ragged_trees_is_scored_as_separate_forwards(attention):
    """Rows of different lengths and different trees in one forward: every node's logits
    equal a plain forward over its own prefix."""
    model = tiny_model(seed=3, attention=attention)
    lm = batched(model)
    scores = lm.score([Entries(tokens, parents) for tokens, parents in ROW_TREES])
    assert lm.forward_calls == 4  # three prefills, one batched forward
    for row, (prompt, (tokens, parents)) in enumerate(zip(ROW_PROMPTS, ROW_TREES)):
        logits = scores.logits(row)
        assert logits.shape[0] == len(tokens)
        for node in range(len(tokens)):
            expected = full_forward_logits(model, prefix_of(prompt, tokens, parents, node))
            torch.testing.assert_close(logits[node], expected, rtol=1e-5, atol=1e-5)


def test_batched_commits_of_different_paths_equal_recomputing():
    """Each row keeps its own path; a second round on the ragged cache (and a row that
    leaves the batch) still scores exactly."""
    model = tiny_model(seed=4)
    lm = batched(model)
    lm.score([Entries(tokens, parents) for tokens, parents in ROW_TREES])
    paths = [[1, 4], [0], []]
    lm.commit(paths)
    committed = [prompt + [tokens[node] for node in path]
                 for prompt, (tokens, _), path in zip(ROW_PROMPTS, ROW_TREES, paths)]
    assert lm.lengths == [len(sequence) for sequence in committed]
    scores = lm.score([Entries.chain([2, 5]), Entries([3, 1], [-1, -1]), Entries.chain([4])])
    lm.commit([[0, 1], [1], [0]])
    torch.testing.assert_close(scores.logits(0, 1)[0], full_forward_logits(model, committed[0] + [2, 5]),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(scores.logits(1, 1)[0], full_forward_logits(model, committed[1] + [1]),
                               rtol=1e-5, atol=1e-5)
    committed = [committed[0] + [2, 5], committed[1] + [1], committed[2] + [4]]
    lm.select_rows([2, 0])
    scores = lm.score([Entries.chain([3]), Entries.chain([1, 1])])
    torch.testing.assert_close(scores.logits(0, 0)[0], full_forward_logits(model, committed[2] + [3]),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(scores.logits(1, 1)[0], full_forward_logits(model, committed[0] + [1, 1]),
                               rtol=1e-5, atol=1e-5)


def test_a_single_chain_uses_no_mask_and_still_scores_exactly(monkeypatch):
    """Plain decoding and chains of one sequence take the model's own causal attention."""
    model = tiny_model(seed=4)
    lm = CausalLM(model)
    extend(lm, PROMPT)
    built = []
    original = CausalLM._mask
    monkeypatch.setattr(CausalLM, "_mask", lambda self, *args: built.append(1) or original(self, *args))
    logits = lm.score([Entries.chain([2, 5, 1])]).logits(0)
    assert not built
    torch.testing.assert_close(logits[2], full_forward_logits(model, PROMPT + [2, 5, 1]), rtol=1e-5, atol=1e-5)
    lm.commit([[0]])  # keep a prefix of the chain: nothing moves
    score_tree(lm, [3, 4], [-1, -1])
    assert built  # a tree needs the mask


def test_prefetched_logits_are_the_computed_ones_from_one_head_call():
    """A batched step applies the head once for every row's entries it will ask for; asked
    for then — by list, array, tensor or scalar — they are the logits computed one by one,
    and entries not prefetched are still computed."""
    import numpy as np

    from specbound.engine.backends.torch import Scores

    torch.manual_seed(0)
    head = torch.nn.Linear(4, 3, bias=False)
    calls = []
    head.register_forward_hook(lambda module, args, output: calls.append(args[0].shape[0]))
    states = torch.randn(2, 3, 4)
    expected = Scores(states, head, [3, 2]).logits(1, [0, 1])
    scores = Scores(states, head, [3, 2])
    calls.clear()
    scores.prefetch([(0, 0), (1, 0), (1, 1), (1, 0)])
    assert calls == [3]  # one call, the repeated pair once
    for entries in ([0, 1], np.array([0, 1]), torch.tensor([0, 1])):
        torch.testing.assert_close(scores.logits(1, entries), expected)
    for entry in (1, np.int64(1), torch.tensor(1)):
        torch.testing.assert_close(scores.logits(1, entry), expected[1:2])
    torch.testing.assert_close(scores.logits(1), expected)
    assert calls == [3]
    assert scores.logits(0).shape == (3, 3) and calls == [3, 3]  # row 0's entries 1, 2 were not prefetched
