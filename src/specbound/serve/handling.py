"""One request, from its bytes to its response.

A request is bounded before any work: a body over ``max_body_bytes`` is refused with 413
(by its declared length before a byte is read, else as soon as it grows past it); with an
API key, a missing or wrong bearer token answers 401 (the scheme ``Bearer`` in any case, as
RFC 6750 and RFC 9110 have it). Then it is checked whole on a worker thread, off the event
loop — JSON, fields, model, prompt (tokenised there: ``prompts``), token limit against the
context, sampling settings — and refused with OpenAI's error object naming the field (400,
404 for an unknown model). It then joins the decoding loop: when every batch slot and queue
place is taken, or the cache entries it needs do not fit beside those the others reserved
(``--max-cache-tokens``), it is refused with 429 and ``Retry-After``; while the server
drains, with 503.

A request answers as JSON, or with ``"stream": true`` as server-sent events (``sse``). A
client that disconnects cancels its request: the loop drops it before its next step.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from dataclasses import dataclass

import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from specbound.engine.processing import Sampling
from specbound.serve.batching import (BatchingLoop, CacheFull, Event, Failed, Finished, Job, Overloaded, Text,
                                      Unavailable)
from specbound.serve.prompts import PromptEncoder
from specbound.serve.schemas import ChatCompletionRequest, CompletionRequest, RequestError, error_body, parse_request
from specbound.serve.sse import Reply, failure_body

DISCONNECT_POLL = 0.1  # seconds between checks that a non-streaming client is still there
RETRY_AFTER = 1  # seconds a refused (429) client is told to wait


@dataclass(frozen=True)
class Settings:
    """What the server answers with and the defaults of a request's fields."""

    model_name: str
    context: int | None  # the target's positions (None: unknown, unchecked)
    max_tokens: int  # a request's max_tokens when it names none (cut to the context)
    sampling: Sampling  # a request's temperature, top_k and top_p when it names none
    seed: int  # seeds the seeds of requests that name none
    max_body_bytes: int  # a request body's size at most (413 beyond)
    api_key: str | None = None
    stop_seconds: float = 5.0  # how long the loop gets to stop once the server shuts down


@dataclass(frozen=True)
class Endpoint:
    schema: type[CompletionRequest] | type[ChatCompletionRequest]
    chat: bool


COMPLETIONS = Endpoint(CompletionRequest, chat=False)
CHAT_COMPLETIONS = Endpoint(ChatCompletionRequest, chat=True)


@dataclass(frozen=True)
class _Checked:
    """A request checked whole, ready to join the loop."""

    body: CompletionRequest | ChatCompletionRequest
    prompt_ids: list[int]
    max_tokens: int
    sampling: Sampling


class RequestHandling:
    """The requests of one server (module docstring)."""

    def __init__(self, loop: BatchingLoop, encoder: PromptEncoder, settings: Settings):
        self.loop, self.encoder, self.settings = loop, encoder, settings
        self.seeds = np.random.default_rng(settings.seed)  # drawn on the event loop only

    def authorize(self, request: Request) -> None:
        if self.settings.api_key is None:
            return
        given = request.headers.get("authorization")
        if given is None:
            raise RequestError(401, "You didn't provide an API key: send it as 'Authorization: Bearer KEY'.",
                               code="invalid_api_key")
        scheme, _, token = given.strip().partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(),
                                                                 self.settings.api_key.encode()):
            raise RequestError(401, "Incorrect API key provided.", code="invalid_api_key")

    async def serve(self, request: Request, endpoint: Endpoint):
        arrived = time.monotonic()
        self.authorize(request)
        raw = await self._body(request)
        checked = await asyncio.to_thread(self._check, endpoint, raw)
        body = checked.body
        seed = body.seed if body.seed is not None else int(self.seeds.integers(2**63 - 1))
        events: asyncio.Queue[Event] = asyncio.Queue()
        event_loop = asyncio.get_running_loop()

        def deliver(event: Event) -> None:  # from the decoding thread
            try:
                event_loop.call_soon_threadsafe(events.put_nowait, event)
            except RuntimeError:  # the server's event loop closed: nobody is listening
                pass

        job = Job(checked.prompt_ids, checked.max_tokens, checked.sampling, seed, body.stops, deliver, arrived)
        self._submit(job)
        reply = Reply(self.settings.model_name, endpoint.chat)
        if body.stream:
            return _EventStream(reply.events(events.get, body.include_usage), lambda: self.loop.cancel(job))
        return await self._collect(request, job, events, reply)

    async def _body(self, request: Request) -> bytes:
        limit = self.settings.max_body_bytes
        too_large = RequestError(413, f"The request body is larger than this server takes ({limit:,} bytes; "
                                 "--max-body-bytes).", code="request_too_large")
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise too_large
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large
            chunks.append(chunk)
        return b"".join(chunks)

    def _check(self, endpoint: Endpoint, raw: bytes) -> _Checked:
        """The request checked whole (on a worker thread: it parses and tokenises)."""
        body = parse_request(endpoint.schema, raw)
        name = self.settings.model_name
        if body.model != name:
            raise RequestError(404, f"The model '{body.model}' does not exist; this server serves '{name}'.", "model",
                               "model_not_found")
        prompt_ids = self.encoder.chat(body) if endpoint.chat else self.encoder.completion(body)
        return _Checked(body, prompt_ids, self._token_limit(len(prompt_ids), body.token_limit), self._sampling(body))

    def _token_limit(self, prompt_tokens: int, asked: int | None) -> int:
        """The request's ``max_tokens``, checked against the context (the prompt was, by the encoder)."""
        context, default = self.settings.context, self.settings.max_tokens
        if asked is None:
            return default if context is None else min(default, context - prompt_tokens)
        if context is not None and prompt_tokens + asked > context:
            raise RequestError(400, f"This model's maximum context length is {context} tokens; your prompt has "
                               f"{prompt_tokens} and max_tokens asks for {asked} more.", "max_tokens",
                               "context_length_exceeded")
        return asked

    def _sampling(self, body) -> Sampling:
        default = self.settings.sampling
        values = {"temperature": default.temperature if body.temperature is None else body.temperature,
                  "top_k": default.top_k if body.top_k is None else body.top_k,
                  "top_p": default.top_p if body.top_p is None else body.top_p}
        try:
            return Sampling(**values)
        except ValueError as error:
            field = str(error).partition(":")[0]
            raise RequestError(400, str(error), field if field in values else None) from None

    def _submit(self, job: Job) -> None:
        busy = {"code": "rate_limit_exceeded", "kind": "requests", "headers": {"Retry-After": str(RETRY_AFTER)}}
        try:
            self.loop.submit(job)
        except Overloaded as error:
            raise RequestError(429, f"The server is busy: {error}. Retry later.", **busy) from None
        except CacheFull as error:
            raise RequestError(429, f"The server's cache is full: {error}. Retry later, or ask for fewer max_tokens.",
                               "max_tokens", **busy) from None
        except Unavailable as error:
            raise RequestError(503, f"The server cannot take requests: {error}.", kind="server_error") from None

    async def _collect(self, request: Request, job: Job, events: asyncio.Queue[Event], reply: Reply):
        parts, check_at = [], time.monotonic() + DISCONNECT_POLL
        try:
            while True:
                try:
                    event = await asyncio.wait_for(events.get(), DISCONNECT_POLL)
                except TimeoutError:
                    event = None
                if time.monotonic() >= check_at:  # every DISCONNECT_POLL, whether text came or not
                    check_at = time.monotonic() + DISCONNECT_POLL
                    if await request.is_disconnected():
                        return JSONResponse(error_body("The client disconnected."), 499)
                if isinstance(event, Text):
                    parts.append(event.text)
                elif isinstance(event, Finished):
                    return reply.whole("".join(parts), event)
                elif isinstance(event, Failed):
                    return JSONResponse(failure_body(event), event.status)
        finally:
            self.loop.cancel(job)  # a client gone (no-op once the request ended)


class _EventStream(StreamingResponse):
    """Server-sent events whose request is cancelled however the response ends: a client gone
    mid-stream, or before the first event was sent (no-op once the request ended)."""

    def __init__(self, events, cancel):
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._cancel = cancel

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._cancel()
