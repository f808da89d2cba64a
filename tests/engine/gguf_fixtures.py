"""Tiny GGUF models written by the test suite, for the llama.cpp backend.

``write_gguf(model, path)`` writes a tiny transformers Qwen2 model (``engine_fixtures``) as a
float32 GGUF file of llama.cpp's ``qwen2`` architecture with the ``gguf`` package: the same
weights, no tokenizer ("none", a vocabulary of dummy tokens: the tests work with ids), so
llama.cpp runs the very model the torch tests run, at its own kernels' rounding.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_gguf(model, path: Path) -> Path:
    import gguf

    config = model.config
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(float(getattr(config, "rope_theta", None) or config.rope_parameters["rope_theta"]))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("none")
    writer.add_vocab_size(config.vocab_size)
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    per_layer = {
        "input_layernorm.weight": "attn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
        "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
        "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
        "self_attn.o_proj.weight": "attn_output.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
    }
    for layer in range(config.num_hidden_layers):
        for name, gguf_name in per_layer.items():
            names[f"model.layers.{layer}.{name}"] = f"blk.{layer}.{gguf_name}"
    for name, tensor in model.state_dict().items():
        if name in names:
            writer.add_tensor(names[name], tensor.detach().float().numpy().astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
