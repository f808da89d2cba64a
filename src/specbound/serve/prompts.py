"""A request's prompt as the token ids the target is given.

- ``/v1/completions``: the text as it is (no chat template, as OpenAI's completions take
  it) or token ids;
- ``/v1/chat/completions``: one user message is what ``ModelPair.encode`` makes of a prompt
  (what ``specbound generate`` decodes); any other conversation goes through the target
  tokenizer's chat template (``models.chat.encode_chat``), with the assistant's header after
  it. Either way a content is tokenised as text: special tokens come from the template only.
  The tokenizer is the one a pair built by ``models.pair`` carries in its ``encode``
  (``encode_prompt`` bound to it); a pair without a chat template takes one user message only.

**A prompt's length is bounded before it is tokenised whole.** A prompt leaves room for one
new token in the target's ``context``: at most ``context - 1`` tokens (the cap). A text longer than
``PREFIX_CHARACTERS_PER_TOKEN`` characters per allowed token is first tokenised by its
prefix of that many characters: a prefix with more than the cap plus
``PREFIX_SLACK`` tokens is refused at once, the rest of the text never tokenised (a prefix's
tokens are the whole text's up to its last, cut, word: the slack covers that word). So a
refusal costs at most the tokenisation of that prefix, whatever the text's size. These are
CPU-bound calls: the server makes them on a worker thread, off its event loop.
"""

from __future__ import annotations

import functools

from specbound.models.chat import encode_chat, encode_prompt
from specbound.serve.schemas import ChatCompletionRequest, CompletionRequest, RequestError

PREFIX_CHARACTERS_PER_TOKEN = 16
PREFIX_SLACK = 64


class PromptEncoder:
    """Requests → prompt token ids for one ``ModelPair`` (module docstring); ``context``:
    the target's positions (None: unknown, prompts uncapped)."""

    def __init__(self, pair, context: int | None = None):
        self.pair = pair
        self.context = context
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
            self._check_prefix(prompt, "prompt")
            ids = list(self.pair.tokenize(prompt)) if prompt else []
        else:
            ids = list(prompt)
        if not ids:
            raise RequestError(400, "The prompt must hold at least one token.", "prompt")
        if min(ids) < 0 or max(ids) >= self.pair.vocab_size:
            raise RequestError(400, f"Token ids must lie in [0, {self.pair.vocab_size}).", "prompt")
        return self._checked_length(ids, "prompt")

    def chat(self, request: ChatCompletionRequest) -> list[int]:
        messages = request.messages
        if self.pair.tokenize is not None:
            self._check_prefix("\n".join(message.text for message in messages), "messages")
        if len(messages) == 1 and messages[0].role == "user":
            if not messages[0].text:
                raise RequestError(400, "The message must not be empty.", "messages[0].content")
            return self._checked_length(list(self.pair.encode(messages[0].text)), "messages")
        if self.template_tokenizer is None:
            raise RequestError(400, "This model has no chat template: send one user message.", "messages")
        roles = {"developer": "system"}  # OpenAI's newer name for the system turn; templates know "system"
        try:
            ids = encode_chat(self.template_tokenizer, [{"role": roles.get(message.role, message.role),
                                                         "content": message.text} for message in messages])
        except ValueError as error:  # a content the template cannot keep apart (models.chat)
            param, _, message = str(error).partition(": ")
            raise RequestError(400, message, param) from None
        return self._checked_length(ids, "messages")

    def _check_prefix(self, text: str, field: str) -> None:
        """Refuse ``text`` whose prefix alone is over the cap (module docstring)."""
        if self.context is None or len(text) <= (self.context - 1) * PREFIX_CHARACTERS_PER_TOKEN:
            return
        cap = self.context - 1
        counted = len(self.pair.tokenize(text[: cap * PREFIX_CHARACTERS_PER_TOKEN]))
        if counted > cap + PREFIX_SLACK:
            raise RequestError(400, f"This model's maximum context length is {self.context} tokens; your "
                               f"prompt's first {cap * PREFIX_CHARACTERS_PER_TOKEN:,} characters alone are "
                               f"{counted:,}.", field, "context_length_exceeded")

    def _checked_length(self, ids: list[int], field: str) -> list[int]:
        if self.context is not None and len(ids) >= self.context:
            raise RequestError(400, f"This model's maximum context length is {self.context} tokens; your prompt has "
                               f"{len(ids)}.", field, "context_length_exceeded")
        return ids
