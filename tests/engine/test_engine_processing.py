"""Logits → probabilities: temperature, top-k, top-p, vocabulary padding, checked by hand."""

import math

import pytest
import torch

from specbound.engine.processing import PROBS_DTYPE, Processing

LOGITS = torch.tensor([[2.0, 1.0, 0.0, -1.0, 3.0], [0.0, 0.0, 0.0, 0.0, 0.0]])


def softmax(values):
    exps = [math.exp(value) for value in values]
    return [value / sum(exps) for value in exps]


def test_temperature_one_is_softmax():
    probs = Processing().probs(LOGITS)
    assert probs.dtype == PROBS_DTYPE
    torch.testing.assert_close(probs[0], torch.tensor(softmax([2.0, 1.0, 0.0, -1.0, 3.0]), dtype=PROBS_DTYPE))
    torch.testing.assert_close(probs[1], torch.full((5,), 0.2, dtype=PROBS_DTYPE))


def test_temperature_scales_logits():
    probs = Processing(temperature=0.5).probs(LOGITS[:1])
    expected = softmax([4.0, 2.0, 0.0, -2.0, 6.0])
    torch.testing.assert_close(probs[0], torch.tensor(expected, dtype=PROBS_DTYPE))


def test_temperature_zero_is_argmax_point_mass_ties_to_lower_id():
    probs = Processing(temperature=0).probs(LOGITS)
    assert probs[0].tolist() == [0, 0, 0, 0, 1]
    assert probs[1].tolist() == [1, 0, 0, 0, 0]


def test_top_k_keeps_the_k_largest():
    probs = Processing(top_k=2).probs(LOGITS[:1])
    expected = softmax([2.0, 3.0])
    assert probs[0].tolist() == pytest.approx([expected[0], 0, 0, 0, expected[1]])


def test_top_p_keeps_the_smallest_nucleus_reaching_p():
    full = softmax([2.0, 1.0, 0.0, -1.0, 3.0])  # order: 4, 0, 1, 2, 3
    top_two = full[4] + full[0]
    # p just below the top-two mass keeps two tokens; just above keeps three
    probs = Processing(top_p=top_two - 1e-6).probs(LOGITS[:1])[0]
    assert probs.tolist() == pytest.approx([full[0] / top_two, 0, 0, 0, full[4] / top_two])
    probs = Processing(top_p=top_two + 1e-6).probs(LOGITS[:1])[0]
    assert (probs > 0).tolist() == [True, True, False, False, True]
    assert float(probs.sum()) == pytest.approx(1.0)


def test_top_p_always_keeps_the_most_probable_token():
    probs = Processing(top_p=0.01).probs(LOGITS[:1])[0]
    assert probs.tolist() == [0, 0, 0, 0, 1]


def test_vocab_size_drops_padding_rows():
    padded = torch.cat([LOGITS, torch.full((2, 3), 50.0)], dim=1)  # 3 padding logits, huge
    torch.testing.assert_close(Processing(vocab_size=5).probs(padded), Processing().probs(LOGITS))


@pytest.mark.parametrize(
    "options, argument",
    [
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": True}, "temperature"),  # a flag is not a temperature
        ({"top_k": 0}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"vocab_size": 0}, "vocab_size"),
    ],
)
def test_bad_options_name_the_argument(options, argument):
    with pytest.raises(ValueError, match=argument):
        Processing(**options)


def test_logits_narrower_than_vocab_size_are_refused():
    with pytest.raises(ValueError, match="logits"):
        Processing(vocab_size=9).probs(LOGITS)


def test_rows_over_a_real_vocabulary_sum_to_one_to_float32_rounding():
    """torch's float32 softmax over 151,936 logits alone sums to 1 only within ~5e-5 (seen on
    the default pair at T = 0.7): the processing renormalises, so that min(1, p/q) is taken
    between laws, not between rows off by their sums."""
    generator = torch.Generator().manual_seed(0)
    logits = 4 * torch.randn(8, 151_936, generator=generator)
    for temperature in (0.7, 1.0):
        probs = Processing(temperature).probs(logits)
        assert float((probs.double().sum(-1) - 1).abs().max()) <= 2e-7
