"""Drafts from a model with another tokenizer (``engine.vocabulary``, TLI).

Two tiny byte-level BPE tokenizers built in memory: the target's (6 tokens, EOS ``<eos>``) and
the draft's (7 tokens, EOS ``<|end|>``). They share ``a``, ``b``, ``c`` and EOS; the target's
``ab`` and ``ba`` and the draft's ``ca``, ``d``, ``bb`` are their own, so p(S) < 1. The models
are random tiny Qwen2 models of those vocabularies (``support.models``), the draft unrelated
to the target: acceptance neither 0 nor 1. Losslessness: the pooled χ² test of
``test_engine_lossless`` (SAMPLES = 400 sequences of 3 tokens, level SIGNIFICANCE = 0.001,
fixed seeds).
"""

import dataclasses
import json
import math

import pytest
import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from support.models import EOS, SIGNIFICANCE, VOCAB, chi_square_pvalue, exact_sequence_law, tiny_model
from specbound.engine import CausalLM, Decoder, ModelDrafter, Processing, PromptLookupDrafter
from specbound.engine.drafters import DrafterChoice
from specbound.engine.methods import build_method
from specbound.engine.optimum import OptimumRecorder
from specbound.engine.vocabulary import CrossTokenizerDrafter, RestrictedProcessing, SharedVocabulary, token_bytes
from support.lossless import LOOKUP_PROMPT, NEW_TOKENS, PROMPT, llamacpp_law, sample_sequences

TARGET_TOKENS = ["<eos>", "a", "b", "ab", "c", "ba"]
DRAFT_TOKENS = ["<|end|>", "b", "a", "ca", "c", "d", "bb"]
SHARED = {0: 0, 1: 2, 2: 1, 4: 4}  # target id -> draft id
ROUNDING = 1e-6  # a float32 row's sum is 1 within it (the verifiers' tolerance)


def byte_level_tokenizer(tokens, merges, eos, added=()):
    """A byte-level BPE tokenizer of ``tokens`` (the first one its special EOS); ``added``:
    ordinary added tokens."""
    tokenizer = Tokenizer(models.BPE(vocab={token: index for index, token in enumerate(tokens)}, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(eos, special=True)])
    tokenizer.add_tokens([AddedToken(token, special=False) for token in added])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=eos)


@pytest.fixture(scope="module")
def tokenizers():
    target = byte_level_tokenizer(TARGET_TOKENS, [("a", "b"), ("b", "a")], "<eos>")
    draft = byte_level_tokenizer(DRAFT_TOKENS, [("c", "a"), ("b", "b")], "<|end|>")
    return target, draft


@pytest.fixture(scope="module")
def vocabulary(tokenizers):
    return SharedVocabulary.of(*tokenizers, target_size=len(TARGET_TOKENS), draft_size=len(DRAFT_TOKENS))


@pytest.fixture(scope="module")
def other_draft_model():
    return tiny_model(seed=3, vocab_size=len(DRAFT_TOKENS))


def cross_tokenizer_decoder(target_model, draft_model, vocabulary, processing):
    drafter = ModelDrafter(CausalLM(draft_model), RestrictedProcessing(processing, vocabulary))
    return Decoder(CausalLM(target_model), CrossTokenizerDrafter(drafter, vocabulary), processing, eos_token_ids=[EOS])


def test_shared_vocabulary_pairs_tokens_by_their_bytes_and_eos_with_eos(vocabulary):
    assert dict(zip(vocabulary.target_ids.tolist(), vocabulary.draft_ids.tolist())) == SHARED
    assert vocabulary.target_mask.tolist() == [True, True, True, False, True, False]
    assert vocabulary.target_of.tolist() == [0, 2, 1, -1, 4, -1, -1]


def test_special_tokens_are_never_matched_by_their_text():
    """The target's special ``<x>`` and the draft's ordinary added token ``<x>`` spell the same
    text; only EOS pairs with EOS."""
    target = byte_level_tokenizer(["<x>", "a"], [], "<x>")
    draft = byte_level_tokenizer(["<e>", "a"], [], "<e>", added=["<x>"])
    shared = SharedVocabulary.of(target, draft, target_size=2, draft_size=3)
    assert dict(zip(shared.target_ids.tolist(), shared.draft_ids.tolist())) == {0: 0, 1: 1}
    assert token_bytes(target)[0] is None and token_bytes(draft)[2] == b"<x>"


def test_token_bytes_reads_byte_level_and_sentencepiece_spellings():
    byte_level = byte_level_tokenizer(["<e>", "a", "Ġ", "Ġa", "Ċ"], [("Ġ", "a")], "<e>")
    assert token_bytes(byte_level) == [None, b"a", b" ", b" a", b"\n"]
    tokenizer = Tokenizer(models.BPE(vocab={"<unk>": 0, "▁a": 1, "<0x0A>": 2, "a": 3, "▁": 4}, merges=[("▁", "a")]))
    tokenizer.decoder = decoders.Metaspace()
    tokenizer.add_special_tokens([AddedToken("<unk>", special=True)])
    sentencepiece = PreTrainedTokenizerFast(tokenizer_object=tokenizer)
    assert token_bytes(sentencepiece) == [None, b" a", b"\n", b"a", b" "]


def test_a_draft_sharing_nothing_is_refused():
    target = byte_level_tokenizer(["<e>", "a", "b"], [], "<e>")
    draft = byte_level_tokenizer(["<e>", "c", "d"], [], "<e>")
    with pytest.raises(ValueError, match="^draft: the draft model's tokenizer shares no token"):
        SharedVocabulary.of(target, draft, target_size=3, draft_size=3)


@pytest.mark.parametrize("processing", [Processing(), Processing(temperature=0.7, top_k=2),
                                        Processing(temperature=0.0), Processing(top_p=0.8)],
                         ids=["plain", "top_k", "greedy", "top_p"])
def test_restricted_law_is_the_processed_law_of_the_shared_tokens(vocabulary, processing):
    """q_S is the processing of the draft's logits with the unshared ones at −∞: zero outside
    S, a law, and in the target's ids the same values at the paired ids."""
    logits = torch.randn(5, len(DRAFT_TOKENS) + 2, generator=torch.Generator().manual_seed(0))  # 2 padding columns
    restricted = RestrictedProcessing(processing, vocabulary).probs(logits)
    masked = logits[:, : len(DRAFT_TOKENS)].clone()
    masked[:, ~vocabulary.draft_mask] = -math.inf
    torch.testing.assert_close(restricted, Processing(processing.temperature, processing.top_k, processing.top_p)
                               .probs(masked), rtol=0, atol=0)
    assert (restricted[:, ~vocabulary.draft_mask] == 0).all()
    torch.testing.assert_close(restricted.sum(dim=1), torch.ones(5), rtol=0, atol=1e-6)
    for row in restricted:
        target_row = vocabulary.to_target(row)
        assert target_row.shape == (VOCAB,) and sorted(target_row[target_row > 0].tolist()) == sorted(row[row > 0].tolist())
        assert all(target_row[target] == row[draft] for target, draft in SHARED.items())


def test_the_draft_conditions_on_its_own_spelling_of_the_context(vocabulary):
    retokenizer = vocabulary.retokenizer
    assert retokenizer.text([1, 3, 4]) == [2, 2, 1, 4]  # "aabc": the draft's own tokenizer
    assert [retokenizer.token(token) for token in range(VOCAB)] == [[0], [2], [1], [2, 1], [4], [1, 2]]


CASES = {
    "chain": ("chain", {"gamma": 2}, Processing()),
    "tree-rrs_without_replacement": (
        "tree", {"num_drafts": 2, "depth": 2, "verifier": "rrs_without_replacement"}, Processing()),
    "tree-kseq-top_k": ("tree", {"num_drafts": 2, "depth": 2, "verifier": "kseq"}, Processing(temperature=0.8, top_k=3)),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_cross_tokenizer_drafts_generate_the_target_sequence_law(case, target_model, other_draft_model, vocabulary):
    name, options, processing = case
    decoder = cross_tokenizer_decoder(target_model, other_draft_model, vocabulary, processing)
    samples = sample_sequences(decoder, build_method(name, **options))
    law = exact_sequence_law(target_model, PROMPT, processing, NEW_TOKENS)
    pvalue = chi_square_pvalue(samples, law)
    assert pvalue > SIGNIFICANCE, f"{name} {options}: χ² p-value {pvalue:.2e}"


def test_drafts_lie_in_the_shared_vocabulary_and_their_law_is_handed_over(target_model, other_draft_model,
                                                                          vocabulary):
    trees = []
    decoder = cross_tokenizer_decoder(target_model, other_draft_model, vocabulary, Processing())
    decoder.generate(PROMPT, build_method("tree", num_drafts=2, depth=2), 12, torch.Generator().manual_seed(1),
                     observer=lambda index, tree, rows: trees.append(tree))
    assert trees
    for tree in trees:
        for node, drafts in tree.draft_tokens.items():
            assert vocabulary.target_mask[drafts].all()
            assert float(tree.draft_probs[node][~vocabulary.target_mask].sum()) == 0.0
            assert float(tree.draft_probs[node].sum()) == pytest.approx(1.0, abs=1e-6)
        assert all(token in SHARED for token in tree.tokens[1:])


@pytest.mark.parametrize("name, options", [("chain", {"gamma": 3}), ("tree", {"num_drafts": 2, "depth": 2})])
def test_bound_covers_the_optimum_and_the_acceptance_at_every_recorded_position(name, options, target_model,
                                                                                other_draft_model, vocabulary):
    """p(S) ≥ α* ≥ the verifier's exact acceptance at every recorded position, with p(S) < 1
    somewhere (the bound is the shared mass, not 1). Within ROUNDING: the rows are float32."""
    decoder = cross_tokenizer_decoder(target_model, other_draft_model, vocabulary, Processing())
    decoder.optimum = OptimumRecorder(budget=math.inf)  # every position computed
    generators = [torch.Generator().manual_seed(seed) for seed in range(8)]
    generations = decoder.generate_batch([PROMPT, [1, 2, 4]] * 4, build_method(name, **options), 12, generators)
    tally = generations[0].stats.optimum
    for generation in generations[1:]:
        tally = tally.merge(generation.stats.optimum)
    assert len(tally.bounds) == len(tally.optima) == len(tally.acceptances) == tally.positions > 20
    for bound, best, acceptance in zip(tally.bounds, tally.optima, tally.acceptances):
        assert bound + ROUNDING >= best >= acceptance - ROUNDING
    assert min(tally.bounds) < 0.99
    assert tally.summary()["shared_mass"] == pytest.approx(sum(tally.bounds) / len(tally.bounds))


def save_word_level(directory, model, words):
    """``model`` and a word-level tokenizer of ``words`` (EOS ``<eos>``) as a Hugging Face folder."""
    tokenizer = Tokenizer(models.WordLevel({word: index for index, word in enumerate(words)}, unk_token=words[1]))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    model.generation_config.eos_token_id = 0
    model.save_pretrained(directory)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>", unk_token=words[1]).save_pretrained(directory)
    return str(directory)


@pytest.fixture(scope="module")
def word_level_folders(tmp_path_factory, target_model, other_draft_model):
    root = tmp_path_factory.mktemp("cross")
    (root / "prompts.txt").write_text("a b c\nd c a b\n")
    return {"target": save_word_level(root / "target", target_model, ["<eos>", "a", "b", "c", "d", "<|endoftext|>"]),
            "draft": save_word_level(root / "draft", other_draft_model, ["<eos>", "b", "a", "x", "y", "c", "<|endoftext|>"]),
            "unrelated": save_word_level(root / "unrelated", tiny_model(seed=4),
                                         ["<eos>", "x", "y", "z", "w", "<|endoftext|>"]),
            "prompts": str(root / "prompts.txt")}


def run_with_draft(folders, draft, output_dir):
    from specbound.cli import main

    return main(["run", "--target", folders["target"], "--draft", folders[draft], "--prompts", folders["prompts"],
                 "--dtype", "float32", "--max-new-tokens", "8", "--output-dir", str(output_dir),
                 "--methods", "chain,tree", "--depth", "2"])


def test_run_drafts_with_a_model_of_another_tokenizer_and_reports_the_bound(word_level_folders, tmp_path, capsys):
    assert run_with_draft(word_level_folders, "draft", tmp_path) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    for method in summary["methods"]:
        optimum = method["optimum"]
        assert optimum["computed"] > 0
        assert optimum["shared_mass"] + ROUNDING >= optimum["optimal_acceptance"] >= \
            optimum["expected_acceptance"] - ROUNDING
        assert optimum["shared_mass"] < 1
    assert "p(shared)" in capsys.readouterr().out


def test_run_refuses_a_draft_that_shares_no_token(word_level_folders, tmp_path, capsys):
    assert run_with_draft(word_level_folders, "unrelated", tmp_path) == 2
    message = capsys.readouterr().err
    assert "draft: the draft model's tokenizer shares no token" in message and "--draft" in message


def test_accept_restricts_the_draft_to_the_shared_tokens_and_prints_the_bound(capsys):
    """Fixture A with token 3 unshared: q_S = (1/6, 2/6, 3/6, 0), p(S) = 0.9, and the single
    draft's acceptance Σ min(p, q_S) = 1/6 + 0.3 + 0.2."""
    from specbound.cli import main

    pair = ["accept", "--target", "0.4,0.3,0.2,0.1", "--draft", "0.1,0.2,0.3,0.4", "-n", "2"]
    assert main([*pair, "--shared", "0,1,2", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["shared"] == [0, 1, 2] and record["shared_mass"] == pytest.approx(0.9, abs=1e-12)
    assert record["draft"] == pytest.approx([1 / 6, 2 / 6, 3 / 6, 0], abs=1e-12)
    methods = {method["method"]: method for method in record["methods"]}
    assert methods["single"]["acceptance"] == pytest.approx(1 / 6 + 0.5, abs=1e-12)
    for method in methods.values():
        assert method["acceptance"] <= method["optimum"] + 1e-12 <= record["shared_mass"] + 2e-12
    assert main([*pair, "--shared", "0,1,2"]) == 0
    assert "bound p(shared) = 0.900000" in capsys.readouterr().out
    assert main([*pair[:3], "--draft", "0.5,0.5,0,0", "--shared", "3"]) == 2
    assert "shared: the draft puts no mass on the shared tokens" in capsys.readouterr().err
    assert main([*pair, "--shared", "0,4"]) == 2
    assert "shared: expected token indices in [0, 4)" in capsys.readouterr().err


def test_cross_tokenizer_drafts_on_llama_cpp_generate_the_target_sequence_law(tmp_path, target_model,
                                                                              other_draft_model, vocabulary):
    """The same as above on llama.cpp's kernels (tiny GGUF files of both models, the chain
    case; one sequence at a time: llama.cpp is not batch-invariant)."""
    from specbound.engine.backends import llamacpp

    if not llamacpp.llama_cpp_available():
        pytest.skip("llama-cpp-python is not installed")
    from specbound.models.tiny import write_gguf

    target = llamacpp.LlamaCppModel(write_gguf(target_model, tmp_path / "target.gguf"), threads=1)
    draft = llamacpp.LlamaCppModel(write_gguf(other_draft_model, tmp_path / "draft.gguf"), threads=1)
    processing = Processing()
    drafter = ModelDrafter(llamacpp.LlamaCppLM(draft, context_cells=256), RestrictedProcessing(processing, vocabulary))
    decoder = Decoder(llamacpp.LlamaCppLM(target, context_cells=256), CrossTokenizerDrafter(drafter, vocabulary),
                      processing, eos_token_ids=[EOS])
    samples = sample_sequences(decoder, build_method("chain", gamma=2), batched=False)
    law = llamacpp_law(llamacpp.LlamaCppLM(target, context_cells=256), PROMPT, processing, NEW_TOKENS)
    assert chi_square_pvalue(samples, law) > SIGNIFICANCE


class Alternating:
    """A schedule drafting with the cross-tokenizer model, prompt lookup and nothing in
    turn, as ``auto`` may: the model drafter sits steps out and catches up on the tokens
    committed meanwhile."""

    name, adaptive = "alternating", False

    def __init__(self, method):
        self.methods = [method, dataclasses.replace(method, drafter="lookup"), build_method("autoregressive")]
        self.depth, self.max_nodes = method.depth, method.max_nodes

    def method_for(self, step):
        return self.methods[step % 3]

    def observe(self, method, tree, accepted_path, target_rows=None):
        pass

    def describe(self):
        return ""


def test_a_draft_of_another_tokenizer_beside_prompt_lookup_generates_the_target_sequence_law(
        target_model, other_draft_model, vocabulary):
    processing = Processing()
    model = CrossTokenizerDrafter(ModelDrafter(CausalLM(other_draft_model), RestrictedProcessing(processing, vocabulary)),
                                  vocabulary)
    drafters = DrafterChoice({"model": model, "lookup": PromptLookupDrafter(vocab_size=VOCAB)})
    decoder = Decoder(CausalLM(target_model), drafters, processing, eos_token_ids=[EOS])
    samples = sample_sequences(decoder, Alternating(build_method("chain", gamma=2)), prompt=LOOKUP_PROMPT,
                               new_tokens=5)
    law = exact_sequence_law(target_model, LOOKUP_PROMPT, processing, 5)
    assert chi_square_pvalue(samples, law) > SIGNIFICANCE
