"""Prompt text → token ids for an instruction model, and the ids that end a sequence.

Prompt sets hold plain text (``specbound.datasets``); an instruction-tuned model expects
its chat template, so a prompt becomes one user turn followed by the assistant header.
A tokenizer without a chat template gets the text as it is.
"""

from __future__ import annotations

from specbound.checks import unicode_text


def encode_prompt(tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` as a user turn awaiting the assistant's answer."""
    if not unicode_text("text", text):
        raise ValueError("text: expected a non-empty prompt string")
    if getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        return tokenizer(rendered, add_special_tokens=False)["input_ids"]
    return tokenizer(text)["input_ids"]


def stop_token_ids(tokenizer, model) -> set[int]:
    """The tokenizer's EOS and every EOS id in the model's generation config."""
    ids = set()
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (tokenizer.eos_token_id, configured):
        if isinstance(value, int):
            ids.add(value)
        elif value is not None:
            ids.update(int(token) for token in value)
    return ids
