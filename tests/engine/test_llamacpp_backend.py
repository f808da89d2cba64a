"""The llama.cpp backend (``engine.backends.llamacpp``): the engine's LM protocol on llama.cpp's own
forwards, and every method lossless on it.

The tiny target and draft models of ``support.models`` are written as float32 GGUF files
(``specbound.models.tiny.write_gguf``) and loaded by llama.cpp. Tree attention through sequence ids is checked
against each path scored alone, both by llama.cpp and by the torch model the files were
written from; rollback and row selection against fresh prefills. Losslessness is checked as
for the torch backend (``test_engine_lossless``): the law of the next 3 tokens is enumerated
with llama.cpp's own forwards, computed the way decoding computes its rows (the prompt but
its last token prefilled, then the rest scored as pending entries), and each method's 400
samples are compared with it by the pooled χ² test at level 0.001 (its power is stated and
checked in ``test_engine_lossless.test_the_check_has_power``).
"""

import gc

import numpy as np
import pytest
import torch

from support.models import EOS, SIGNIFICANCE, chi_square_pvalue
from specbound.models.tiny import write_gguf
from specbound.engine import Decoder, ModelDrafter, Processing, PromptLookupDrafter
from specbound.engine.backends import Entries
from specbound.engine.methods import build_method
from support.lossless import (LOOKUP_PROMPT, LOSSLESS_CASES, NEW_TOKENS, PROMPT, TREE_VERIFIER_CASES, alone,
                              llamacpp_law, sample_sequences)

# llama.cpp is not batch-invariant: one row scored in forwards of other sizes differs by
# rounding (up to 2e-4 in a logit seen on these files), while a node attending to a wrong
# cell moves its logits by 0.05 or more: rows that must be the same row agree to ROUNDING.
ROUNDING = 1e-3

from specbound.engine.backends import llamacpp  # noqa: E402

if not llamacpp.llama_cpp_available():
    pytest.skip("llama-cpp-python is not installed", allow_module_level=True)


@pytest.fixture(scope="module")
def gguf_models(tmp_path_factory, target_model, draft_model):
    folder = tmp_path_factory.mktemp("gguf")
    return (llamacpp.LlamaCppModel(write_gguf(target_model, folder / "target.gguf"), threads=1),
            llamacpp.LlamaCppModel(write_gguf(draft_model, folder / "draft.gguf"), threads=1))


@pytest.fixture(scope="module")
def target_lm(gguf_models):
    return llamacpp.LlamaCppLM(gguf_models[0], context_cells=256)


def torch_logits(model, tokens):
    with torch.no_grad():
        return model(input_ids=torch.tensor([tokens])).logits[0, -1]


def test_a_tree_scored_through_sequence_ids_sees_each_node_s_path_only(target_lm, target_model):
    """Entries 5 → {1 → {3}, 2} below the prefix [1, 2, 3, 4], then in a second forward two
    children of the leaf 2 and one of 3: every node's logits equal its path's scored alone
    (llama.cpp) and the torch model's on that path (llama.cpp keeps keys and values in
    float16)."""
    target_lm.reset(1)
    target_lm.prefill(0, [1, 2, 3, 4])
    first = target_lm.score([Entries([5, 1, 2, 3], [-1, 0, 0, 1])])
    second = target_lm.score([Entries([4, 5, 0], [2, 2, 3])])
    paths = [[5], [5, 1], [5, 2], [5, 1, 3]]
    grown = [[5, 2, 4], [5, 2, 5], [5, 1, 3, 0]]
    tree = torch.cat([first.logits(0), second.logits(0)])
    target_lm.commit([[]])
    by_path = torch.stack([alone(target_lm, [1, 2, 3, 4] + path) for path in paths + grown])
    reference = torch.stack([torch_logits(target_model, [1, 2, 3, 4] + path) for path in paths + grown])
    assert torch.allclose(tree, by_path, atol=ROUNDING)
    assert torch.allclose(tree, reference, atol=ROUNDING)


def test_commit_keeps_one_path_and_drops_the_rest(target_lm):
    target_lm.reset(1)
    target_lm.prefill(0, [1, 2])
    target_lm.score([Entries([3, 4, 5], [-1, 0, 0])])
    target_lm.score([Entries([1], [2])])
    target_lm.commit([[0, 2, 3]])  # 3, 5, 1
    assert target_lm.lengths == [5]
    after = target_lm.score([Entries.chain([2])]).logits(0)[0]
    target_lm.commit([[0]])
    assert torch.allclose(after, alone(target_lm, [1, 2, 3, 5, 1, 2]), atol=ROUNDING)


def test_an_empty_path_rolls_back_and_rows_can_leave(target_lm):
    target_lm.reset(3)
    for row, prompt in enumerate([[1, 2], [3, 4, 5], [2]]):
        target_lm.prefill(row, prompt)
    target_lm.score([Entries([1, 1], [-1, 0]), Entries([2], [-1]), Entries([3, 4], [-1, -1])])
    target_lm.commit([[0], [], [1]])
    assert target_lm.lengths == [3, 3, 2]
    target_lm.select_rows([2, 0])
    scores = target_lm.score([Entries.chain([5]), Entries.chain([5])])
    rows = [scores.logits(0)[0], scores.logits(1)[0]]
    target_lm.commit([[], []])
    assert torch.allclose(rows[0], alone(target_lm, [2, 4, 5]), atol=ROUNDING)
    assert torch.allclose(rows[1], alone(target_lm, [1, 2, 1, 5]), atol=ROUNDING)


def test_a_prefill_joins_the_prefix_another_row_holds(target_lm):
    """Rows whose prompts start alike: a later row's prefill decodes only the tokens after
    the longest prefix an earlier row's committed tokens share with it (never a token whose
    logits are read), and its logits and those of entries scored after it are its prompt's
    alone; a row that leaves keeps the cells it shares alive for the others."""
    decoded = []
    decode = target_lm._decode
    target_lm._decode = lambda items: decoded.append(len(items)) or decode(items)
    try:
        target_lm.reset(3)
        prompts = [[1, 2, 3, 4, 5, 1], [1, 2, 3, 4, 0, 2, 2], [1, 2, 3, 4, 5, 1, 3]]
        last = [target_lm.prefill(0, prompts[0])[0], target_lm.prefill(1, prompts[1])[0]]
        every = target_lm.prefill(2, prompts[2], last=3)
    finally:
        target_lm._decode = decode
    assert decoded == [6, 3, 3]  # row 1 shares 4 tokens with row 0; row 2 would share 6 but reads 3 logits
    target_lm.select_rows([1, 2])  # row 0, the cells' first holder, leaves
    scores = target_lm.score([Entries.chain([3]), Entries.chain([4])])
    after = [scores.logits(0)[0], scores.logits(1)[0]]
    target_lm.commit([[], []])
    for prompt, logits in zip(prompts, last):
        assert torch.allclose(logits, alone(target_lm, prompt), atol=ROUNDING)
    assert torch.allclose(every, torch.stack([alone(target_lm, prompts[2][:end]) for end in (5, 6, 7)]), atol=ROUNDING)
    assert torch.allclose(after[0], alone(target_lm, prompts[1] + [3]), atol=ROUNDING)
    assert torch.allclose(after[1], alone(target_lm, prompts[2] + [4]), atol=ROUNDING)


def test_prefill_rows_decodes_a_shared_prefix_once(gguf_models):
    """Four prompts, three of them starting with [1, 2, 3] (two of those alike for two tokens
    more), and a row committed before the call that shares [4, 2] with the fourth: the
    entries decoded are the prompts' distinct prefixes, [1, 2, 3] once for three rows, in
    forwards of 4 entries, each after the entries it attends to (else its row would not
    score as its prompt alone, checked last for every row)."""
    lm = llamacpp.LlamaCppLM(gguf_models[0], context_cells=256, batch_tokens=4)
    lm.reset(5)
    lm.prefill(4, [4, 2, 5])
    prompts = {0: [1, 2, 3, 4], 1: [1, 2, 3, 0, 5], 2: [1, 2, 3, 0, 5, 1], 3: [4, 2, 2]}
    calls = []
    decode = lm._decode
    lm._decode = lambda items: calls.append([(token, position, sequences) for token, position, sequences, _ in items]) \
        or decode(items)
    try:
        lm.prefill_rows(prompts)
    finally:
        lm._decode = decode
    entries = [entry for call in calls for entry in call]
    assert [len(call) for call in calls] == [4, 4]
    assert entries[:3] == [(1, 0, (0, 1, 2)), (2, 1, (0, 1, 2)), (3, 2, (0, 1, 2))]
    assert sorted((token, position) for token, position, _ in entries) == sorted(
        [(1, 0), (2, 1), (3, 2), (4, 3), (0, 3), (5, 4), (1, 5), (2, 2)])
    assert lm.lengths == [4, 5, 6, 3, 3]
    scores = lm.score([Entries.chain([row]) for row in range(5)])
    after = [scores.logits(row)[0] for row in range(5)]
    lm.commit([[]] * 5)
    for row, prompt in {**prompts, 4: [4, 2, 5]}.items():
        assert torch.allclose(after[row], alone(lm, prompt + [row]), atol=ROUNDING)


def test_only_the_entries_asked_for_have_logits(target_lm):
    target_lm.reset(1)
    scores = target_lm.score([Entries.chain([1, 2, 3])], outputs=[[2]])
    assert scores.logits(0, 2).shape == (1, target_lm.logits_size)
    with pytest.raises(ValueError, match="not asked for"):
        scores.logits(0, 0)
    target_lm.commit([[]])


def test_bad_entries_are_refused_before_anything_changes(target_lm):
    target_lm.reset(1)
    target_lm.prefill(0, [1, 2])
    with pytest.raises(ValueError, match="parent"):
        target_lm.score([Entries([1, 2], [-1, 5])])
    with pytest.raises(ValueError, match="token_ids"):
        target_lm.score([Entries([99], [-1])])
    assert target_lm.lengths == [2]
    assert torch.allclose(target_lm.score([Entries.chain([3])]).logits(0)[0], alone(target_lm, [1, 2, 3]),
                          atol=ROUNDING)


def test_a_full_cache_grows_when_reset_for_more(gguf_models):
    """A context holds 256 cells at least (llama.cpp's step); past them a prefill is refused
    with a clear error, and ``reset(cells=)`` makes a larger context."""
    lm = llamacpp.LlamaCppLM(gguf_models[0], context_cells=16)
    prompt = [1, 2, 3, 4, 5] * 60
    with pytest.raises(ValueError, match="KV cells"):
        lm.prefill(0, prompt)
    lm.reset(1, cells=len(prompt))
    assert lm.prefill(0, prompt).shape == (1, lm.logits_size)


def test_the_kept_scoring_context_scores_as_a_fresh_one(gguf_models, tmp_path, target_model):
    """``LlamaCppModel.scorer`` is one context kept for every scoring forward: after
    sequences of other lengths (one past its cells, so it grew), each sequence's logits are
    bit for bit those of a context made for it alone; a model holding its scorer is freed
    with it (the scorer's context first), and the file can be loaded again."""
    model = gguf_models[1]
    scorer = model.scorer()
    sequences = [[1, 2, 3, 4, 5] * 4, [2, 4, 1] * ((scorer._cells + 3) // 3), [3, 1, 2]]  # the second: past its cells
    assert model.scorer() is scorer
    cells = scorer._cells
    for sequence in sequences + sequences[::-1]:
        kept = scorer.sequence_logits(sequence, 3)
        fresh = llamacpp.LlamaCppLM(model).sequence_logits(sequence, 3)
        assert kept.shape == (3, scorer.logits_size)
        assert torch.equal(kept, fresh)
    assert scorer._cells > cells  # it grew, and scored as fresh contexts after
    path = write_gguf(target_model, tmp_path / "scored.gguf")
    loaded = llamacpp.LlamaCppModel(path, threads=1)
    logits = loaded.scorer().sequence_logits(sequences[0], 1)
    del loaded
    gc.collect()
    again = llamacpp.LlamaCppModel(path, threads=1)
    assert torch.equal(again.scorer().sequence_logits(sequences[0], 1), logits)


def test_a_prefill_in_chunks_gives_the_logits_of_one_forward_and_tells_its_progress(gguf_models):
    """40 tokens in llama_decode calls of 8 tokens: the logits of every token and of a tree
    scored after them (the cache) agree to ROUNDING with one call's, and the progress is
    told after each call; a prefill of one call tells nothing."""
    prompt = [1, 2, 3, 4, 5, 0, 2, 2, 4, 1] * 4
    chunked = llamacpp.LlamaCppLM(gguf_models[0], context_cells=256, batch_tokens=8)
    whole = llamacpp.LlamaCppLM(gguf_models[0], context_cells=256)
    told = {"chunked": [], "whole": []}
    chunked.prefill_progress = lambda done, total: told["chunked"].append((done, total))
    whole.prefill_progress = lambda done, total: told["whole"].append((done, total))
    outputs = [lm.prefill(0, prompt, last_only=False) for lm in (chunked, whole)]
    assert outputs[0].shape == outputs[1].shape == (len(prompt), chunked.logits_size)
    assert torch.allclose(outputs[0], outputs[1], atol=ROUNDING)
    after = [lm.score([Entries([5, 1, 2], [-1, 0, -1])]).logits(0) for lm in (chunked, whole)]
    assert torch.allclose(after[0], after[1], atol=ROUNDING)
    assert told == {"chunked": [(end, len(prompt)) for end in range(8, len(prompt) + 1, 8)], "whole": []}


def llamacpp_decoder(gguf_models, processing, drafter="model"):
    target = llamacpp.LlamaCppLM(gguf_models[0], context_cells=256)
    drafters = {"model": lambda: ModelDrafter(llamacpp.LlamaCppLM(gguf_models[1], context_cells=256), processing),
                "lookup": lambda: PromptLookupDrafter(target.logits_size)}
    return Decoder(target, drafters[drafter](), processing, eos_token_ids=[EOS])


CASES = {**LOSSLESS_CASES, **TREE_VERIFIER_CASES}
# Cases whose shape of tree and processing another case already runs on llama.cpp, differing in
# the verifier only: the backend scores and commits the same entries, and each verifier's
# losslessness is checked in the fast suite on the torch pair (test_engine_lossless). They run
# with ``-m slow``. UniVer stays in the fast suite: its trees are drafted i.i.d. and decided by
# Global Resolution's plans, a drafting no other case runs on llama.cpp.
SLOW_ON_LLAMA_CPP = ("tree-kseq", "tree-global_resolution", "sparse-traversal-top_p")


@pytest.mark.parametrize("case", [pytest.param(case, id=name, marks=[pytest.mark.slow] * (name in SLOW_ON_LLAMA_CPP))
                                  for name, case in CASES.items()])
def test_every_method_on_llama_cpp_generates_the_target_sequence_law(case, gguf_models, target_lm):
    name, options, processing = case
    samples = sample_sequences(llamacpp_decoder(gguf_models, processing), build_method(name, **options), batched=False)
    law = llamacpp_law(target_lm, PROMPT, processing, NEW_TOKENS)
    pvalue = chi_square_pvalue(samples, law)
    assert pvalue > SIGNIFICANCE, f"{name} {options}: χ² p-value {pvalue:.2e}"


def test_prompt_lookup_on_llama_cpp_generates_the_target_sequence_law(gguf_models, target_lm):
    processing = Processing()
    decoder = llamacpp_decoder(gguf_models, processing, drafter="lookup")
    samples = sample_sequences(decoder, build_method("chain", gamma=2), prompt=LOOKUP_PROMPT, batched=False)
    assert chi_square_pvalue(samples, llamacpp_law(target_lm, LOOKUP_PROMPT, processing, NEW_TOKENS)) > SIGNIFICANCE


@pytest.mark.parametrize("name, options", [("chain", {"gamma": 2}), ("sparse", {"budget": 5, "depth": 2, "width": 3})])
def test_batched_decoding_on_llama_cpp_generates_the_target_sequence_law(name, options, gguf_models, target_lm):
    """Rows of a batch (prompts of different lengths, leaving as they end) each follow
    their own prompt's law."""
    processing = Processing()
    decoder = llamacpp_decoder(gguf_models, processing)
    method = build_method(name, **options)
    prompts = [PROMPT, [2, 3, 1], PROMPT]
    samples = [[], [], []]
    generators = [torch.Generator().manual_seed(seed) for seed in range(3)]
    for _ in range(200):
        for row, generation in enumerate(decoder.generate_batch(prompts, method, NEW_TOKENS, generators)):
            samples[row].append(tuple(generation.tokens))
    for prompt, rows in zip(prompts, samples):
        assert chi_square_pvalue(rows, llamacpp_law(target_lm, prompt, processing, NEW_TOKENS)) > SIGNIFICANCE


def test_auto_plans_on_llama_cpp_costs_measured_once(gguf_models, tmp_path):
    """``auto`` on a llama.cpp pair: the cost book measures each GGUF model's forwards once
    under a llama.cpp key (version, threads, file), and the planner decodes with them."""
    from specbound.engine.assembly import assemble
    from specbound.engine.cost_book import CostBook
    from specbound.engine.pair import ModelPair

    pair = ModelPair(target=gguf_models[0], draft=gguf_models[1], vocab_size=gguf_models[0].n_vocab,
                     eos_token_ids=(EOS,), encode=list, backend="llama.cpp")
    decoder, planner = assemble(pair, Processing(), "auto", cache_dir=tmp_path)
    keys = list(CostBook(tmp_path / "costs.json")._entries)
    assert len(keys) == 2 and all("llama.cpp" in key and "gguf" in key for key in keys)
    generation = decoder.generate([1, 2, 3], planner, 12, torch.Generator().manual_seed(0))
    assert len(generation.tokens) <= 12 and planner.history
    assemble(pair, Processing(), "auto", cache_dir=tmp_path)  # measured once: the book is reused
    assert list(CostBook(tmp_path / "costs.json")._entries) == keys


def test_a_row_added_between_steps_decodes_as_if_prefilled_first(gguf_models):
    """``add_row``: a sequence joining a running batch gets its own row; when the context is
    too small for it, a larger one is made and the committed rows are replayed into it."""
    lm = llamacpp.LlamaCppLM(gguf_models[0], context_cells=256)
    lm.reset(1)
    lm.prefill(0, [1, 2, 3])
    lm.score([Entries.chain([4])])
    lm.commit([[0]])
    row = lm.add_row(cells=300)  # 4 + 300 > 256 cells: replayed into a larger context
    lm.prefill(row, [5, 4])
    scores = lm.score([Entries.chain([1]), Entries.chain([2])])
    rows = [scores.logits(0)[0], scores.logits(1)[0]]
    lm.commit([[0], [0]])
    assert lm.lengths == [5, 3]
    assert torch.allclose(rows[0], alone(lm, [1, 2, 3, 4, 1]), atol=ROUNDING)
    assert torch.allclose(rows[1], alone(lm, [5, 4, 2]), atol=ROUNDING)


def test_the_file_s_metadata_is_read_from_llama_cpp_including_its_eos_id(tmp_path, target_model, gguf_models):
    """The EOS id named in a GGUF file's metadata, as llama.cpp read it at load (the pair's
    EOS ids include it), and no id from a file that names none."""
    def with_eos(writer):
        writer.add_tokenizer_model("none")
        writer.add_vocab_size(target_model.config.vocab_size)
        writer.add_eos_token_id(EOS)
        writer.add_string("test.long_value", "x" * 1000)  # longer than the first buffer

    named = llamacpp.LlamaCppModel(write_gguf(target_model, tmp_path / "eos.gguf", tokenizer=with_eos), threads=1)
    assert named.eos_token_ids == [EOS]
    assert named.metadata("general.name") == "tiny-qwen2"
    assert named.metadata("test.long_value") == "x" * 1000
    assert named.metadata("no.such.key") is None
    assert gguf_models[0].eos_token_ids == []
