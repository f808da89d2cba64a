"""The prefill twin: a long first prefill run by a wider-dtype copy of the model, its
keys/values moved into the model's cache in the model's dtype; every later forward is
the model's own."""

import copy

import pytest
import torch
from transformers import Qwen2ForCausalLM

from support.models import extend, noisy_copy, tiny_config, tiny_model
from specbound.engine.backends import Entries
from specbound.engine.backends.torch import CausalLM

PROMPT = [1, 2, 3, 4, 5, 0, 2, 2, 4, 1, 3, 5, 5, 1, 0, 4, 2, 3, 1, 4]  # 20 tokens
MIN_TOKENS = 16
# after the prompt: a tree below the last prompt token (-1) and a chain to commit
TREE_TOKENS = [5, 1, 2, 3, 0]
TREE_PARENTS = [-1, -1, 0, 2, 1]
COMMITTED_PATH = [0, 2, 3]  # a chain: 0 <- 2 <- 3
BF16_EPS = torch.finfo(torch.bfloat16).eps  # 2**-7: one bfloat16 ulp relative to 1


def count_calls(model) -> list:
    """Record every forward of ``model``'s base model (the full model calls it too)."""
    calls = []
    model.base_model.register_forward_hook(lambda *arguments: calls.append(1))
    return calls


def run_session(lm, last_only=False) -> list[torch.Tensor]:
    """Prefill, extend, a tree, commit a path of it, extend again: every logits returned."""
    outputs = [extend(lm, PROMPT, last_only=last_only), extend(lm, [3]), extend(lm, [0, 5])]
    outputs.append(lm.score([Entries(TREE_TOKENS, TREE_PARENTS)]).logits(0))
    lm.commit([COMMITTED_PATH])
    outputs.append(extend(lm, [4, 1]))
    outputs.append(lm.score([Entries([2, 3], [-1, -1])]).logits(0))
    return outputs


class DoubledLogits(Qwen2ForCausalLM):
    """Logits that are not head(base_model(x)): the wrapper takes full logits."""

    def forward(self, *args, **kwargs):
        output = super().forward(*args, **kwargs)
        output.logits = 2 * output.logits
        return output


def doubled_logits_model(seed):
    torch.manual_seed(seed)
    return DoubledLogits(tiny_config()).eval()


@pytest.mark.parametrize("build", [lambda: tiny_model(seed=7), lambda: doubled_logits_model(7)],
                         ids=["factorized", "full-logits"])
@pytest.mark.parametrize("last_only", [False, True])
def test_same_dtype_twin_changes_nothing(build, last_only):
    """A float32 model with its exact copy as twin: every logits equal the plain path's."""
    model = build()
    twin = copy.deepcopy(model)
    twin_calls = count_calls(twin)
    with_twin = CausalLM(model, prefill_model=twin, prefill_min_tokens=MIN_TOKENS)
    plain = CausalLM(model)
    assert with_twin._factorized == plain._factorized
    outputs = run_session(with_twin, last_only)
    expected = run_session(plain, last_only)
    assert len(twin_calls) == 1  # the prompt, and nothing after it
    assert with_twin.forward_calls == plain.forward_calls == 6
    assert with_twin.lengths == plain.lengths and with_twin.cache.length == plain.cache.length
    for output, reference in zip(outputs, expected):
        assert output.shape == reference.shape
        torch.testing.assert_close(output, reference, rtol=1e-6, atol=1e-6)
    for layer, reference_layer in zip(with_twin.cache.layers, plain.cache.layers):
        torch.testing.assert_close(layer.keys, reference_layer.keys, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(layer.values, reference_layer.values, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("seed", [0, 1])
def test_float32_twin_of_a_bfloat16_model(seed):
    """The cache stays bfloat16 and the logits stay within bfloat16 rounding of the plain
    bfloat16 path and of a float32 reference.

    Tolerance: 4 bfloat16 ulps of the largest reference logit (4 · 2⁻⁷ · max|logit|). Both
    paths round weights, activations and the head's output to bfloat16 (8 significant bits)
    and differ only in where the prefill's rounding happens; measured gaps are about one
    such ulp (≈0.01 for logits ≈1.5), while a wrong cache (other positions, stale or
    missing entries) moves these logits by ≫0.1.
    """
    model = tiny_model(seed=seed).to(torch.bfloat16)
    twin = copy.deepcopy(model).float()
    float32 = CausalLM(copy.deepcopy(twin))  # the same (bf16-valued) weights, all in float32
    twin_calls = count_calls(twin)
    with_twin = CausalLM(model, prefill_model=twin, prefill_min_tokens=MIN_TOKENS)
    plain = CausalLM(model)

    prefill_logits = extend(with_twin, PROMPT)
    assert len(twin_calls) == 1
    assert prefill_logits.dtype == torch.float32
    for layer in with_twin.cache.layers:
        assert layer.keys.dtype == layer.values.dtype == torch.bfloat16
        assert layer.keys.shape[-2] == len(PROMPT)
    outputs = [prefill_logits] + run_session(with_twin)[1:]
    expected = run_session(plain)
    reference = run_session(float32)
    for layer in with_twin.cache.layers:  # later bfloat16 updates did not promote the cache
        assert layer.keys.dtype == layer.values.dtype == torch.bfloat16
    assert len(twin_calls) == 1
    for output, bf16_plain, fp32 in zip(outputs, expected, reference):
        tolerance = 4 * BF16_EPS * fp32.abs().max().item()
        torch.testing.assert_close(output, bf16_plain, rtol=0, atol=tolerance)
        torch.testing.assert_close(output, fp32, rtol=0, atol=tolerance)


def test_float32_twin_prefill_is_no_worse_than_bfloat16_prefill():
    """The prefill's logits themselves (fp32 body, bf16 head) are at least as close to the
    float32 reference as the all-bfloat16 prefill's, up to one ulp."""
    model = tiny_model(seed=2).to(torch.bfloat16)
    twin = copy.deepcopy(model).float()
    reference = extend(CausalLM(copy.deepcopy(twin)), PROMPT)
    twin_error = (extend(CausalLM(model, prefill_model=twin), PROMPT) - reference).abs().max()
    plain_error = (extend(CausalLM(model), PROMPT) - reference).abs().max()
    assert twin_error <= plain_error + BF16_EPS * reference.abs().max()


def test_short_prompts_and_later_extends_do_not_use_the_twin():
    """A different twin (a noisy copy) shows whether it was used: below the threshold, or
    on a non-empty cache, the logits are exactly the plain path's."""
    model = tiny_model(seed=8)
    twin = noisy_copy(model, seed=9, noise=0.5)
    twin_calls = count_calls(twin)
    lm = CausalLM(model, prefill_model=twin, prefill_min_tokens=MIN_TOKENS)
    plain = CausalLM(model)

    short = PROMPT[: MIN_TOKENS - 1]
    torch.testing.assert_close(extend(lm, short), extend(plain, short), rtol=0, atol=0)
    # a long extend on a non-empty cache: the model's own forward
    torch.testing.assert_close(extend(lm, PROMPT), extend(plain, PROMPT), rtol=0, atol=0)
    assert twin_calls == []

    # exactly the threshold on an empty cache: the twin, hence other logits
    lm.reset()
    plain.reset()
    at_threshold = PROMPT[:MIN_TOKENS]
    twin_logits = extend(lm, at_threshold)
    assert len(twin_calls) == 1
    assert (twin_logits - extend(plain, at_threshold)).abs().max() > 1e-2
    assert lm.forward_calls == 1

    # a tree on an empty cache never uses the twin
    lm.reset()
    lm.score([Entries.chain(PROMPT)])
    assert len(twin_calls) == 1


def test_threshold_is_configurable():
    model = tiny_model(seed=8)
    twin = copy.deepcopy(model)
    twin_calls = count_calls(twin)
    lm = CausalLM(model, prefill_model=twin, prefill_min_tokens=1)
    extend(lm, [3])
    assert len(twin_calls) == 1


@pytest.mark.parametrize(
    "twin, message",
    [
        (lambda: tiny_model(seed=0, vocab_size=8), "output head shape"),
        (lambda: tiny_model(seed=0, num_layers=3), "layers"),
        (lambda: tiny_model(seed=0, architecture="llama"), "config"),
    ],
    ids=["vocabulary", "layers", "architecture"],
)
def test_mismatched_twin_is_refused(target_model, twin, message):
    with pytest.raises(ValueError, match=f"prefill_model: .*{message}"):
        CausalLM(target_model, prefill_model=twin())


@pytest.mark.parametrize("value", [0, -3, 1.5, True, "16"])
def test_bad_threshold_is_refused(target_model, value):
    with pytest.raises(ValueError, match="prefill_min_tokens"):
        CausalLM(target_model, prefill_model=copy.deepcopy(target_model), prefill_min_tokens=value)


LONG_PROMPT = PROMPT * 2  # 40 tokens


@pytest.mark.parametrize("build", [lambda: tiny_model(seed=7), lambda: doubled_logits_model(7)],
                         ids=["factorized", "full-logits"])
@pytest.mark.parametrize("last_only", [False, True])
@pytest.mark.parametrize("chunk", [7, 8])
def test_a_prefill_in_chunks_gives_the_cache_and_logits_of_one_forward(build, last_only, chunk):
    """40 tokens in forwards of 7 or 8 (the last chunk short or not): the same logits, the
    same cache (the logits of a tree scored after it), and the progress told after each
    chunk; a prefill of one chunk tells nothing."""
    model = build()
    chunked, whole = CausalLM(model, prefill_chunk=chunk), CausalLM(model, prefill_chunk=len(LONG_PROMPT))
    told = {"chunked": [], "whole": []}
    chunked.prefill_progress = lambda done, total: told["chunked"].append((done, total))
    whole.prefill_progress = lambda done, total: told["whole"].append((done, total))
    outputs = [lm.prefill(0, LONG_PROMPT, last_only=last_only) for lm in (chunked, whole)]
    assert outputs[0].shape == outputs[1].shape == (1 if last_only else len(LONG_PROMPT), chunked.logits_size)
    torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-6, atol=1e-6)
    for layer, reference_layer in zip(chunked.cache.layers, whole.cache.layers):
        torch.testing.assert_close(layer.keys, reference_layer.keys, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(layer.values, reference_layer.values, rtol=1e-6, atol=1e-6)
    after = [lm.score([Entries(TREE_TOKENS, TREE_PARENTS)]).logits(0) for lm in (chunked, whole)]
    torch.testing.assert_close(after[0], after[1], rtol=1e-6, atol=1e-6)
    assert chunked.forward_calls == whole.forward_calls == 2  # a prefill counts as one forward
    ends = list(range(chunk, len(LONG_PROMPT), chunk)) + [len(LONG_PROMPT)]
    assert told == {"chunked": [(end, len(LONG_PROMPT)) for end in ends], "whole": []}
