"""The backends' one home (``engine.backends``): a registry of Backend objects that say what
differs between torch and llama.cpp, one copy of the language models' input checks, a pair
that is plain data, one factory for decoder and schedule, and a registry light enough for
the command line."""

import copy
import subprocess
import sys
import typing

import pytest
import torch

from support.models import EOS, VOCAB
from specbound.engine import Processing, Sampling, build_method
from specbound.engine.assembly import assemble
from specbound.engine.backends import BACKENDS, CHOICES, Backend, BaseLM, backend_of, get_backend
from specbound.engine.backends.torch import CausalLM
from specbound.engine.pair import ModelPair
from specbound.engine.planner import Planner


def test_every_backend_is_registered_under_its_own_name():
    assert CHOICES == ("auto", *BACKENDS)
    for name in BACKENDS:
        assert get_backend(name).name == name
    with pytest.raises(ValueError, match="^backend: expected one of llama.cpp, torch, got 'vllm'"):
        get_backend("vllm")


def test_a_loaded_model_names_its_backend(target_model):
    assert backend_of(target_model) is get_backend("torch")
    with pytest.raises(ValueError, match="^model: no backend holds a str"):
        backend_of("default-target")


def test_the_input_checks_live_once_in_the_base_class():
    from specbound.engine.backends.llamacpp import LlamaCppLM

    for lm_class in (CausalLM, LlamaCppLM):
        assert issubclass(lm_class, BaseLM)
        for check in ("checked_tokens", "check_entries", "check_paths", "check_nothing_pending"):
            assert getattr(lm_class, check) is getattr(BaseLM, check)
        assert not hasattr(lm_class, "_checked_tokens")


def tiny_pair(target_model, draft_model, **fields) -> ModelPair:
    return ModelPair(target_model, draft_model, VOCAB, (EOS,), encode=list, **fields)


def test_a_pair_is_plain_data_whatever_its_backend(target_model, draft_model):
    hints = typing.get_type_hints(ModelPair)
    assert hints["target"] is object and hints["draft"] == (object | None)
    for gone in ("decoder", "auto_decoder", "language_model", "prefill_twin", "cost_precision"):
        assert not hasattr(ModelPair, gone)
    pair = tiny_pair(target_model, draft_model, backend="torch")  # a name is taken for its backend
    assert pair.backend is get_backend("torch") and pair.device == torch.device("cpu")
    assert pair.max_positions == 64


def test_one_factory_builds_the_decoder_and_its_schedule(target_model, draft_model, tmp_path):
    pair = tiny_pair(target_model, draft_model)
    processing = Processing.of(Sampling(0.5, top_k=3), VOCAB)
    chain = build_method("chain", gamma=2)
    decoder, schedule = assemble(pair, processing, chain)
    assert schedule is chain and not schedule.adaptive and decoder.processing == processing
    assert decoder.drafter.lm.model is draft_model and decoder.target.model is target_model
    plain = assemble(pair, processing, build_method("autoregressive")).decoder
    assert plain.drafter is None
    lookup = assemble(pair, processing, chain, drafter="prompt-lookup").decoder
    assert not lookup.drafter.language_models
    decoder, planner = assemble(pair, processing, "auto", draft_precisions=("as-loaded",), cache_dir=tmp_path)
    assert isinstance(planner, Planner) and planner.adaptive and set(decoder.drafter.drafters) == {"lookup", "model"}
    generation = decoder.generate([1, 2, 3], planner, 6, torch.Generator().manual_seed(0))
    assert 1 <= len(generation.tokens) <= 6 and planner.history
    with pytest.raises(ValueError, match="^drafter: "):
        assemble(pair, processing, chain, drafter="lookup")
    with pytest.raises(TypeError, match="^method: "):
        assemble(pair, processing, "chain")


def test_the_registry_and_the_precision_names_load_without_torch():
    code = ("import sys, specbound.engine.backends, specbound.engine.precisions, specbound.models.backends; "
            "print('torch' in sys.modules)")
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert shown.strip() == "False"


def test_a_backend_scores_a_sequence_in_one_plain_forward_and_leaves_the_model_as_it_was(target_model):
    """``sequence_logits``: the last positions' logits of one forward over the sequence; with a
    wider ``dtype`` the model computes in it (cast there and back, or its twin) and its logits
    are rounded to the model's own dtype."""
    backend, tokens = get_backend("torch"), [1, 2, 3, 4, 5]
    with torch.no_grad():
        expected = target_model(input_ids=torch.tensor([tokens])).logits[0, -2:]
    torch.testing.assert_close(backend.sequence_logits(target_model, tokens, 2), expected)
    bf16 = copy.deepcopy(target_model).to(torch.bfloat16)
    in_float32 = backend.sequence_logits(bf16, tokens, 2, dtype=torch.float32)
    assert next(bf16.parameters()).dtype == torch.bfloat16 and in_float32.dtype == torch.float32
    twin = backend.float32_twin(bf16)
    with torch.no_grad():
        rounded = twin(input_ids=torch.tensor([tokens]), logits_to_keep=2).logits[0].to(torch.bfloat16).float()
    torch.testing.assert_close(in_float32, rounded, rtol=0, atol=0)
    torch.testing.assert_close(backend.sequence_logits(bf16, tokens, 2, dtype=torch.float32, twin=twin), rounded,
                               rtol=0, atol=0)
    assert backend.logits_size(target_model) == VOCAB


def test_a_backend_without_twins_refuses_one_naming_float32_twins():
    pytest.importorskip("llama_cpp")
    with pytest.raises(ValueError, match="^float32_twins: the llama.cpp backend keeps no float32 twins"):
        get_backend("llama.cpp").float32_twin(object())


class Wrapped:
    """A model no registered backend holds: a torch module behind another class."""

    def __init__(self, module):
        self.module = module


class ThirdBackend(Backend):
    """A backend defined outside ``engine/backends``: the torch kernels behind ``Wrapped``."""

    name = "third"
    rounding = get_backend("torch").rounding

    def holds(self, model) -> bool:
        return isinstance(model, Wrapped)

    def load(self, source, files, dtype, threads=None, tokenizer=True) -> tuple:
        return Wrapped(files[source]), Tokenizer() if tokenizer else None

    def logits_size(self, model) -> int:
        return VOCAB

    def language_model(self, model, twin=None, variants=None):
        return CausalLM(model.module)

    def sequence_logits(self, model, token_ids, last, dtype=None, twin=None):
        return get_backend("torch").sequence_logits(model.module, token_ids, last, dtype)

    def cost_key(self, model, precision, device) -> str:
        return f"third | {id(model.module)} | {precision}"


class Tokenizer:
    chat_template = None
    eos_token_id = EOS

    def get_vocab(self) -> dict[str, int]:
        return {str(token): token for token in range(VOCAB)}

    def __call__(self, text, **options) -> dict:
        return {"input_ids": [int(character) for character in text]}

    def decode(self, tokens, **options) -> str:
        return "".join(map(str, tokens))


def test_a_third_backend_is_asked_what_the_layers_above_need(target_model, draft_model, monkeypatch):
    """Registered by name only, a third backend loads a pair, scores sequences for the
    studies, is a reference for the auditor and keys the cost book: nothing outside the
    backends asks which backend it holds."""
    import types

    import specbound.engine.backends as backends
    from specbound.audit.reference import as_reference
    from specbound.engine.cost_book import cost_key
    from specbound.models.pair import load_pair
    from specbound.studies.multistep import FullForwards
    from specbound.studies.traces import next_token_probs

    third = ThirdBackend()
    monkeypatch.setitem(sys.modules, "third_backend", types.SimpleNamespace(BACKEND=third))
    monkeypatch.setitem(backends._MODULES, "third", "third_backend")
    monkeypatch.setattr(backends, "BACKENDS", (*backends.BACKENDS, "third"))
    monkeypatch.setattr("specbound.models.pair.ModelFiles", lambda progress: {"t": target_model, "d": draft_model})

    pair = load_pair("t", "d", torch.float32, progress=False, backend="third")
    assert pair.backend is third and backend_of(pair.target) is third and pair.target.module is target_model
    assert (pair.vocab_size, pair.eos_token_ids, pair.encode("123")) == (VOCAB, (EOS,), [1, 2, 3])
    processing = Processing(temperature=0.7)
    rows = next_token_probs(pair.target, [1, 2, 3], [4, 5], processing)
    torch_rows = next_token_probs(target_model, [1, 2, 3], [4, 5], processing)
    assert rows.shape == (2, VOCAB) and abs(rows - torch_rows).max() == 0
    full_rows = [FullForwards(model, processing)((1, 2, 3)) for model in (pair.target, target_model)]
    assert abs(full_rows[0] - full_rows[1]).max() == 0
    reference = as_reference(pair.target)
    assert reference.backend is third and reference.language_model.model is target_model
    assert cost_key(pair.target, "as-loaded").startswith("third | ")
