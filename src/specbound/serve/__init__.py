"""``specbound serve``: an OpenAI-compatible HTTP server over the engine's step-level API.

- ``schemas``: the request bodies (``/v1/completions``, ``/v1/chat/completions``) and
  OpenAI's error object;
- ``prompts``: request → prompt token ids (text, token ids, chat messages through the
  target tokenizer's chat template), bounded by the context before it is tokenised whole;
- ``text``: tokens → the text a stream sends, stop strings cut;
- ``batching``: the one decoding loop of a server (continuous batching: a request takes a
  free batch slot at the next step, leaves when it ends, is cancelled or its client goes);
- ``handling``: one request from its bytes to its response (size, key, checks off the event
  loop, admission, collecting or streaming);
- ``sse``: OpenAI's response objects and the server-sent events of a stream;
- ``metrics``: ``GET /metrics`` in Prometheus' text format;
- ``app``: the FastAPI application (the routes);
- ``server``: the address bound before the models load, uvicorn, the drain on SIGTERM.

The layer sits above ``api`` (it serves a ``Speculator``), beside ``cli``.
"""
