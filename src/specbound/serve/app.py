"""The HTTP application: OpenAI's routes over one ``BatchingLoop``.

- ``POST /v1/completions``, ``POST /v1/chat/completions``: a JSON response, or with
  ``"stream": true`` server-sent events as OpenAI sends them (``data: {chunk}`` lines, then
  ``data: [DONE]``). Every response carries ``usage`` (in a stream: on the chunk that ends
  it, or on a chunk of its own with ``stream_options.include_usage``, as OpenAI does) and a
  ``specbound`` object: the method, the plans its steps ran (auto), target calls, tokens per
  target call, drafted tokens, accepted drafts and the acceptance rate.
- ``GET /v1/models``: the one model served; ``GET /health``: the loop's load (no key needed).

A request is checked whole before it queues — body, fields, model, prompt and token limit
against the context — and refused with OpenAI's error object naming the field (400, 404
for an unknown model); a full queue answers 429 with ``Retry-After``; with an API key, a
missing or wrong bearer token answers 401. A client that disconnects cancels its request:
the loop drops it before its next step.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from specbound.engine.processing import Processing
from specbound.serve.batching import BatchingLoop, Failed, Finished, Job, Overloaded, Text, TooManySettings, Unavailable
from specbound.serve.prompts import PromptEncoder
from specbound.serve.schemas import ChatCompletionRequest, CompletionRequest, RequestError, error_body, parse_request

DISCONNECT_POLL = 0.1  # seconds between checks that a non-streaming client is still there
RETRY_AFTER = 1  # seconds a refused (429) client is told to wait


@dataclass(frozen=True)
class Settings:
    """What the server answers with and the defaults of a request's fields."""

    model_name: str
    context: int | None  # the target's positions (None: unknown, unchecked)
    max_tokens: int  # a request's max_tokens when it names none (cut to the context)
    temperature: float
    top_k: int | None
    top_p: float | None
    seed: int  # seeds the seeds of requests that name none
    api_key: str | None = None
    stop_seconds: float = 5.0  # how long the loop gets to stop once the server shuts down


def create_app(loop: BatchingLoop, encoder: PromptEncoder, settings: Settings) -> FastAPI:
    seeds = np.random.default_rng(settings.seed)
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app):
        loop.start()
        yield
        await asyncio.to_thread(loop.stop, settings.stop_seconds)

    app = FastAPI(title="specbound", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(RequestError)
    async def refused(request, error: RequestError):
        return JSONResponse(error.body, error.status, headers=error.headers)

    @app.exception_handler(HTTPException)
    async def http_error(request, error: HTTPException):
        return JSONResponse(error_body(str(error.detail), "invalid_request_error"), error.status_code)

    def authorize(request: Request) -> None:
        if settings.api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {settings.api_key}".encode()):
            raise RequestError(401, "Incorrect API key provided." if given else
                               "You didn't provide an API key: send it as 'Authorization: Bearer KEY'.",
                               code="invalid_api_key")

    @app.get("/health")
    async def health():
        health = loop.health()
        return JSONResponse({"status": "error" if health["broken"] else "ok", "model": settings.model_name, **health},
                            503 if health["broken"] else 200)

    @app.get("/v1/models")
    async def models(request: Request):
        authorize(request)
        return {"object": "list", "data": [{"id": settings.model_name, "object": "model", "created": created,
                                            "owned_by": "specbound"}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await serve(request, CompletionRequest, encoder.completion, "prompt", chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await serve(request, ChatCompletionRequest, encoder.chat, "messages", chat=True)

    async def serve(request: Request, schema, encode, prompt_field: str, chat: bool):
        authorize(request)
        body = parse_request(schema, await request.body())
        if body.model != settings.model_name:
            raise RequestError(404, f"The model '{body.model}' does not exist; this server serves "
                               f"'{settings.model_name}'.", "model", "model_not_found")
        prompt_ids = encode(body)
        max_tokens = token_limit(len(prompt_ids), body.token_limit if chat else body.max_tokens, prompt_field)
        processing = sampling(body)
        seed = body.seed if body.seed is not None else int(seeds.integers(2**63 - 1))
        events: asyncio.Queue = asyncio.Queue()
        event_loop = asyncio.get_running_loop()

        def deliver(event) -> None:  # from the decoding thread
            try:
                event_loop.call_soon_threadsafe(events.put_nowait, event)
            except RuntimeError:  # the server's event loop closed: nobody is listening
                pass

        job = Job(prompt_ids, max_tokens, processing, seed, body.stops, deliver)
        try:
            loop.submit(job)
        except Overloaded as error:
            raise RequestError(429, f"The server is busy: {error}. Retry later.", code="rate_limit_exceeded",
                               kind="requests", headers={"Retry-After": str(RETRY_AFTER)}) from None
        except Unavailable as error:
            raise RequestError(503, f"The server cannot take requests: {error}.", kind="server_error") from None
        except TooManySettings as error:
            raise RequestError(400, f"Unsupported sampling setting: {error}.", "temperature") from None
        reply = Reply(settings.model_name, chat)
        if body.stream:
            return StreamingResponse(stream(job, events, reply, body.include_usage), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await collect(request, job, events, reply)

    def token_limit(prompt_tokens: int, asked: int | None, prompt_field: str) -> int:
        context = settings.context
        if context is not None and prompt_tokens >= context:
            raise RequestError(400, f"This model's maximum context length is {context} tokens; your prompt has "
                               f"{prompt_tokens}.", prompt_field, "context_length_exceeded")
        if asked is None:
            return settings.max_tokens if context is None else min(settings.max_tokens, context - prompt_tokens)
        if context is not None and prompt_tokens + asked > context:
            raise RequestError(400, f"This model's maximum context length is {context} tokens; your prompt has "
                               f"{prompt_tokens} and max_tokens asks for {asked} more.", "max_tokens",
                               "context_length_exceeded")
        return asked

    def sampling(body) -> Processing:
        values = {"temperature": settings.temperature if body.temperature is None else body.temperature,
                  "top_k": settings.top_k if body.top_k is None else body.top_k,
                  "top_p": settings.top_p if body.top_p is None else body.top_p}
        try:
            return Processing(values["temperature"], values["top_k"], values["top_p"], encoder.pair.vocab_size)
        except ValueError as error:
            field = str(error).partition(":")[0]
            raise RequestError(400, str(error), field if field in values else None) from None

    async def collect(request: Request, job: Job, events: asyncio.Queue, reply: Reply):
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
                if event is None:
                    continue
                if isinstance(event, Text):
                    parts.append(event.text)
                elif isinstance(event, Finished):
                    return reply.whole("".join(parts), event)
                else:
                    raise RequestError(event.status, event.message, kind="server_error" if event.status >= 500
                                       else "invalid_request_error")
        finally:
            loop.cancel(job)  # a client gone, or the drain's time up (no-op once the request ended)

    async def stream(job: Job, events: asyncio.Queue, reply: Reply, include_usage: bool):
        try:
            if reply.chat:
                yield reply.sse(reply.chunk({"role": "assistant", "content": ""}))
            while True:
                event = await events.get()
                if isinstance(event, Text):
                    yield reply.sse(reply.chunk({"content": event.text} if reply.chat else event.text))
                    continue
                if isinstance(event, Finished):
                    last = reply.chunk({} if reply.chat else "", event.finish_reason)
                    figures = {"usage": event.usage, "specbound": event.specbound}
                    if include_usage:
                        yield reply.sse(last)
                        yield reply.sse(reply.chunk(None) | figures)
                    else:
                        yield reply.sse(last | figures)
                elif isinstance(event, Failed):
                    yield reply.sse(error_body(event.message, "server_error" if event.status >= 500
                                               else "invalid_request_error"))
                yield "data: [DONE]\n\n"
                return
        finally:
            loop.cancel(job)  # a client gone mid-stream (no-op once the request ended)

    return app


class Reply:
    """OpenAI's response objects for one request."""

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
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}} if self.chat
                  else {"index": 0, "text": text})
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model,
                "choices": [choice | {"logprobs": None, "finish_reason": finished.finish_reason}],
                "usage": finished.usage, "specbound": finished.specbound}

    @staticmethod
    def sse(payload: dict) -> str:
        return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"
