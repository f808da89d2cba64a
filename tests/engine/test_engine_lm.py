"""The LM wrapper: tree attention scores every node as a separate forward would, and
committing a path (rollback of the rest) leaves a cache equal to recomputing from scratch."""

import pytest
import torch
from transformers import Qwen2ForCausalLM

from engine_fixtures import tiny_config, tiny_model
from specbound.engine.lm import CausalLM

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


def tree_parents(lm):
    """Absolute cache positions of the tree nodes' parents after PROMPT is committed."""
    start = lm.length
    return [start - 1 if parent == -1 else start + parent for parent in TREE_PARENTS]


@pytest.mark.parametrize("architecture", ["qwen2", "llama"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_tree_forward_equals_separate_forwards(architecture, attention):
    model = tiny_model(seed=3, architecture=architecture, attention=attention)
    lm = CausalLM(model)
    lm.extend(PROMPT)
    tree_logits = lm.extend_tree(TREE_TOKENS, tree_parents(lm)).logits()
    assert lm.forward_calls == 2
    for node in range(len(TREE_TOKENS)):
        expected = full_forward_logits(model, node_prefix(node))
        torch.testing.assert_close(tree_logits[node], expected, rtol=1e-5, atol=1e-5)


def test_tree_mask_is_honoured():
    """Control: the same flattened tree under a plain causal mask gives other logits, so
    the equality above depends on the tree mask being used."""
    model = tiny_model(seed=3)
    lm = CausalLM(model)
    lm.extend(PROMPT)
    tree_logits = lm.extend_tree(TREE_TOKENS, tree_parents(lm)).logits()
    causal_logits = full_forward_logits(model, PROMPT + TREE_TOKENS)
    assert (tree_logits[-1] - causal_logits).abs().max() > 1e-2


@pytest.mark.parametrize("path", [[], [0], [1], [0, 3], [1, 4], [0, 3, 5, 6]])
def test_commit_path_equals_recomputing(path):
    model = tiny_model(seed=4)
    lm = CausalLM(model)
    lm.extend(PROMPT)
    lm.extend_tree(TREE_TOKENS, tree_parents(lm))
    start = len(PROMPT)
    lm.commit([start + node for node in path])
    committed = PROMPT + [TREE_TOKENS[node] for node in path]
    assert lm.committed_length == len(committed) == lm.length
    next_logits = lm.extend([2, 5])
    torch.testing.assert_close(next_logits[-1], full_forward_logits(model, committed + [2, 5]),
                               rtol=1e-5, atol=1e-5)
    # and a second tree on top of the rolled-back cache is still exact
    tree_logits = lm.extend_tree([3, 1], [lm.length - 1, lm.length]).logits()
    torch.testing.assert_close(tree_logits[1], full_forward_logits(model, committed + [2, 5, 3, 1]),
                               rtol=1e-5, atol=1e-5)


def test_tree_from_an_empty_cache():
    """With nothing committed, root nodes take parent −1 and position 0."""
    model = tiny_model(seed=5)
    lm = CausalLM(model)
    logits = lm.extend_tree([1, 2, 3], [-1, 0, 0]).logits()
    torch.testing.assert_close(logits[2], full_forward_logits(model, [1, 3]), rtol=1e-5, atol=1e-5)


def test_commit_rejects_a_path_that_is_not_a_chain():
    lm = CausalLM(tiny_model(seed=4))
    lm.extend(PROMPT)
    lm.extend_tree(TREE_TOKENS, tree_parents(lm))
    with pytest.raises(ValueError, match="path_positions"):
        lm.commit([len(PROMPT) + 0, len(PROMPT) + 4])  # node 4 is a child of node 1


def test_extend_refuses_while_a_tree_is_pending():
    lm = CausalLM(tiny_model(seed=4))
    lm.extend(PROMPT)
    lm.extend_tree([1], [lm.length - 1])
    with pytest.raises(ValueError, match="commit"):
        lm.extend([2])


def test_bad_parents_are_refused():
    lm = CausalLM(tiny_model(seed=4))
    lm.extend(PROMPT)
    with pytest.raises(ValueError, match="parents"):
        lm.extend_tree([1, 2], [lm.length - 1, lm.length + 1])  # a parent not yet created
    with pytest.raises(ValueError, match="token_ids"):
        lm.extend([99])


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
    lm.extend(PROMPT)
    tree_logits = lm.extend_tree(TREE_TOKENS, tree_parents(lm)).logits()
    for node in range(len(TREE_TOKENS)):
        expected = full_forward_logits(model, node_prefix(node))
        torch.testing.assert_close(tree_logits[node], expected, rtol=1e-5, atol=1e-5)
