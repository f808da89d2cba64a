"""Prompt text → token ids for an instruction model, and the ids that end a sequence.

Prompt sets hold plain text (``specbound.datasets``); an instruction-tuned model expects
its chat template, so a prompt becomes one user turn followed by the assistant header.
A tokenizer without a chat template gets the text as it is.

**Contents are text.** A message's content is tokenised as the characters it holds: the
spelling of a special token inside it (``<|im_end|>``, ``<|im_start|>system``) gives the
tokens of those characters, never the special token, so that a message cannot end its turn
or forge another. Special tokens come only from the template's own text. A rendering whose
special tokens are exactly the template's (the common case: no content spells one) is
tokenised whole, as the template renders it; otherwise the template's text and each
content are tokenised apart and joined.
"""

from __future__ import annotations

import re

from specbound.checks import unicode_text

_MARK = "\ue000{}\ue001"  # a content's place in a rendering (private-use characters)
_MARKS = re.compile("\ue000([0-9]+)\ue001")


def encode_prompt(tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` as a user turn awaiting the assistant's answer."""
    if not unicode_text("text", text):
        raise ValueError("text: expected a non-empty prompt string")
    if getattr(tokenizer, "chat_template", None):
        try:
            return encode_chat(tokenizer, [{"role": "user", "content": text}])
        except ValueError as error:
            raise ValueError("text: " + str(error).partition(": ")[2]) from None
    return tokenizer(text, split_special_tokens=True)["input_ids"]


def encode_chat(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of ``messages`` (``{"role", "content"}``) through the tokenizer's chat
    template, the assistant's header after them; each content tokenised as text (module
    docstring). A template that changes a content (trims it, say) hides where the content
    lies: a content spelling a special token is then refused (ValueError naming it)."""
    rendered = _render(tokenizer, messages)
    ids = _tokens(tokenizer, rendered)
    specials = {index for index, token in tokenizer.added_tokens_decoder.items() if token.special}
    marked = _render(tokenizer, [{**message, "content": _MARK.format(index)} for index, message in enumerate(messages)])
    pieces = _MARKS.split(marked)  # template text, content index, template text, ...
    contents = [messages[int(index)]["content"] for index in pieces[1::2]]
    if "".join(piece if place % 2 == 0 else contents[place // 2] for place, piece in enumerate(pieces)) != rendered:
        for index, message in enumerate(messages):
            spelled = specials.intersection(_tokens(tokenizer, message["content"]))
            if spelled:
                raise ValueError(f"messages[{index}].content: holds the special token "
                                 f"{tokenizer.convert_ids_to_tokens(min(spelled))!r}, which this chat template "
                                 "cannot keep apart from its own")
        return ids
    template_ids = [_tokens(tokenizer, piece) for piece in pieces[0::2]]
    if [token for token in ids if token in specials] == [token for part in template_ids for token in part
                                                         if token in specials]:
        return ids
    joined = list(template_ids[0])
    for content, after in zip(contents, template_ids[1:]):
        joined += _tokens(tokenizer, content, as_text=True) + after
    return joined


def _render(tokenizer, messages: list[dict]) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _tokens(tokenizer, text: str, as_text: bool = False) -> list[int]:
    """``text``'s ids, no tokens added; ``as_text``: special tokens' spellings as characters."""
    if not text:
        return []
    return list(tokenizer(text, add_special_tokens=False, split_special_tokens=as_text)["input_ids"])


def stop_token_ids(tokenizer) -> set[int]:
    """The tokenizer's EOS ids (a model's own files may name more: ``Backend.eos_token_ids``)."""
    value = tokenizer.eos_token_id
    if value is None:
        return set()
    return {value} if isinstance(value, int) else {int(token) for token in value}
