"""A model's context length read before it loads (``models.context``): from a GGUF file's
header, a Hugging Face folder's config, None where neither says."""

import json

import numpy as np
import pytest

from specbound.models.context import check_fits_context, gguf_context, known_context


def header_only_gguf(path, keys_before=True, context=4096):
    """A GGUF file of the keys a header holds (strings, arrays of strings and numbers before
    the context length when ``keys_before``) and one tensor."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "qwen2")
    if keys_before:
        writer.add_name("tiny")
        writer.add_token_list([f"token{i}" for i in range(300)])
        writer.add_array("tokenizer.ggml.scores", [0.5] * 300)
        writer.add_layer_norm_rms_eps(1e-6)
    writer.add_context_length(context)
    writer.add_tensor("output.weight", np.zeros((2, 2), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("keys_before", [True, False])
def test_a_gguf_header_gives_its_context_length(tmp_path, keys_before):
    path = header_only_gguf(tmp_path / "model.gguf", keys_before, context=4096)
    assert gguf_context(path) == 4096
    assert known_context(path) == 4096


def test_a_hugging_face_folder_gives_its_text_model_s_context(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"max_position_embeddings": 2048}}))
    assert known_context(tmp_path) == 2048


@pytest.mark.parametrize("content", [b"not a model", b"GGUF\x01\x00\x00\x00" + bytes(16), b"GGUF"])
def test_what_cannot_be_read_without_loading_gives_none(tmp_path, content):
    (tmp_path / "model.gguf").write_bytes(content)
    assert known_context(tmp_path / "model.gguf") is None
    assert known_context(tmp_path / "missing.gguf") is None
    assert known_context(tmp_path) is None  # a folder without config.json


def test_an_embedded_model_not_yet_on_disk_gives_none(tmp_path):
    assert known_context("default-target", cache_dir=tmp_path) is None


def test_new_tokens_that_fit_after_no_prompt_are_refused_naming_max_new_tokens(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 64}))
    check_fits_context(63, [tmp_path, tmp_path / "unknown"])  # a one-token prompt fits
    with pytest.raises(ValueError, match=r"^max_new_tokens: 64 new tokens .* at most 63 .*\(--max-new-tokens\)$"):
        check_fits_context(64, [tmp_path, tmp_path / "unknown"], " (--max-new-tokens)")
    check_fits_context(10**6, [tmp_path / "unknown"])  # nothing known: left to the check after loading
