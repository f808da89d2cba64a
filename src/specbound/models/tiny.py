"""Tiny random-weight model pairs, for the test suite and the benchmarks' ``--tiny`` runs.

A vocabulary of 6 tokens (token 0 is EOS), 2 layers, hidden size 16, fixed seeds. The output
head is scaled so that next-token laws are far from uniform, and the draft is a noisy copy of
the target so that acceptance is neither 0 nor 1 (about 0.7 per token on a chain). The same
weights can be written as a float32 GGUF file (``write_gguf``), so both backends run them.
Prompts are short strings mapped to token ids 1..5 (``encode``); ``tiny_chat_pair`` has a
word-level tokenizer of 12 words and a chat template instead, for serving.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from specbound.datasets import Prompt
from specbound.models.chat import encode_prompt
from specbound.models.pair import ModelPair

VOCAB = 6
EOS = 0
WORDS = ["</s>", "<unk>", "user", "assistant", "system", "red", "green", "blue", "cat", "dog", "runs", "sleeps"]
CHAT_TEMPLATE = ("{% for message in messages %}{{ message['role'] }} {{ message['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}assistant{% endif %}")
CHAT_CONTEXT = 256  # positions the served models take (rotary embeddings: any length)
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


def tiny_config(architecture="qwen2", vocab_size=VOCAB, attention="sdpa", num_layers=2):
    config_class = {"qwen2": Qwen2Config, "llama": LlamaConfig}[architecture]
    config = config_class(vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=num_layers,
                          num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                          tie_word_embeddings=False)
    config._attn_implementation = attention
    return config


def tiny_model(seed, architecture="qwen2", vocab_size=VOCAB, attention="sdpa", num_layers=2, head_scale=8.0):
    """A random-weight causal LM of ``tiny_config``, its output head scaled by ``head_scale``."""
    torch.manual_seed(seed)
    model_class = {"qwen2": Qwen2ForCausalLM, "llama": LlamaForCausalLM}[architecture]
    model = model_class(tiny_config(architecture, vocab_size, attention, num_layers)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(head_scale)
    return model


def noisy_copy(model, seed: int, noise: float):
    """A draft model: the target's weights plus Gaussian noise of relative size ``noise``."""
    generator = torch.Generator().manual_seed(seed)
    draft = copy.deepcopy(model)
    with torch.no_grad():
        for parameter in draft.parameters():
            scale = parameter.abs().mean()
            parameter.add_(noise * scale * torch.randn(parameter.shape, generator=generator))
    return draft


def encode(text: str) -> list[int]:
    return [1 + ord(character) % (VOCAB - 1) for character in text]


@functools.cache
def tiny_pair() -> ModelPair:
    """The target ``tiny_model(seed=0)`` and its noisy copy (seed 1, noise 0.5) as a pair."""
    target = tiny_model(seed=0)
    draft = noisy_copy(target, seed=1, noise=0.5)
    return ModelPair(
        target=target, draft=draft, vocab_size=VOCAB, eos_token_ids=(EOS,), encode=encode,
        description={"target": "tiny-qwen2 (seed 0)", "draft": "noisy copy (seed 1, noise 0.5)",
                     "dtype": "float32", "vocab_size": VOCAB, "prompt_format": "character codes"},
    )


def tiny_prompts(count: int, dataset: str = "toy") -> list[Prompt]:
    texts = ["ab", "cab", "bcd", "dab", "ace", "ebb", "cde", "bad", "dec", "aaa", "eca", "dbe"]
    return [Prompt(f"{dataset}/{index}", texts[index % len(texts)] * (1 + index // len(texts)), dataset)
            for index in range(count)]


def tiny_tokenizer():
    """A ``transformers`` tokenizer over ``WORDS`` (whitespace-separated, ``</s>`` the EOS) with
    ``CHAT_TEMPLATE``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({word: index for index, word in enumerate(WORDS)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>", unk_token="<unk>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_chat_pair(eos_token_ids=(EOS,)) -> ModelPair:
    """A tiny pair over ``WORDS`` with its tokenizer and chat template, wrapped as
    ``models.pair.load_pair`` wraps a loaded pair, so a server runs its real path
    (``specbound serve --pair-factory specbound.models.tiny:tiny_chat_pair``)."""
    tokenizer = tiny_tokenizer()
    target = tiny_model(seed=0, vocab_size=len(WORDS), head_scale=4.0)
    draft = noisy_copy(target, seed=1, noise=0.5)
    for model in (target, draft):
        model.config.max_position_embeddings = CHAT_CONTEXT
    return ModelPair(target, draft, len(WORDS), tuple(eos_token_ids), functools.partial(encode_prompt, tokenizer),
                     decode=tokenizer.decode, tokenize=lambda text: tokenizer(text)["input_ids"],
                     description={"target": "tiny-test-pair"})


def write_gguf(model, path: Path, tokenizer=None) -> Path:
    """Write a tiny transformers Qwen2 model as a float32 GGUF file of llama.cpp's ``qwen2``
    architecture (the same weights under llama.cpp's tensor names). Without ``tokenizer`` the
    file has none (a vocabulary of dummy tokens: ids only); ``tokenizer(writer)`` writes one."""
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
