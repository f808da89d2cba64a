"""Tiny GGUF models written by the test suite (llama.cpp's backend, and the GGUF loaders).

``write_gguf(model, path)`` writes a tiny transformers Qwen2 model (``engine_fixtures``) as a
float32 GGUF file of llama.cpp's ``qwen2`` architecture with the ``gguf`` package: the same
weights, under llama.cpp's tensor names. Without ``tokenizer`` the file has none ("none", a
vocabulary of dummy tokens: the engine tests work with ids); ``tokenizer(writer)`` writes one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

LAYER_TENSORS = {  # transformers' name in a decoder layer -> llama.cpp's
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def write_gguf(model, path: Path, tokenizer=None) -> Path:
    import gguf

    config = model.config
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_name("tiny-qwen2")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(float(getattr(config, "rope_theta", None) or config.rope_parameters["rope_theta"]))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    if tokenizer is None:
        writer.add_tokenizer_model("none")
        writer.add_vocab_size(config.vocab_size)
    else:
        tokenizer(writer)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    for layer in range(config.num_hidden_layers):
        for name, gguf_name in LAYER_TENSORS.items():
            names[f"model.layers.{layer}.{name}"] = f"blk.{layer}.{gguf_name}"
    state = model.state_dict()
    for name, gguf_name in names.items():
        writer.add_tensor(gguf_name, state[name].detach().float().numpy().astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
