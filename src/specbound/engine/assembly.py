"""A pair's decoder and schedule, built in one place.

``assemble(pair, processing, method)`` makes what decodes a ``ModelPair``: the target's
language model (its backend's, with a float32 prefill twin where that pays), a drafter — the
draft model's (``ModelDrafter``), prompt lookup's (``PromptLookupDrafter``), both behind one
``DrafterChoice`` under a planner, or none — and the schedule the decoder runs:

- a fixed ``Method`` (built by ``methods.build_method``): its own schedule, drafting with
  ``drafter`` when it drafts;
- ``"auto"``: a ``Planner`` over this machine's measured forward costs (``cost_book.CostBook``,
  kept in ``<cache>/costs.json``) and the acceptance it sees, choosing the method step by
  step among candidates that draft with the draft model (when the pair has one) or by prompt
  lookup, whose drafts cost no forward. The draft runs each forward at the precision of
  ``draft_precisions`` its backend runs (``Backend.precisions``: on torch on the CPU, its
  int8/int4 copies, kept in the cache) measured fastest for its rows.

What a caller wants of the decoder is given here, not set on it afterwards: the budget of
its ``OptimumRecorder`` (``engine.optimum``; 0, the default, records nothing; with a budget
the recorder warms up every verifier the schedule may run, so their first computation —
compiling their loops — happens before decoding), and the progress of its language models'
chunked prefills (``prefill_progress``: a function of the model's role, "target" or "draft",
giving what the model reports its chunks to, or None).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from specbound.engine.cost_book import CostBook
from specbound.engine.decode import Decoder
from specbound.engine.drafters import DrafterChoice, ModelDrafter, PromptLookupDrafter
from specbound.engine.methods import Budget, Method, Schedule
from specbound.engine.optimum import OptimumRecorder
from specbound.engine.pair import ModelPair
from specbound.engine.planner import Planner, default_candidates
from specbound.engine.precisions import AS_LOADED, PRECISIONS, precision_name
from specbound.engine.processing import Processing
from specbound.engine.suffix import SuffixDrafter, SuffixHistory
from specbound.engine.vocabulary import CrossTokenizerDrafter, RestrictedProcessing
from specbound.paths import default_cache_dir

DRAFTERS = ("model", "prompt-lookup", "suffix")


class Assembly(NamedTuple):
    decoder: Decoder
    schedule: Schedule  # what to pass to decoder.generate: the Method, or the Planner under "auto"


def assemble(pair: ModelPair, processing: Processing, method: Method | str = "auto", drafter: str = "model",
             draft_precisions=PRECISIONS, cache_dir=None, stop_at_eos: bool = True, candidates=None,
             optimum_budget: float = 0.0, prefill_progress=None,
             suffix_history: SuffixHistory | None = None) -> Assembly:
    """The decoder of ``pair`` with ``processing`` and its schedule (module docstring):
    ``method`` a built ``Method`` (drafting with ``drafter``, "model" or "prompt-lookup",
    when it drafts) or "auto" (a planner over ``candidates``, default
    ``planner.default_candidates(lookup=True)``; costs and quantised copies kept under
    ``cache_dir``). ``stop_at_eos``: end a sequence at the pair's EOS tokens;
    ``optimum_budget``, ``prefill_progress``: what the decoder records and reports (module
    docstring). With ``drafter="suffix"`` (suffix decoding, ``engine.suffix``; under "auto" a
    candidate beside the others) the drafts come from ``suffix_history`` (default a new
    one), which every finished sequence's output joins.
    """
    eos = pair.eos_token_ids if stop_at_eos else ()
    if drafter not in DRAFTERS:
        raise ValueError(f"drafter: expected one of {list(DRAFTERS)}, got {drafter!r}")
    suffix = SuffixDrafter(pair.vocab_size, suffix_history, device=pair.device) if drafter == "suffix" else None
    if method == "auto":
        decoder, planner = _auto(pair, processing, draft_precisions, cache_dir, eos, candidates, suffix,
                                 optimum_budget)
        return Assembly(_reporting_prefill(decoder, prefill_progress), planner)
    if not isinstance(method, Method):
        raise TypeError(f"method: expected a Method or 'auto', got {type(method).__name__}")
    target = pair.backend.language_model(pair.target, pair.target_twin)
    decoder = Decoder(target, (suffix or _drafter(pair, processing, drafter)) if method.depth else None, processing,
                      eos, optimum=_recorder(optimum_budget, [method]))
    return Assembly(_reporting_prefill(decoder, prefill_progress), method)


def _recorder(optimum_budget: float, methods: list[Method]) -> OptimumRecorder:
    """The decoder's optimum recorder with ``optimum_budget``, warmed up for every per-node
    verifier of ``methods`` (module docstring)."""
    recorder = OptimumRecorder(optimum_budget)
    recorder.warm_up(node for method in methods for node in _verified_nodes(method))
    return recorder


def _reporting_prefill(decoder: Decoder, prefill_progress) -> Decoder:
    """``decoder`` as it leaves ``assemble``: its language models reporting their prefill
    chunks to ``prefill_progress(role)`` (module docstring)."""
    drafts = decoder.drafter.language_models if decoder.drafter is not None else []
    for role, lm in [("target", decoder.target)] + [("draft", lm) for lm in drafts]:
        lm.prefill_progress = prefill_progress(role) if prefill_progress is not None else None
    return decoder


def _verified_nodes(method: Method):
    """(verifier, number of drafts) of every node ``method`` may verify token by token."""
    if method.tree_verifier is not None:
        return
    for depth in range(method.depth):
        counts = (range(1, method.shape.max_children + 1) if isinstance(method.shape, Budget)
                  else [method.shape.branching[depth]])
        for num_drafts in counts:
            yield method.verifier_at(depth, num_drafts), num_drafts


def _drafter(pair: ModelPair, processing: Processing, drafter: str):
    if drafter == "prompt-lookup":
        return PromptLookupDrafter(pair.vocab_size, device=pair.device)
    if pair.draft is None:
        raise ValueError("drafter: this pair was loaded without a draft model")
    return _model_drafter(pair, pair.backend.language_model(pair.draft, pair.draft_twin), processing)


def _model_drafter(pair: ModelPair, draft, processing: Processing, variant_for_rows=None):
    """The draft model's drafter: a ``ModelDrafter``, restricted to the shared vocabulary
    (``engine.vocabulary``) where the draft's tokenizer is not the target's."""
    if pair.vocabulary is None:
        return ModelDrafter(draft, processing, variant_for_rows)
    restricted = RestrictedProcessing(processing, pair.vocabulary)
    return CrossTokenizerDrafter(ModelDrafter(draft, restricted, variant_for_rows), pair.vocabulary)


def _auto(pair: ModelPair, processing: Processing, draft_precisions, cache_dir, eos,
          candidates, suffix: SuffixDrafter | None, optimum_budget: float) -> tuple[Decoder, Planner]:
    backend, device = pair.backend, pair.device
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    book = CostBook(cache / "costs.json")
    target_costs = book.costs(pair.target, backend.cost_precision(pair.target), device)
    draft_costs, variants = {}, {}
    if pair.draft is not None:
        named = {precision_name(precision, "draft_precisions") for precision in draft_precisions}
        chosen = named & set(backend.precisions(device)) or {AS_LOADED}
        variants = {precision: backend.at_precision(pair.draft, precision, cache)
                    for precision in PRECISIONS if precision in chosen - {AS_LOADED}}
        models = {AS_LOADED: pair.draft} | variants
        draft_costs = {precision: book.costs(model, backend.cost_precision(model), device)
                       for precision, model in models.items() if precision in chosen}
    if candidates is None:
        candidates = default_candidates(lookup=True, suffix=suffix is not None)
    planner = Planner(target_costs, draft_costs, candidates)
    target = backend.language_model(pair.target, pair.target_twin)
    batch_heads = target_costs(16) <= 2 * target_costs(1)  # rows nearly free: one head call per step
    drafters = {"lookup": PromptLookupDrafter(pair.vocab_size, device=device)} | ({"suffix": suffix} if suffix else {})
    if pair.draft is not None:
        draft = backend.language_model(pair.draft, pair.draft_twin, variants)
        drafters["model"] = _model_drafter(pair, draft, processing, planner.variant_for_rows)
    optimum = _recorder(optimum_budget, [candidate.build() for candidate in planner.candidates])
    return Decoder(target, DrafterChoice(drafters), processing, eos, batch_heads, optimum), planner
