"""The HTTP application: OpenAI's routes over one ``BatchingLoop``.

- ``POST /v1/completions``, ``POST /v1/chat/completions``: a JSON response, or with
  ``"stream": true`` server-sent events as OpenAI sends them (``sse``). Every response carries
  ``usage`` and a ``specbound`` object: the method, the plans its steps ran (auto), target
  calls, tokens per target call, drafted tokens, accepted drafts and the acceptance rate;
- ``GET /v1/models``, ``GET /v1/models/{id}``: the one model served;
- ``GET /health``: the loop's load; ``GET /metrics``: Prometheus' text format (``metrics``);
  neither needs a key.

How a request is bounded, checked and answered is ``handling``'s. Whatever goes wrong, the
answer is OpenAI's error object: a refusal 4xx or 429, a fault of the server 500 or 503.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from specbound.serve.batching import BatchingLoop
from specbound.serve.handling import CHAT_COMPLETIONS, COMPLETIONS, RequestHandling, Settings
from specbound.serve.metrics import CONTENT_TYPE, ServerMetrics
from specbound.serve.prompts import PromptEncoder
from specbound.serve.schemas import RequestError, error_body

log = logging.getLogger("specbound.serve")


def create_app(loop: BatchingLoop, encoder: PromptEncoder, settings: Settings,
               metrics: ServerMetrics | None = None) -> FastAPI:
    """The application serving ``loop`` (started and stopped with the application's life);
    ``metrics``: the counters ``loop`` reports to (a fresh set, reading only the loop's
    load, when None)."""
    handling = RequestHandling(loop, encoder, settings)
    if metrics is None:
        metrics = ServerMetrics()
    metrics.watch(loop)
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app):
        loop.start()
        yield
        await asyncio.to_thread(loop.stop, settings.stop_seconds)

    app = FastAPI(title="specbound", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(RequestError)
    async def refused(request, error: RequestError):
        metrics.refusal(error.status)
        return JSONResponse(error.body, error.status, headers=error.headers)

    @app.exception_handler(HTTPException)
    async def http_error(request, error: HTTPException):
        metrics.refusal(error.status_code)
        return JSONResponse(error_body(str(error.detail), "invalid_request_error"), error.status_code)

    @app.exception_handler(Exception)
    async def fault(request, error: Exception):  # a bug: logged with its traceback, answered as OpenAI would
        log.error("a request failed", exc_info=error)
        return JSONResponse(error_body("The server failed on this request.", "server_error"), 500)

    def model_card() -> dict:
        return {"id": settings.model_name, "object": "model", "created": created, "owned_by": "specbound"}

    @app.get("/health")
    async def health():
        load = loop.health()
        return JSONResponse({"status": "error" if load["broken"] else "ok", "model": settings.model_name, **load},
                            503 if load["broken"] else 200)

    @app.get("/metrics")
    async def metrics_text():
        return Response(metrics.text(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models(request: Request):
        handling.authorize(request)
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model:path}")
    async def model(request: Request, model: str):
        handling.authorize(request)
        if model != settings.model_name:
            raise RequestError(404, f"The model '{model}' does not exist; this server serves "
                               f"'{settings.model_name}'.", "model", "model_not_found")
        return model_card()

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await handling.serve(request, COMPLETIONS)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await handling.serve(request, CHAT_COMPLETIONS)

    return app
