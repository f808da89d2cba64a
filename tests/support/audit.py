"""Engines to audit, correct and buggy, on models cheap enough for thousands of samples.

A **bigram model** is a table of logits by the last token (``TableModel``): next-token
logits depend on the last token only, so a row costs an index, not a forward. Its
``TableReference`` is the auditor's reference over it (both in ``specbound.audit.tables``). ``chain_sampler`` is speculative
sampling written out (SPEC.md §1: draft γ tokens from q, accept x with probability
min(1, p(x)/q(x)), after a rejection draw from norm((p − q)+), a bonus token from p after γ
acceptances), with the two bug families as options:

- ``bug="target_residual"``: after a rejection, draw from p instead of the residual;
- the draft-law bug: drafts drawn from q with the sampling's top-k, but the ratio and the
  residual use q without it (``ratio_laws``: the law the drafts were *not* drawn from).

The samplers work on the processed laws (``laws``: one row per last token) in numpy.

p = target, q = draft throughout (SPEC.md §0).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

from specbound.audit.tables import (VOCAB, TableModel, TableReference, bigram_pair, draw, laws, prompts,
                                     shifted_sampler)

__all__ = ["VOCAB", "Endpoint", "TableModel", "TableReference", "bigram_pair", "chain_sampler", "draw",
           "exact_sampler", "laws", "prompts", "shifted_sampler"]


def exact_sampler(target_laws: np.ndarray):
    """Plain sampling from the reference's law itself."""
    def sample(prompt, max_new_tokens, seed):
        rng = np.random.default_rng(seed)
        context = list(prompt)
        for _ in range(max_new_tokens):
            context.append(draw(target_laws[context[-1]], rng))
        return context[len(prompt):]
    return sample


def chain_sampler(target_laws: np.ndarray, draft_laws: np.ndarray, gamma: int = 3, bug: str | None = None,
                  ratio_laws: np.ndarray | None = None):
    """Speculative sampling with lookahead ``gamma`` (module docstring): drafts drawn from
    ``draft_laws``, the ratio and the residual computed with ``ratio_laws`` (default: the
    same; another law is the "draft_law" bug), ``bug`` None or "target_residual"."""
    if bug not in (None, "target_residual"):
        raise ValueError(f"bug: {bug!r}")
    ratio_laws = draft_laws if ratio_laws is None else ratio_laws

    def sample(prompt, max_new_tokens, seed):
        rng = np.random.default_rng(seed)
        context = list(prompt)
        while len(context) - len(prompt) < max_new_tokens:
            drafts = []
            for _ in range(gamma):
                drafts.append(draw(draft_laws[(context + drafts)[-1]], rng))
            last = context[-1]
            for token in drafts:
                target_probs, draft_probs = target_laws[last], ratio_laws[last]
                if draft_probs[token] > 0 and rng.random() < min(1.0, target_probs[token] / draft_probs[token]):
                    context.append(token)
                    last = token
                    continue
                residual = target_probs if bug == "target_residual" else np.maximum(target_probs - draft_probs, 0)
                context.append(draw(residual / residual.sum() if residual.sum() > 0 else target_probs, rng))
                break
            else:
                context.append(draw(target_laws[last], rng))
        return context[len(prompt):][:max_new_tokens]
    return sample


class Endpoint:
    """An OpenAI-compatible ``/v1/completions`` on a loopback port, answering with ``reply(body)``
    (a JSON value, or bytes sent as they are); ``GET /v1/models`` lists ``models`` (404 when None)."""

    def __init__(self, reply, models: list[str] | None = None):
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                answer = outer.reply(body)
                self._send(200, answer if isinstance(answer, bytes) else json.dumps(answer).encode())

            def do_GET(self):
                if self.path != "/v1/models" or outer.models is None:
                    self._send(404, b'{"error": "not found"}')
                    return
                listed = {"object": "list", "data": [{"id": name, "object": "model"} for name in outer.models]}
                self._send(200, json.dumps(listed).encode())

            def _send(self, status: int, payload: bytes):
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):  # the client stopped waiting (a timeout test)
                    pass

            def log_message(self, *args):
                pass

        self.reply = reply
        self.models = models
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
