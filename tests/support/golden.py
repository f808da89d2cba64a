"""Golden outputs: what the command line and the engine produce on fixed inputs and seeds.

Recorded before the package was reorganised (``cd tests && python -m support.golden --record``)
and checked by ``tests/test_golden_outputs.py`` ever since, so that moving code never
changes a number: the exact acceptances of ``specbound accept``, the optima and
certificates of ``specbound bounds``, the tables of ``specbound theory``, the engine's
tokens and counts for fixed seeds on the tiny test models, and the records of the three
studies on the tiny pair.

Each output is produced through the public entry points only (the command line's
``main`` and the engine and study classes), so the recorder survives a reorganisation.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

GOLDEN_FILE = Path(__file__).resolve().parents[1] / "golden" / "golden.json"

FIXTURES = {
    "A": ("0.4,0.3,0.2,0.1", "0.1,0.2,0.3,0.4"),
    "B": ("0.5,0.25,0.15,0.07,0.03", "0.3,0.3,0.2,0.1,0.1"),
}


def _random_pairs() -> dict[str, tuple[str, str]]:
    rng = np.random.default_rng(7)
    pairs = {}
    for index, vocab in enumerate((5, 7)):
        target = rng.dirichlet(np.full(vocab, 0.7))
        draft = rng.dirichlet(np.full(vocab, 0.7))
        target[index] = 0.0
        draft[vocab - 1 - index] = 0.0
        target, draft = target / target.sum(), draft / draft.sum()
        pairs[f"random{vocab}"] = (",".join(repr(float(v)) for v in target), ",".join(repr(float(v)) for v in draft))
    return pairs


def _cli_json(argv: list[str]) -> object:
    from specbound.cli import main

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(io.StringIO()):
        code = main(argv)
    if code != 0:
        raise RuntimeError(f"{argv}: exit {code}")
    return json.loads(buffer.getvalue())


def _without_paths(payload):
    """Drop file paths (they name a temporary folder)."""
    if isinstance(payload, dict):
        return {key: _without_paths(value) for key, value in payload.items() if key != "figure"}
    if isinstance(payload, list):
        return [_without_paths(value) for value in payload]
    return payload


def command_outputs() -> dict:
    outputs = {}
    pairs = {**FIXTURES, **_random_pairs()}
    for name, (target, draft) in pairs.items():
        for num_drafts in (1, 2, 3):
            outputs[f"accept {name} n={num_drafts}"] = _cli_json(
                ["accept", "--target", target, "--draft", draft, "-n", str(num_drafts), "--json"])
            outputs[f"bounds optimum {name} n={num_drafts}"] = _cli_json(
                ["bounds", "optimum", "--target", target, "--draft", draft, "-n", str(num_drafts), "--json"])
    with tempfile.TemporaryDirectory() as folder:
        outputs["bounds plot A"] = _cli_json(["bounds", "plot", "--max-drafts", "3", "--out", folder, "--json"])
        theory = {
            "convergence": ["--horizon", "12", "--vocab", "4", "--runs", "300", "--lookaheads", "2,3"],
            "drafts": ["--horizon", "10", "--vocab", "4", "--max-drafts", "40", "--simulated-drafts", "1,2,4",
                       "--runs", "200"],
            "improvement": ["--max-drafts", "8"],
            "pareto": ["--random-points", "20"],
        }
        for figure, options in theory.items():
            outputs[f"theory {figure}"] = _without_paths(
                _cli_json(["theory", figure, "--out", folder, "--json", *options]))
    return outputs


ENGINE_CASES = {
    "autoregressive": ("autoregressive", {}),
    "chain γ=3": ("chain", {"gamma": 3}),
    "tree 2×2 rrs": ("tree", {"num_drafts": 2, "depth": 2, "verifier": "rrs"}),
    "tree 2×2 rrs_without_replacement": ("tree", {"num_drafts": 2, "depth": 2, "verifier": "rrs_without_replacement"}),
    "tree 2×2 kseq": ("tree", {"num_drafts": 2, "depth": 2, "verifier": "kseq"}),
    "tree 3×2 greedy": ("tree", {"num_drafts": 3, "depth": 2, "verifier": "greedy"}),
    "tree 2×2 spechub": ("tree", {"num_drafts": 2, "depth": 2, "verifier": "spechub"}),
    "tree 2×1 optimal": ("tree", {"num_drafts": 2, "depth": 1, "verifier": "optimal"}),
    "batch M=2 γ=3": ("batch", {"num_drafts": 2, "gamma": 3}),
    "decoding_opt γ=3 ε=0.2": ("decoding_opt", {"gamma": 3, "epsilon": 0.2}),
    "decoding_uno γ=3 ε=0.2": ("decoding_uno", {"gamma": 3, "epsilon": 0.2}),
}
ENGINE_SETTINGS = {
    "T=1": {},
    "T=0.7 top_k=4": {"temperature": 0.7, "top_k": 4},
    "T=0.8 top_p=0.8": {"temperature": 0.8, "top_p": 0.8},
}


def _tiny_models():
    from support.models import noisy_copy, tiny_model

    target = tiny_model(seed=0)
    return target, noisy_copy(target, seed=1, noise=0.7)


def engine_outputs() -> dict:
    """Tokens and counts of each method on the tiny models, three seeds per setting."""
    from specbound.engine import CausalLM, Decoder, ModelDrafter, Processing, PromptLookupDrafter
    from specbound.engine.methods import build_method

    torch.set_num_threads(1)
    target, draft = _tiny_models()
    outputs = {}
    for setting, processing_options in ENGINE_SETTINGS.items():
        processing = Processing(**processing_options)
        decoder = Decoder(CausalLM(target), ModelDrafter(CausalLM(draft), processing), processing, eos_token_ids=[0])
        lookup = Decoder(CausalLM(target), PromptLookupDrafter(6), processing, eos_token_ids=[0])
        cases = {label: (decoder, name, options) for label, (name, options) in ENGINE_CASES.items()}
        cases["prompt lookup chain γ=4"] = (lookup, "chain", {"gamma": 4})
        for label, (engine, name, options) in cases.items():
            method = build_method(name, **options)
            runs = []
            for seed in (0, 1, 2):
                generation = engine.generate([1, 2, 1, 3], method, 14, torch.Generator().manual_seed(seed))
                stats = generation.stats
                runs.append({
                    "tokens": generation.tokens, "finish_reason": generation.finish_reason,
                    "target_calls": stats.target_calls, "draft_calls": stats.draft_calls,
                    "rejections": stats.rejections, "accepted_lengths": stats.accepted_lengths,
                })
            outputs[f"{setting} {label}"] = runs
    return outputs


def study_outputs() -> dict:
    """Records (positions and runs, timings left out) of each study on the tiny pair."""
    from specbound.models.tiny import tiny_pair, tiny_prompts

    from specbound.studies.acceptance import AcceptanceStudy
    from specbound.studies.bias import BiasStudy
    from specbound.studies.rejections import RejectionsStudy
    from specbound.studies.runner import run_study

    torch.set_num_threads(1)
    studies = {
        "acceptance": AcceptanceStudy(num_drafts=(2, 3), max_new_tokens=8, tail_budget=0.0),
        "acceptance chain tail": AcceptanceStudy(num_drafts=(2,), max_new_tokens=8, generation_gamma=2),
        "rejections": RejectionsStudy(max_new_tokens=8, lookaheads=(None, 2), batch_sizes=(1, 2)),
        "bias": BiasStudy(epsilons=(0.1, 0.4), gamma=2, max_new_tokens=8),
    }
    outputs = {}
    for label, study in studies.items():
        with tempfile.TemporaryDirectory() as folder:
            results = run_study(study, tiny_pair(), tiny_prompts(2), Path(folder) / "s", "toy", seed=3,
                                progress=False)
            outputs[f"study {label}"] = {"positions": results.positions, "runs": results.runs}
    return outputs


def all_outputs() -> dict:
    return {**command_outputs(), **engine_outputs(), **study_outputs()}


def _normalised(payload):
    """As JSON reads it back (tuples become lists, dict keys become strings)."""
    return json.loads(json.dumps(payload))


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        sys.exit("usage: cd tests && python -m support.golden --record")
    GOLDEN_FILE.write_text(json.dumps(_normalised(all_outputs()), indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {GOLDEN_FILE}")
