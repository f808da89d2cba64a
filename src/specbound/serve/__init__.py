"""``specbound serve``: an OpenAI-compatible HTTP server over the engine's step-level API.

- ``schemas``: the request bodies (``/v1/completions``, ``/v1/chat/completions``) and
  OpenAI's error object;
- ``prompts``: request → prompt token ids (text, token ids, chat messages through the
  target tokenizer's chat template);
- ``text``: tokens → the text a stream sends, stop strings cut;
- ``batching``: the one decoding loop of a server (continuous batching: a request joins the
  running batch at the next step, leaves when it ends, is cancelled or its client goes);
- ``app``: the FastAPI application (routes, streaming, keys, overload).

The layer sits above ``api`` (it serves a ``Speculator``), beside ``cli``.
"""
