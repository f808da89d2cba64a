"""``audit``: correct speculative samplers pass, the two bug families of issue 42 fail (fixed
seeds), our engine passes on tiny models on both backends, bad input is refused naming it.

The bug families run on bigram tables (``support.audit``: exact rows, thousands of samples
in a second); our engine runs on the engine tests' tiny transformers models."""

import math

import numpy as np
import pytest
import torch

from support.audit import (TableModel, TableReference, bigram_pair, chain_sampler, draw, exact_sampler, laws, prompts,
                            shifted_sampler)
from support.models import EOS, noisy_copy, tiny_model
from specbound.audit import audit
from specbound.audit.reference import Reference
from specbound.audit.samplers import engine_sampler
from specbound.engine import CausalLM, Decoder, ModelDrafter, Processing, build_method

LEVEL = 1e-3
TOP_K = 3


@pytest.fixture(scope="module")
def bigram():
    target, draft = bigram_pair()
    processing = Processing(0.7, TOP_K)
    return {"reference": TableReference(target), "target": laws(target, processing),
            "draft": laws(draft, processing), "draft_without_top_k": laws(draft, Processing(0.7))}


def run(sampler, reference, samples=1024, max_new_tokens=16, count=4, **tolerances):
    return audit(sampler, reference, prompts(count), temperature=0.7, top_k=TOP_K, max_new_tokens=max_new_tokens,
                 samples=samples, seed=1, level=LEVEL, **tolerances)


# the tables' rows are exact: no rounding to tolerate
EXACT = {"tolerance": 0.0, "row_tolerance": 0.0, "sharpness_tolerance": 0.0, "variance_tolerance": 0.0}


@pytest.mark.parametrize("tolerances", [EXACT, {}], ids=["exact", "default-tolerances"])
def test_speculative_sampling_passes(bigram, tolerances):
    for sampler in (exact_sampler(bigram["target"]), chain_sampler(bigram["target"], bigram["draft"])):
        result = run(sampler, bigram["reference"], samples=512, **tolerances)
        assert result.passed and result.p_value > 0.1


def test_rejection_sampling_from_the_target_instead_of_the_residual_fails(bigram):
    sampler = chain_sampler(bigram["target"], bigram["draft"], bug="target_residual")
    result = run(sampler, bigram["reference"], samples=4096)  # at the default (widest) tolerances
    assert not result.passed and result.p_value < 1e-4


@pytest.mark.parametrize("tolerances, samples, max_new_tokens", [(EXACT, 1024, 16), ({}, 4096, 16)],
                         ids=["exact", "default-tolerances"])
def test_a_draft_law_other_than_the_one_drafted_from_fails(bigram, tolerances, samples, max_new_tokens):
    """Drafts drawn with top-k, the ratio and residual computed with q without it (the
    transformers bug of issue 42: a TV of 0.05 per token here, as there)."""
    sampler = chain_sampler(bigram["target"], bigram["draft"], ratio_laws=bigram["draft_without_top_k"])
    result = run(sampler, bigram["reference"], samples, max_new_tokens, count=8, **tolerances)
    assert not result.passed and result.p_value < 1e-4


def test_a_bias_toward_the_most_likely_token_fails(bigram):
    """Half the tokens replaced by the most likely one: a sharpening (the power at a given
    shift is proven on numbers alone, ``test_audit_statistics``)."""
    result = run(shifted_sampler(bigram["target"], 0.5), bigram["reference"], samples=256)
    assert not result.passed and result.pooled.p_value < LEVEL


def test_result_reports_positions_and_samples(bigram):
    seen = []
    result = audit(exact_sampler(bigram["target"]), bigram["reference"], prompts(3), temperature=0.7, top_k=TOP_K,
                   max_new_tokens=5, samples=7, seed=2, on_sample=lambda index, record: seen.append(index))
    assert seen == list(range(7))
    assert [record["prompt"] for record in result.samples] == [0, 0, 0, 1, 1, 2, 2]
    assert len(set(record["seed"] for record in result.samples)) == 7
    assert [stat.position for stat in result.positions] == [1, 2, 3, 4, 5]
    assert all(stat.scored == 7 for stat in result.positions) and result.scored == 35
    assert result.pit.shape == (7, 5) and np.all((0 <= result.pit) & (result.pit <= 1))
    assert math.isinf(result.detectable_tv)  # 35 values detect nothing at 1e-3
    again = audit(exact_sampler(bigram["target"]), bigram["reference"], prompts(3), temperature=0.7, top_k=TOP_K,
                  max_new_tokens=5, samples=7, seed=2)
    assert again.p_value == result.p_value and np.array_equal(again.pit, result.pit)


def test_positions_after_an_early_end_are_fresh_uniforms_and_raise_detectable_tv(bigram):
    full = exact_sampler(bigram["target"])
    half = audit(lambda prompt, length, seed: full(prompt, length // 2, seed), bigram["reference"], prompts(4),
                 temperature=0.7, top_k=TOP_K, max_new_tokens=16, samples=512, seed=3)
    assert half.passed and half.scored == 512 * 8
    assert [stat.scored for stat in half.positions] == [512] * 8 + [0] * 8
    whole = run(full, bigram["reference"], samples=512)
    assert half.detectable_tv == pytest.approx(2 * whole.detectable_tv)


@pytest.mark.parametrize("sampler, message", [
    (lambda prompt, length, seed: 1 / 0, "sampler: raised ZeroDivisionError"),
    (lambda prompt, length, seed: [99], "sampler: sample 0 returned token id 99, outside the reference's vocabulary"),
    (lambda prompt, length, seed: [-1], "outside the reference's vocabulary"),
    (lambda prompt, length, seed: "3 4", "sampler: sample 0 returned str, not a list of token ids"),
    (lambda prompt, length, seed: [1.5], "returned a list holding float, not a list of token ids"),
    (lambda prompt, length, seed: [1, "2"], "returned a list holding str"),
    (lambda prompt, length, seed: [1] * (length + 1), "more than max_new_tokens"),
])
def test_a_bad_sampler_is_refused_naming_it(bigram, sampler, message):
    with pytest.raises(ValueError, match=message):
        audit(sampler, bigram["reference"], prompts(2), temperature=0.7, max_new_tokens=4, samples=4)


@pytest.mark.parametrize("arguments, message", [
    ({"prompts": []}, "prompts: expected a non-empty list"),
    ({"prompts": [[1, 2], [40]]}, r"prompts: prompt 1 holds ids outside the reference's vocabulary \[0, 12\)"),
    ({"prompts": [[]]}, "prompts: prompt 0 is not a non-empty list"),
    ({"samples": 0}, "samples"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"level": 1.0}, "level"),
    ({"tolerance": -0.1}, "tolerance"),
    ({"temperature": -1.0}, "temperature"),
    ({"vocab_size": 13}, "vocab_size: 13 exceeds the reference's 12 logits"),
])
def test_bad_arguments_are_refused_naming_them(bigram, arguments, message):
    given = {"prompts": prompts(2), "temperature": 0.7, "max_new_tokens": 4, "samples": 4} | arguments
    with pytest.raises(ValueError, match=message):
        audit(exact_sampler(bigram["target"]), bigram["reference"], **given)


def test_a_reference_of_another_kind_is_refused():
    with pytest.raises(ValueError, match="reference: expected a .gguf file, a Hugging Face folder or a loaded model"):
        audit(lambda prompt, length, seed: [1], 42, [[1]], temperature=0.7, max_new_tokens=1, samples=1)
    with pytest.raises(ValueError, match="reference: .* is neither a .gguf file nor a Hugging Face folder"):
        audit(lambda prompt, length, seed: [1], "/nonexistent/model", [[1]], temperature=0.7, max_new_tokens=1,
              samples=1)


# -- our engine on tiny models ---------------------------------------------------------------

ENGINE_PROMPTS = [[1, 2, 3], [4, 5], [2, 2, 1, 3]]


@pytest.fixture(scope="module")
def tiny_models():
    target = tiny_model(seed=0)
    return target, noisy_copy(target, seed=1, noise=0.7)


@pytest.mark.parametrize("method, options", [("chain", {"gamma": 3}), ("tree", {"num_drafts": 2, "depth": 2})])
def test_our_engine_passes_on_torch(tiny_models, method, options):
    target, draft = tiny_models
    processing = Processing(0.8)
    decoder = Decoder(CausalLM(target), ModelDrafter(CausalLM(draft), processing), processing, (EOS,))
    result = audit(engine_sampler(decoder, build_method(method, **options)), target, ENGINE_PROMPTS,
                   temperature=0.8, max_new_tokens=6, samples=64, seed=0)
    assert result.passed, result.p_value
    assert 0 < result.scored <= 64 * 6


def test_our_engine_passes_on_llama_cpp_against_a_gguf_file_without_tokenizer(tiny_models, tmp_path):
    pytest.importorskip("llama_cpp")
    from specbound.models.tiny import write_gguf
    from specbound.engine.backends.llamacpp import LlamaCppLM, LlamaCppModel

    target, draft = tiny_models
    files = [write_gguf(model, tmp_path / f"{name}.gguf") for name, model in (("target", target), ("draft", draft))]
    processing = Processing(0.8)
    decoder = Decoder(LlamaCppLM(LlamaCppModel(files[0], threads=1)),
                      ModelDrafter(LlamaCppLM(LlamaCppModel(files[1], threads=1)), processing), processing, (EOS,))
    result = audit(engine_sampler(decoder, build_method("chain", gamma=3)), str(files[0]), ENGINE_PROMPTS,
                   temperature=0.8, max_new_tokens=6, samples=64, seed=0)
    assert result.passed, result.p_value


def test_null_audits_fail_at_most_at_the_level_rate(bigram):
    """Whole audits of a sampler with the reference's exact law, at level 0.1 and no
    tolerance (the tables' rows are exact): the failure rate stays within the binomial
    bound of the level."""
    from scipy import stats as scipy_stats

    audits, level = 150, 0.1
    failed = sum(audit(exact_sampler(bigram["target"]), bigram["reference"], prompts(2), temperature=0.7,
                       top_k=TOP_K, max_new_tokens=4, samples=24, seed=seed, level=level, **EXACT).verdict == "failed"
                 for seed in range(audits))
    assert failed <= scipy_stats.binom.isf(1e-4, audits, level)


def test_tolerances_are_measured_on_the_reference_and_explicit_ones_override(bigram, tiny_models):
    """A reference of the engine's protocol is scored again at ``SHAPES`` at every scored
    position and the tolerances are set from what that measures (float32 rows agree to
    rounding: the floor); one with no batch shapes (a table) gets the widest stated; a
    tolerance given explicitly replaces the measured one."""
    from specbound.audit.tolerances import (MARGIN, ROUNDING_FLOOR, ROW_TOLERANCE, SHAPES, SHARPNESS_TOLERANCE,
                                            TOLERANCE, VARIANCE_TOLERANCE)

    def tolerances(result):
        return result.tolerance, result.row_tolerance, result.sharpness_tolerance, result.variance_tolerance

    table = run(exact_sampler(bigram["target"]), bigram["reference"], samples=8, max_new_tokens=2)
    assert tolerances(table) == (TOLERANCE, ROW_TOLERANCE, SHARPNESS_TOLERANCE, VARIANCE_TOLERANCE)
    assert not table.rounding.measured and "measuring" not in table.seconds or table.seconds["measuring"] == 0
    target, _ = tiny_models
    on_torch = audit(lambda prompt, count, seed: [1] * count, target, ENGINE_PROMPTS, temperature=0.8,
                     max_new_tokens=2, samples=4, seed=0)
    assert on_torch.rounding.measured and on_torch.rounding.shapes == list(SHAPES)
    assert on_torch.rounding.rows == on_torch.scored == 8 and on_torch.rounding.margin == MARGIN
    assert on_torch.rounding.max_tv < 1e-5 and on_torch.seconds["measuring"] > 0
    assert all(ROUNDING_FLOOR <= value < 2 * ROUNDING_FLOOR for value in tolerances(on_torch))
    given = audit(lambda prompt, count, seed: [1] * count, target, ENGINE_PROMPTS, temperature=0.8,
                  max_new_tokens=2, samples=4, seed=0, tolerance=0.0, row_tolerance=0.0, sharpness_tolerance=0.0,
                  variance_tolerance=0.0)
    assert tolerances(given) == (0.0, 0.0, 0.0, 0.0) and not given.rounding.measured
    assert given.rounding.given == ["tolerance", "row_tolerance", "sharpness_tolerance", "variance_tolerance"]
    some = audit(lambda prompt, count, seed: [1] * count, target, ENGINE_PROMPTS, temperature=0.8,
                 max_new_tokens=2, samples=4, seed=0, tolerance=0.01)
    assert some.tolerance == 0.01 and some.rounding.measured and some.sharpness_tolerance < 2 * ROUNDING_FLOOR


# -- a reference whose rows differ between batch shapes ---------------------------------------

class ShapeRoundingTable:
    """A bigram table behind the engine's language-model protocol whose rows round by batch
    shape, as kernels that are not batch-invariant do: a row's logits are the table's for its
    last token plus a perturbation fixed by its context and its forward's shape (entries, place)."""

    max_positions = None

    def __init__(self, table: torch.Tensor, size: float):
        self.table, self.size = table, size
        self.rows: dict[tuple, torch.Tensor] = {}
        self.reset()

    @property
    def logits_size(self) -> int:
        return self.table.shape[1]

    def row(self, context, entries: int, place: int) -> torch.Tensor:
        """# -> [vocab]"""
        key = (*context, -entries, place)
        if key not in self.rows:
            noise = np.random.default_rng([*context, 1000 + entries, place]).standard_normal(self.logits_size)
            self.rows[key] = self.table[context[-1]] + self.size * torch.from_numpy(noise).float()
        return self.rows[key]

    def reset(self, batch_size: int = 1, cells=None) -> None:
        self.committed, self.pending = [], []  # pending: (token, parent)

    def context(self, parent: int) -> list[int]:
        """The committed tokens and the pending chain ending at ``parent``."""
        chain = []
        while parent >= 0:
            token, parent = self.pending[parent]
            chain.append(token)
        return self.committed + chain[::-1]

    def prefill(self, row: int, token_ids) -> torch.Tensor:
        self.committed = list(token_ids)
        return self.row(self.committed, len(self.committed), len(self.committed) - 1)[None]

    def score(self, entries):
        row = entries[0]
        logits = []
        for place, (token, parent) in enumerate(zip(row.tokens, row.parents)):
            logits.append(self.row(self.context(parent) + [token], len(row.tokens), place))
            self.pending.append((token, parent))
        scored = torch.stack(logits)

        class Scores:
            def logits(self, row: int = 0, chosen=None) -> torch.Tensor:
                return scored
        return Scores()

    def commit(self, paths) -> None:
        self.committed = self.context(paths[0][-1]) if paths[0] else self.committed
        self.pending = []


def shape_sampler(model: ShapeRoundingTable, processing, entries: int = 2):
    """A correct engine on ``model``: each token drawn from the row as its own forwards compute
    it — the prompt's prefill, then ``entries`` rows a forward — not as the reference does nor
    as it measures (``audit.tolerances.SHAPES``)."""
    laws = {}

    def law(context, shape):
        key = (*context, *shape)
        if key not in laws:
            laws[key] = processing.probs(model.row(context, *shape)[None])[0].double().numpy()
        return laws[key]

    def sample(prompt, max_new_tokens, seed):
        rng = np.random.default_rng(seed)
        context = list(prompt)
        for position in range(max_new_tokens):
            shape = (len(prompt), len(prompt) - 1) if position == 0 else (entries, (position - 1) % entries)
            context.append(draw(law(context, shape), rng))
        return context[len(prompt):]
    return sample


def rounding_table(size: float):
    target, _ = bigram_pair()
    model = ShapeRoundingTable(target.table, size)
    return model, Reference(model)


def test_measured_tolerance_passes_a_correct_engine_on_shape_dependent_rows_at_the_level_rate():
    """The null of ``audit.tolerances`` by simulation: a correct engine whose rows are its own
    batch shape's (rounded otherwise than any the auditor measures: logits moved by 0.1 times a
    normal per shape, a mean TV of about 0.07 between shapes) fails at most at the level's
    rate — while the same audit with the tolerances at 0 rejects it: the reference's own
    disagreement is real and seen."""
    from scipy import stats as scipy_stats

    model, reference = rounding_table(0.1)
    sampler = shape_sampler(model, Processing(0.7, TOP_K))
    audits, level = 30, 0.1
    results = [audit(sampler, reference, prompts(2), temperature=0.7, top_k=TOP_K, max_new_tokens=4, samples=256,
                     seed=seed, level=level) for seed in range(audits)]
    assert sum(result.verdict == "failed" for result in results) <= scipy_stats.binom.isf(1e-4, audits, level)
    assert all(result.rounding.measured and result.rounding.mean_tv > 0.03 for result in results)
    large = run(sampler, reference, samples=3000, max_new_tokens=4, count=2)
    assert large.passed
    assert run(sampler, reference, samples=3000, max_new_tokens=4, count=2, **EXACT).verdict == "failed"


def test_measured_tolerance_still_catches_a_bias_on_shape_dependent_rows():
    """Rows moved by 0.01 times a normal per shape (a mean TV of about 0.007 between shapes): a
    fifth of the tokens replaced by the most likely one is caught."""
    model, reference = rounding_table(0.01)
    processing = Processing(0.7, TOP_K)
    correct = run(shape_sampler(model, processing), reference, samples=3000, max_new_tokens=4, count=2)
    assert correct.passed and 0.002 < correct.rounding.mean_tv < 0.02
    result = run(shifted_sampler(laws(TableModel(model.table), processing), 0.2), reference, samples=3000,
                 max_new_tokens=4, count=2)
    assert result.verdict == "failed" and result.p_value < 1e-6


# -- verdicts -----------------------------------------------------------------------------------

def test_an_audit_that_scored_nothing_is_inconclusive_not_passed(bigram):
    result = run(lambda prompt, length, seed: [], bigram["reference"], samples=64)
    assert result.verdict == "inconclusive" and not result.passed and result.scored == 0
    assert result.needed_samples is None and "no position was scored" in result.reason


def test_an_audit_too_small_to_detect_anything_is_inconclusive_and_says_what_would_do(bigram):
    small = audit(exact_sampler(bigram["target"]), bigram["reference"], prompts(3), temperature=0.7, top_k=TOP_K,
                  max_new_tokens=5, samples=7, seed=2, **EXACT)
    assert small.verdict == "inconclusive" and not small.passed
    assert math.isinf(small.detectable_tv) and small.detectable_sharpening >= 1
    needed = small.needed_samples
    assert needed is not None and needed > 7 and "detect no per-position TV" in small.reason
    enough = audit(exact_sampler(bigram["target"]), bigram["reference"], prompts(3), temperature=0.7, top_k=TOP_K,
                   max_new_tokens=5, samples=needed, seed=2, **EXACT)
    assert enough.verdict == "passed" and enough.detectable_tv <= 0.5


def test_verdicts_and_their_reasons(bigram):
    sampler = chain_sampler(bigram["target"], bigram["draft"], bug="target_residual")
    failed = run(sampler, bigram["reference"], samples=4096)
    assert failed.verdict == "failed" and not failed.passed and failed.reason.startswith("p = ")
    assert failed.needed_samples is None and "rejects" in failed.reason
    passed = run(exact_sampler(bigram["target"]), bigram["reference"], samples=512)
    assert passed.verdict == "passed" and passed.passed and passed.needed_samples is None


def test_the_result_as_json_is_strict(bigram):
    """No NaN or Infinity (strict parsers refuse them): undefined figures are null."""
    import json

    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")

    for result in (run(lambda prompt, length, seed: [], bigram["reference"], samples=8, max_new_tokens=2),
                   run(exact_sampler(bigram["target"]), bigram["reference"], samples=64)):
        summary = json.loads(result.to_json(), parse_constant=refuse)
        assert summary["verdict"] == result.verdict and summary["passed"] == result.passed
        assert set(summary["rounding"]) >= {"measured", "shapes", "rows", "mean_tv", "max_tv", "margin", "given"}
    empty = json.loads(run(lambda prompt, length, seed: [], bigram["reference"], samples=8,
                           max_new_tokens=2).to_json(), parse_constant=refuse)
    assert empty["detectable_tv"] is None and empty["shared_context"]["observed"] is None
