"""The planner: by the measured costs it drafts where rows are cheap and decodes plainly
where they are not; with it the engine stays lossless and deterministic."""

import torch

from support.models import EOS, SIGNIFICANCE, chi_square_pvalue, exact_sequence_law
from specbound.engine import CausalLM, Decoder, ModelDrafter, Processing
from specbound.engine.costs import Costs
from specbound.engine import planner as planner_module
from specbound.engine.planner import Evidence, Planner
from specbound.engine.precisions import AS_LOADED

ROWS = (1, 2, 4, 8, 16, 32)


def linear(fixed_ms, per_row_ms):
    return Costs({rows: (fixed_ms + per_row_ms * rows) / 1000 for rows in ROWS})


AVX2 = {"target": linear(63, 161), "draft": linear(89, 39)}  # bf16 on an AVX2-only CPU (recorded)
AVX512_BF16 = {"target": linear(223, 7), "draft": linear(79, 2)}  # the project's AMD EPYC (recorded)


def test_where_rows_cost_linear_time_nothing_is_drafted():
    planner = Planner(AVX2["target"], {AS_LOADED: AVX2["draft"]})
    assert planner.best(optimistic=True).candidate.method == "autoregressive"
    for depth in range(8):  # even after seeing perfect acceptance
        planner.evidence.setdefault("model", Evidence()).record(depth, 1, True, count=1000)
    assert planner.best().candidate.method == "autoregressive"


def test_where_rows_are_cheap_a_draft_is_planned():
    planner = Planner(AVX512_BF16["target"], {AS_LOADED: AVX512_BF16["draft"], "int8": linear(40, 15)})
    best = planner.best(optimistic=True)
    assert best.candidate.method != "autoregressive"
    assert best.tokens_per_second > planner.predict(planner.candidates[0]).tokens_per_second
    assert planner.variant_for_rows(1) == "int8" and planner.variant_for_rows(16) == AS_LOADED


def test_poor_acceptance_falls_back_to_plain_decoding():
    planner = Planner(AVX512_BF16["target"], {AS_LOADED: AVX512_BF16["draft"]})
    for depth in range(8):
        for drafts in range(1, 5):
            evidence = planner.evidence.setdefault("model", Evidence())
            evidence.record(depth, drafts, True, count=50)
            evidence.record(depth, drafts, False, count=950)
    assert planner.best().candidate.method == "autoregressive"


def auto_decoder(target_model, draft_model, processing):
    planner = Planner(AVX512_BF16["target"], {AS_LOADED: AVX512_BF16["draft"]}, replan_every=2)
    drafter = ModelDrafter(CausalLM(draft_model), processing, planner.variant_for_rows)
    return Decoder(CausalLM(target_model), drafter, processing, eos_token_ids=[EOS]), planner


def test_auto_is_lossless_while_it_replans(target_model, draft_model):
    processing = Processing()
    decoder, planner = auto_decoder(target_model, draft_model, processing)
    generator = torch.Generator().manual_seed(0)
    samples = [tuple(decoder.generate([1], planner, 3, generator).tokens) for _ in range(400)]
    law = exact_sequence_law(target_model, [1], processing, 3)
    assert chi_square_pvalue(samples, law) > SIGNIFICANCE
    assert len({label for _, label, _ in planner.history}) >= 1


def test_auto_draws_the_same_tokens_for_the_same_seed(target_model, draft_model):
    runs = []
    for _ in range(2):
        decoder, planner = auto_decoder(target_model, draft_model, Processing())
        runs.append(decoder.generate([1, 2], planner, 30, torch.Generator().manual_seed(4)).tokens)
    assert runs[0] == runs[1]


def test_a_planner_kept_across_generations_plans_from_what_it_saw(target_model, draft_model):
    """Only the plans before any verification are optimistic: the second generation starts
    from the acceptance seen in the first (it started from the optimistic prior again, and
    spent its first plan on a guess)."""
    decoder, planner = auto_decoder(target_model, draft_model, Processing())
    generator = torch.Generator().manual_seed(0)
    decoder.generate([1], planner, 12, generator)
    first = len(planner.history)
    assert planner._optimistic_plans[0] and planner.evidence["model"].attempts
    expected = planner.best().candidate.label
    decoder.generate([1], planner, 12, generator)
    assert planner.history[first][1] == expected and not any(planner._optimistic_plans[1:])


def test_one_draft_acceptance_comes_from_the_overlap_of_every_verified_node():
    """A budgeted tree gives one child where its draft is confident, so the descents of its
    one-child nodes overstate what a chain would see. Here every one-child node descends
    but p and q overlap by 0.5 at every node: a(d, 1) follows Σ min(p, q) (→ 0.5), not the
    descents (→ 1)."""
    from specbound.engine.tree import DraftTree

    vocab = 4
    target = torch.tensor([[0.5, 0.5, 0.0, 0.0]])
    draft = torch.tensor([0.0, 0.5, 0.5, 0.0])  # Σ min(p, q) = 0.5
    planner = Planner(AVX512_BF16["target"], {AS_LOADED: AVX512_BF16["draft"]})
    chain = next(method for candidate, method in planner._methods.items() if candidate.label == "chain γ=1")
    for _ in range(200):
        tree = DraftTree.root_only(0)
        tree.expand(0, draft, torch.tensor([1]), "with_replacement")
        planner.observe(chain, tree, [1], [target, torch.full((1, vocab), 0.25)])
    evidence = planner.evidence["model"]
    assert evidence.accepts[(0, 1)] == evidence.attempts[(0, 1)] == 200
    assert abs(planner.acceptance(0, 1) - 0.5) < 0.03
    assert abs(planner.acceptance(3, 1) - 0.5) < 0.03  # the pooled single-draft prior, too


def test_a_budgeted_tree_is_predicted_with_the_children_its_path_nodes_had():
    """A budget spreads its nodes over the tree: here the accepted path's nodes had one child
    each and the tree ended at depth 2, so the prediction is a(0, 1) + a(0, 1)·a(1, 1) — not
    the shape's most children at every depth down to its full depth."""
    from specbound.engine.tree import DraftTree

    planner = Planner(AVX512_BF16["target"], {AS_LOADED: AVX512_BF16["draft"]})
    candidate, method = next((c, m) for c, m in planner._methods.items() if m.name.startswith("sparse 6/4"))
    draft = torch.tensor([0.5, 0.5, 0.0, 0.0])
    before = planner._accepted(candidate, method, optimistic=False)
    for _ in range(4):
        tree = DraftTree.root_only(0)
        first = tree.expand(0, draft, torch.tensor([1]), "with_replacement")[0]
        second = tree.expand(first, draft, torch.tensor([0]), "with_replacement")[0]
        planner.observe(method, tree, [first, second])
    a0, a1 = planner.acceptance(0, 1), planner.acceptance(1, 1)
    assert planner._path_children[candidate] == {0: {1: 4}, 1: {1: 4}, 2: {0: 4}}
    assert abs(planner._accepted(candidate, method, optimistic=False) - (a0 + a0 * a1)) < 1e-12
    assert before > a0 + a0 * a1 + 0.5  # two children at each of its 3 budgeted depths: 2.44 here


def test_a_depth_no_plan_reached_is_predicted_from_the_depth_above_it():
    """Chains of γ = 5 verify nothing at depths 5–7; their one-draft acceptance follows the
    deepest depth seen (0.95 here), not the mean over all depths that the hard first depth
    (0.5) pulls down — which made deeper chains look worse than they run."""
    from specbound.engine.tree import DraftTree

    planner = Planner(AVX512_BF16["target"], {AS_LOADED: AVX512_BF16["draft"]})
    chain = next(method for candidate, method in planner._methods.items() if candidate.label == "chain γ=5")
    draft = torch.tensor([0.5, 0.5, 0.0, 0.0])
    hard = torch.tensor([[0.0, 0.5, 0.5, 0.0]])  # overlap with the draft 0.5
    easy = torch.tensor([[0.475, 0.525, 0.0, 0.0]])  # overlap 0.975
    for _ in range(100):
        tree, node, path = DraftTree.root_only(0), 0, []
        for _ in range(5):
            node = tree.expand(node, draft, torch.tensor([1]), "with_replacement")[0]
            path.append(node)
        planner.observe(chain, tree, path, [hard] + [easy] * 5)
    # 100 verifications a depth against a pseudo-count of 8: each estimate within ~0.03 of its depth's
    assert planner.acceptance(0, 1) < 0.55 and planner.acceptance(4, 1) > 0.96
    assert planner.acceptance(7, 1) > 0.96  # the pooled mean over depths 0-4 is 0.88


def test_prompt_lookup_has_its_own_evidence_and_its_misses_count():
    """Lookup steps teach the planner nothing about the draft model, and a lookup step with
    no match is a step that accepted nothing (its a(0, 1) falls with the misses)."""
    from specbound.engine.planner import default_candidates
    from specbound.engine.tree import DraftTree

    planner = Planner(AVX512_BF16["target"], {AS_LOADED: AVX512_BF16["draft"]}, default_candidates(lookup=True))
    lookup = next(method for candidate, method in planner._methods.items() if candidate.label == "lookup chain γ=2")
    model_before = planner.acceptance(0, 1)
    point_mass = torch.tensor([0.0, 1.0, 0.0, 0.0])
    for step in range(100):
        tree = DraftTree.root_only(0)
        if step % 4 == 0:  # a match one step in four, always accepted
            tree.expand(0, point_mass, torch.tensor([1]), "with_replacement")
            planner.observe(lookup, tree, [1], [torch.tensor([[0.0, 1.0, 0.0, 0.0]]), torch.full((1, 4), 0.25)])
        else:
            planner.observe(lookup, tree, [], [torch.full((1, 4), 0.25)])
    assert planner.acceptance(0, 1) == model_before
    assert abs(planner.acceptance(0, 1, drafter="lookup") - 0.25) < 0.05
    assert planner.evidence["lookup"].attempts[(0, 1)] == 100


def test_auto_with_prompt_lookup_is_lossless(target_model, draft_model):
    """auto choosing between the draft model and prompt lookup step by step (one drafter
    behind the other: DrafterChoice) keeps the target's law."""
    from specbound.engine import PromptLookupDrafter
    from specbound.engine.drafters import DrafterChoice
    from specbound.engine.planner import default_candidates

    processing = Processing()
    planner = Planner(AVX512_BF16["target"], {AS_LOADED: AVX512_BF16["draft"]}, default_candidates(4, lookup=True),
                      replan_every=1)
    drafters = {"model": ModelDrafter(CausalLM(draft_model), processing, planner.variant_for_rows),
                "lookup": PromptLookupDrafter(vocab_size=6)}
    decoder = Decoder(CausalLM(target_model), DrafterChoice(drafters), processing, eos_token_ids=[EOS])
    prompt = [1, 2, 1]
    generator = torch.Generator().manual_seed(0)
    samples = [tuple(decoder.generate(prompt, planner, 3, generator).tokens) for _ in range(400)]
    assert {label.split()[0] for _, label, _ in planner.history} >= {"lookup"}
    assert chi_square_pvalue(samples, exact_sequence_law(target_model, prompt, processing, 3)) > SIGNIFICANCE


def test_a_plan_predicted_barely_faster_than_plain_decoding_is_not_taken():
    """MIN_GAIN: a best plan (chain γ = 1) predicted 1.05× plain decoding is left for plain
    decoding (the prediction leaves out the time outside the models); where rows are
    cheaper a chain predicted well past MIN_GAIN is taken."""
    from specbound.engine.planner import MIN_GAIN

    free_draft = {AS_LOADED: Costs({1: 1e-6, 2: 1e-6})}
    close = Planner(Costs({1: 0.010, 2: 0.010 * 1.9 / 1.05}), free_draft)
    chain = next(candidate for candidate in close.candidates if candidate.label == "chain γ=1")
    assert 1.0 < close.predict(chain, optimistic=True).tokens_per_second / close.predict(close.candidates[0]).tokens_per_second < MIN_GAIN
    assert close.best(optimistic=True).candidate.method == "autoregressive"
    clear = Planner(Costs({1: 0.010, 2: 0.015}), free_draft)
    best = clear.best(optimistic=True)
    assert best.candidate.method == "chain"
    assert best.tokens_per_second > MIN_GAIN * clear.predict(clear.candidates[0]).tokens_per_second


def test_a_long_lived_planner_keeps_its_latest_plans_and_describes_one_generation(target_model, draft_model,
                                                                                   monkeypatch):
    """A server's planner plans for as long as it runs: it keeps the latest ``PLAN_HISTORY``
    plans (16 here), counts them all, and ``describe(since=plans_made before a generation)``
    gives that generation's plans alone (what ``Speculator.generate`` returns as
    ``Result.plan``)."""
    monkeypatch.setattr(planner_module, "PLAN_HISTORY", 16)
    decoder, planner = auto_decoder(target_model, draft_model, Processing())
    before = planner.plans_made
    decoder.generate([1], planner, 6, torch.Generator().manual_seed(0))
    first = planner.describe(since=before)
    assert first and first == planner.describe() and planner.plans_made == len(planner.history) > before
    middle = planner.plans_made
    decoder.generate([1], planner, 6, torch.Generator().manual_seed(1))
    second = planner.describe(since=middle)
    assert second and second.startswith("step 0:") and planner.describe() == f"{first}; {second}"
    for step in range(32):
        planner.method_for(2 * step)
    assert len(planner.history) == len(planner._optimistic_plans) == 16
    assert planner.plans_made == middle + second.count("step ") + 32
    assert planner.describe(since=planner.plans_made - 3).count("step ") == 3
    assert planner.describe(since=0).count("step ") == 16  # the evicted ones are gone
