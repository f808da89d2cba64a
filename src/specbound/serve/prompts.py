"""A request's prompt as the token ids the target is given.

- ``/v1/completions``: the text as it is (no chat template, as OpenAI's completions take
  it) or token ids;
- ``/v1/chat/completions``: one user message is what ``ModelPair.encode`` makes of a prompt
  (what ``specbound generate`` decodes); any other conversation goes through the target
  tokenizer's chat template, with the assistant's header after it. The tokenizer is the one
  a pair built by ``models.pair`` carries in its ``encode`` (``encode_prompt`` bound to it); a
  pair without a chat template takes one user message only.
"""

from __future__ import annotations

import functools

from specbound.models.chat import encode_prompt
from specbound.serve.schemas import ChatCompletionRequest, CompletionRequest, RequestError


class PromptEncoder:
    """Requests → prompt token ids for one ``ModelPair`` (module docstring)."""

    def __init__(self, pair):
        self.pair = pair
        encode = pair.encode
        bound = isinstance(encode, functools.partial) and encode.func is encode_prompt and encode.args
        tokenizer = encode.args[0] if bound else None
        self.template_tokenizer = tokenizer if getattr(tokenizer, "chat_template", None) else None

    def completion(self, request: CompletionRequest) -> list[int]:
        prompt = request.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            if self.pair.tokenize is None:
                raise RequestError(400, "This model takes prompts as token ids only.", "prompt")
            ids = list(self.pair.tokenize(prompt)) if prompt else []
        else:
            ids = list(prompt)
        if not ids:
            raise RequestError(400, "The prompt must hold at least one token.", "prompt")
        if min(ids) < 0 or max(ids) >= self.pair.vocab_size:
            raise RequestError(400, f"Token ids must lie in [0, {self.pair.vocab_size}).", "prompt")
        return ids

    def chat(self, request: ChatCompletionRequest) -> list[int]:
        messages = request.messages
        if len(messages) == 1 and messages[0].role == "user":
            if not messages[0].text:
                raise RequestError(400, "The message must not be empty.", "messages[0].content")
            return list(self.pair.encode(messages[0].text))
        if self.template_tokenizer is None:
            raise RequestError(400, "This model has no chat template: send one user message.", "messages")
        tokenizer = self.template_tokenizer
        roles = {"developer": "system"}  # OpenAI's newer name for the system turn; templates know "system"
        rendered = tokenizer.apply_chat_template([{"role": roles.get(message.role, message.role), "content": message.text}
                                                  for message in messages], tokenize=False,
                                                 add_generation_prompt=True)
        return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])
