"""OpenAI's response objects for one request, and the server-sent events of a stream.

A stream is ``data: {chunk}`` events, each ended by a blank line, then ``data: [DONE]``;
every stream ends that way, also one its request could not finish (a failed step, the
drain's time up): its last event is then OpenAI's error object. The chunk that ends a
stream carries ``finish_reason`` and the request's ``usage`` and ``specbound`` figures, or
with ``stream_options.include_usage`` the figures come on a chunk of their own with no
choices, as OpenAI sends them.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator

from specbound.serve.batching import Event, Failed, Finished, Text
from specbound.serve.schemas import error_body

DONE = "data: [DONE]\n\n"


def sse(payload: dict) -> str:
    """One server-sent event carrying ``payload`` as compact JSON."""
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


def failure_body(failed: Failed) -> dict:
    return error_body(failed.message, "server_error" if failed.status >= 500 else "invalid_request_error")


class Reply:
    """OpenAI's response objects for one request (``chat``: chat completions, else completions)."""

    def __init__(self, model: str, chat: bool):
        self.model, self.chat = model, chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def chunk(self, delta, finish_reason: str | None = None) -> dict:
        """A streamed chunk: ``delta`` a chat delta or a completion's text; None: no choice
        (the usage chunk)."""
        head = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model}
        if delta is None:
            return head | {"choices": []}
        choice = {"index": 0, "delta": delta} if self.chat else {"index": 0, "text": delta}
        return head | {"choices": [choice | {"logprobs": None, "finish_reason": finish_reason}]}

    def whole(self, text: str, finished: Finished) -> dict:
        """The response of a request that did not stream."""
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}} if self.chat
                  else {"index": 0, "text": text})
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model,
                "choices": [choice | {"logprobs": None, "finish_reason": finished.finish_reason}],
                **_figures(finished)}

    async def events(self, next_event, include_usage: bool) -> AsyncIterator[str]:
        """The stream's events, from ``next_event()`` (awaited: the request's next ``Event``)
        until it ends; then ``[DONE]``."""
        if self.chat:
            yield sse(self.chunk({"role": "assistant", "content": ""}))
        while True:
            event: Event = await next_event()
            if isinstance(event, Text):
                yield sse(self.chunk({"content": event.text} if self.chat else event.text))
                continue
            if isinstance(event, Finished):
                last = self.chunk({} if self.chat else "", event.finish_reason)
                if include_usage:
                    yield sse(last)
                    yield sse(self.chunk(None) | _figures(event))
                else:
                    yield sse(last | _figures(event))
            else:
                yield sse(failure_body(event))
            yield DONE
            return


def _figures(finished: Finished) -> dict:
    return {"usage": finished.usage, "specbound": finished.specbound}
