"""The auditor on real engines: who passes, what it detects, what it costs.

Sections (``--sections``, all by default), each a list of records in one record's result
(``benchmarks.record``):

- ``ours``: every audited method of ours (``METHODS``) on both backends (llama.cpp, torch),
  against the target without speculation;
- ``llama-cpp-python``: its prompt-lookup and draft-model modes (top-p 1: its sampler chain
  applies the temperature after top-p);
- ``transformers``: assisted generation (``assistant_model``) at T = 0.7 and top-k 50, on the
  transformers installed (for another release, run this section with the python of a
  virtualenv holding it: ``--sections transformers``). The q bug of transformers#47932 (fixed
  by #48007) lies in its DFlash, MTP and single-position multi-token candidate generators,
  which return raw logits for drafts drawn from processed ones; the assistant-model generator
  returns the assistant's processed scores (``assistant_output.scores``) and is expected to
  pass on either side of the fix. Auditing the faulty ones needs a model with an MTP head or a
  DFlash drafter, which the embedded pair has not; so the section also audits the assistant
  path with the raw logits handed over as q (``RawLogitsAssistant``), the same bug. On the
  embedded pair that bug is a temperature error of about 11–13% (``bench_audit_bias``):
  catching it takes thousands of positions, e.g. ``--prompts mt_bench --limit 8 --samples
  256 --max-new-tokens 32``;
- ``power``: detection rate against injected bias — samplers that, at every position, emit
  the reference's most likely token with probability ``bias`` (else a draw from its law), on
  bigram tables (exact rows) at this run's sample size, ``--repeats`` audits per bias;
- ``optimum``: what recording the exact acceptance and α* at every verified position costs
  (``engine.optimum``): decoding time with the recorder computing at every position against
  none, per method on llama.cpp.

Every audit records its verdict, p-value (and each test's), detectable TV and temperature
error, tolerances and seconds (sampling, scoring: the auditor's cost). ``--tiny`` runs
everything on tiny random-weight models (``specbound.models.tiny``; seconds), the check that the
script works; the real run is the embedded pair:

    python -m benchmarks.audit.bench_audit --samples 128 --max-new-tokens 16 --limit 4 --threads 2

Each sample prefills its prompt again, so a run's time is mostly prefills and decoding of the
samples: on 2 cores an audit of 1,536 positions takes 3–6 min on llama.cpp and of 1,024 about
4.5 min on torch, transformers' 8,192 about 35 min (``benchmarks/README.md``); ``--sections``,
``--backends`` and ``--methods`` run a part.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import record
from specbound.audit import audit
from specbound.audit.reference import pair_reference
from specbound.audit.samplers import ModelDraft, engine_sampler, llama_cpp_sampler, transformers_sampler
from specbound.engine import Processing, Sampling

METHODS = [("chain", {"gamma": 3}), ("chain", {"gamma": 3, "verifier": "block"}),
           ("tree", {"num_drafts": 2, "depth": 2}), ("tree", {"num_drafts": 2, "depth": 2, "verifier": "traversal"}),
           ("batch", {"num_drafts": 2, "gamma": 3}), ("sparse", {"budget": 8, "depth": 4}),
           ("tree", {"num_drafts": 2, "depth": 2, "verifier": "global_resolution"}),
           ("tree", {"num_drafts": 2, "depth": 2, "verifier": "univer"})]
TORCH_METHODS = METHODS[:1] + METHODS[2:3]  # torch's bf16 CPU forwards are slower: the two main ones
BIASES = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8)
SECTIONS = ("ours", "llama-cpp-python", "transformers", "power", "optimum")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="default-target")
    parser.add_argument("--draft", default="default-draft")
    parser.add_argument("--prompts", default="instructions", help="short prompts: each sample prefills its prompt")
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--samples", type=int, default=128)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20, help="audits per bias of the power curve")
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--backends", default="llama.cpp,torch", help="backends of the `ours` section")
    parser.add_argument("--methods", default=None,
                        help="of `ours`, comma-separated indices into METHODS (default: all on llama.cpp, "
                        "TORCH_METHODS on torch)")
    parser.add_argument("--tiny", action="store_true", help="tiny random-weight models instead of the embedded pair")
    record.add_output(parser, "audit/audit.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sections = args.sections.split(",")
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        parser.error(f"--sections: unknown {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    if set(args.backends.split(",")) - {"llama.cpp", "torch"}:
        parser.error(f"--backends: choose from llama.cpp, torch; got {args.backends!r}")
    if args.methods is not None and not all(i.isdigit() and int(i) < len(METHODS) for i in args.methods.split(",")):
        parser.error(f"--methods: indices into METHODS, each below {len(METHODS)}; got {args.methods!r}")
    with tempfile.TemporaryDirectory() as scratch:
        models = TinyModels(Path(scratch)) if args.tiny else EmbeddedModels(args)
        records = {section: RUNNERS[section](args, models) for section in sections}
    record.write(args.output, {"settings": vars(args), **records})
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


class EmbeddedModels:
    """The embedded pair, loaded per backend on first use; prompts from ``--prompts``."""

    def __init__(self, args):
        self.args = args

    def pair(self, backend: str):
        from specbound.models.pair import load_pair

        return load_pair(self.args.target, self.args.draft, progress=False, backend=backend, threads=self.args.threads)

    def prompts(self, pair) -> list[list[int]]:
        from specbound.datasets import load_prompts

        return [pair.encode(prompt.text) for prompt in load_prompts(self.args.prompts, limit=self.args.limit)]

    def gguf_paths(self) -> tuple[str, str]:
        from specbound.models.loading import gguf_file

        return (str(gguf_file(self.args.target, progress=False)[0]), str(gguf_file(self.args.draft, progress=False)[0]))

    def torch_pair(self):
        return self.pair("torch")


class TinyModels:
    """The tiny random-weight models (``specbound.models.tiny``: 6 tokens, 2 layers), as a torch
    pair and GGUF files."""

    def __init__(self, folder: Path):
        from specbound.models.tiny import noisy_copy, tiny_model, write_gguf

        self.target = tiny_model(seed=0)
        self.draft = noisy_copy(self.target, seed=1, noise=0.7)
        self.files = (str(write_gguf(self.target, folder / "target.gguf")),
                      str(write_gguf(self.draft, folder / "draft.gguf")))

    def pair(self, backend: str):
        from specbound.engine.pair import ModelPair

        if backend == "torch":
            return ModelPair(self.target, self.draft, 6, (0,), encode=None)
        from specbound.engine.backends.llamacpp import LlamaCppModel

        return ModelPair(LlamaCppModel(self.files[0], threads=1), LlamaCppModel(self.files[1], threads=1), 6, (0,),
                         encode=None, backend="llama.cpp")

    def prompts(self, pair) -> list[list[int]]:
        return [[1, 2, 3], [4, 5], [2, 2, 1, 3]]

    def gguf_paths(self) -> tuple[str, str]:
        return self.files

    def torch_pair(self):
        return self.pair("torch")


def audited(args, label: dict, sampler, reference, prompts, vocab_size=None, top_k: int = 0) -> dict:
    started = time.perf_counter()
    result = audit(sampler, reference, prompts, temperature=args.temperature, top_k=top_k,
                   max_new_tokens=args.max_new_tokens, samples=args.samples, seed=0, vocab_size=vocab_size)
    entry = {**label, "verdict": result.verdict, "passed": result.passed, "p_value": result.p_value,
             "detectable_tv": result.detectable_tv, "pooled_p": result.pooled.p_value, "shared_p": result.shared.p_value,
             "sharpness_p": result.sharpness.p_value, "sharpening": result.sharpness.sharpening,
             "detectable_sharpening": result.detectable_sharpening, "positions": result.scored,
             "tolerances": [result.tolerance, result.row_tolerance, result.sharpness_tolerance,
                            result.variance_tolerance],
             "seconds": {**result.seconds, "total": time.perf_counter() - started}}
    print(json.dumps(entry), file=sys.stderr)
    return entry


def run_ours(args, models) -> list[dict]:
    from specbound.api import Speculator

    records = []
    chosen = METHODS if args.methods is None else [METHODS[int(i)] for i in args.methods.split(",")]
    on_torch = chosen if args.methods is not None else TORCH_METHODS
    for backend, methods in (("llama.cpp", chosen), ("torch", on_torch)):
        if backend not in args.backends.split(","):
            continue
        pair = models.pair(backend)
        speculator = Speculator(pair=pair, progress=False)
        prompts = models.prompts(pair)
        for name, options in methods:
            decoder, method = speculator.decoder_for(Sampling(args.temperature), name, options)
            records.append(audited(args, {"engine": "specbound", "backend": backend, "method": method.name},
                                   engine_sampler(decoder, method), pair_reference(pair), prompts, pair.vocab_size))
    return records


def run_llama_cpp_python(args, models) -> list[dict]:
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    target_path, draft_path = models.gguf_paths()
    prompts = models.prompts(models.pair("llama.cpp"))
    context = max(map(len, prompts)) + args.max_new_tokens + 16
    records = []
    for mode in ("prompt-lookup", "draft-model"):
        draft = (LlamaPromptLookupDecoding(num_pred_tokens=4) if mode == "prompt-lookup"
                 else ModelDraft(Llama(draft_path, n_ctx=context, n_threads=args.threads, verbose=False), 4))
        llama = Llama(target_path, n_ctx=context, n_threads=args.threads, draft_model=draft, verbose=False)
        records.append(audited(args, {"engine": "llama-cpp-python", "mode": mode},
                               llama_cpp_sampler(llama, args.temperature), target_path, prompts))
    return records


def run_transformers(args, models) -> list[dict]:
    """Assisted generation as it is, then with the assistant's raw logits handed over as q
    (transformers#47932's bug, reproduced on the assistant-model path)."""
    import transformers

    pair = models.torch_pair()
    prompts = models.prompts(pair)
    records = []
    for label, draft in (("assisted", pair.draft), ("assisted, raw logits as q", RawLogitsAssistant(pair.draft))):
        sampler = transformers_sampler(pair.target, args.temperature, top_k=50, assistant_model=draft,
                                       eos_token_ids=pair.eos_token_ids)
        records.append(audited(args, {"engine": "transformers", "version": transformers.__version__, "mode": label,
                                      "top_k": 50}, sampler, pair.target, prompts, pair.vocab_size, top_k=50))
    return records


class RawLogitsAssistant:
    """The assistant model, its ``generate`` returning the raw logits where transformers reads
    the processed scores the drafts were drawn from; everything else passed through."""

    def __init__(self, model):
        self.model = model

    def generate(self, *args, **kwargs):
        kwargs["generation_config"].output_logits = True
        output = self.model.generate(*args, **kwargs)
        output.scores = output.logits
        return output

    def __getattr__(self, name):
        return getattr(self.model, name)


def run_power(args, models) -> list[dict]:
    """Detection rate against injected bias on bigram tables (module docstring), at this run's
    sample count and at eight times it, beside the detectable TV each audit states."""
    from specbound.audit.tables import TableReference, bigram_pair, laws, prompts, shifted_sampler

    target, _ = bigram_pair()
    target_laws = laws(target, Processing(args.temperature))
    moved_mass = 1 - target_laws.max(axis=1)  # the bias moves bias × (1 − p_max) of a row onto its top token
    records = []
    for samples in (args.samples, 8 * args.samples):
        for bias in BIASES:
            started = time.perf_counter()
            results = [audit(shifted_sampler(target_laws, bias), TableReference(target), prompts(args.limit),
                             temperature=args.temperature, max_new_tokens=args.max_new_tokens, samples=samples,
                             seed=repeat) for repeat in range(args.repeats)]
            records.append({"samples": samples, "bias": bias,
                            "tv_per_position_mean_over_rows": float(bias * moved_mass.mean()),
                            "detection_rate": sum(not result.passed for result in results) / args.repeats,
                            "detectable_tv": results[0].detectable_tv, "repeats": args.repeats,
                            "seconds_per_audit": (time.perf_counter() - started) / args.repeats})
            print(json.dumps(records[-1]), file=sys.stderr)
    return records


def run_optimum(args, models) -> list[dict]:
    """Decoding seconds with the exact acceptance and α* computed at every verified position,
    at the default budget and at none (the same tokens every way), interleaved: per prompt
    each budget in turn, the order rotating, ``--repeats`` rounds (at most 3)."""
    import math

    from specbound.api import Speculator
    from specbound.engine.optimum import BUDGET, OptimumRecorder

    pair = models.pair("llama.cpp")
    speculator = Speculator(pair=pair, progress=False)
    prompts = models.prompts(pair)
    budgets = (("none", 0.0), ("every position", math.inf), ("default budget", BUDGET))
    records = []
    for name, options in (METHODS[0], METHODS[2]):
        decoder, method = speculator.decoder_for(Sampling(args.temperature), name, options)
        seconds = {label: {"seconds": 0.0, "computed": 0, "positions": 0} for label, _ in budgets}
        turn = 0
        for _ in range(min(args.repeats, 3)):
            for index, prompt in enumerate(prompts):
                turn += 1
                for label, budget in budgets[turn % 3:] + budgets[: turn % 3]:
                    decoder.optimum = OptimumRecorder(budget)
                    started = time.perf_counter()
                    generation = decoder.generate(prompt, method, args.max_new_tokens,
                                                  torch.Generator().manual_seed(index))
                    seconds[label]["seconds"] += time.perf_counter() - started
                    seconds[label]["computed"] += len(generation.stats.optimum.acceptances)
                    seconds[label]["positions"] += generation.stats.optimum.positions
        records.append({"method": method.name, **seconds,
                        "cost_every_position": seconds["every position"]["seconds"] / seconds["none"]["seconds"] - 1,
                        "cost_default_budget": seconds["default budget"]["seconds"] / seconds["none"]["seconds"] - 1})
        print(json.dumps(records[-1]), file=sys.stderr)
    return records


RUNNERS = {"ours": run_ours, "llama-cpp-python": run_llama_cpp_python, "transformers": run_transformers,
           "power": run_power, "optimum": run_optimum}

if __name__ == "__main__":
    sys.exit(main())
