"""Engines as the auditor's samplers: ``sampler(prompt_ids, max_new_tokens, seed) -> new tokens``
(EOS included where the engine stopped there).

- ``engine_sampler``: ours, a ``engine.decode.Decoder`` and a method (or a planner);
- ``llama_cpp_sampler``: llama-cpp-python's ``Llama.generate``, plain or with its
  ``draft_model`` (prompt lookup, ``LlamaPromptLookupDecoding``, or ``ModelDraft``: a second
  GGUF file proposing greedy drafts); llama.cpp's sampler chain with min-p and typical-p off
  and no repeat penalty. Its chain applies the temperature after top-k and top-p, so its law
  is ours (temperature, then top-k, then top-p) only with top-p 1;
- ``transformers_sampler``: ``generate`` of a transformers model, with ``assistant_model``
  for assisted generation, every other logits processor of its generation config turned off;
- ``endpoint_sampler``: an OpenAI-compatible ``/v1/completions`` endpoint given the prompt as
  token ids, the sampled ids read from where the server puts them (``SERVERS``);
  ``endpoint_address`` checks its URL and ``probe_endpoint`` asks it, in seconds, whether it is
  up and serves the model, before anything loads.

torch is imported by the samplers that run torch models, not here: the command line checks an
endpoint before it imports torch.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable

Sampler = Callable[[list[int], int, int], list[int]]


def engine_sampler(decoder, method) -> Sampler:
    """Our engine: ``decoder.generate`` with ``method``, one generator per seed."""
    import torch

    def sample(prompt_ids, max_new_tokens, seed):
        generator = torch.Generator(device=decoder.target.device).manual_seed(seed)
        return decoder.generate(prompt_ids, method, max_new_tokens, generator).tokens
    return sample


def llama_cpp_sampler(llama, temperature: float, top_k: int = 0, top_p: float = 1.0) -> Sampler:
    """llama-cpp-python's ``Llama`` (its ``draft_model``, if any, drafting) as a sampler."""
    def sample(prompt_ids, max_new_tokens, seed):
        llama.reset()
        llama.set_seed(seed)
        tokens = []
        for token in llama.generate(prompt_ids, top_k=top_k, top_p=top_p, min_p=0.0, typical_p=1.0, temp=temperature,
                                    repeat_penalty=1.0, reset=True):
            tokens.append(int(token))
            if token == llama.token_eos() or len(tokens) >= max_new_tokens:
                break
        return tokens
    return sample


class ModelDraft:
    """A llama-cpp-python draft model (``Llama(draft_model=)``) that proposes the greedy
    continuation of a second ``Llama`` (the draft GGUF file), ``num_pred_tokens`` at a time."""

    def __init__(self, draft_llama, num_pred_tokens: int = 4):
        self.draft = draft_llama
        self.num_pred_tokens = num_pred_tokens

    def __call__(self, input_ids, /, **kwargs):
        import numpy as np

        self.draft.reset()
        proposed = []
        for token in self.draft.generate(input_ids.tolist(), top_k=1, temp=0.0, reset=True):
            if len(proposed) >= self.num_pred_tokens:
                break
            proposed.append(int(token))
        return np.array(proposed, dtype=np.intc)


def transformers_sampler(model, temperature: float, top_k: int = 0, top_p: float = 1.0, assistant_model=None,
                         eos_token_ids=()) -> Sampler:
    """transformers' ``generate`` (assisted generation with ``assistant_model``); transformers
    draws from torch's global generator, seeded before each sample."""
    import torch

    options = {"do_sample": temperature > 0, "temperature": temperature if temperature > 0 else None,
               "top_k": top_k, "top_p": top_p, "repetition_penalty": 1.0, "min_p": None, "typical_p": 1.0,
               "eos_token_id": list(eos_token_ids) or None, "pad_token_id": (list(eos_token_ids) or [0])[0]}

    def sample(prompt_ids, max_new_tokens, seed):
        torch.manual_seed(seed)
        inputs = torch.tensor([prompt_ids])
        with torch.no_grad():
            output = model.generate(inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=max_new_tokens,
                                    min_new_tokens=0, assistant_model=assistant_model, **options)
        return output[0, len(prompt_ids):].tolist()
    return sample


SERVERS = {  # what to add to a request body, and where the response holds the sampled token ids
    "specbound": ({}, lambda body: body.get("specbound", {}).get("token_ids")),
    "llama.cpp": ({"return_tokens": True}, lambda body: body["choices"][0].get("tokens", body.get("tokens"))),
    "vllm": ({"return_token_ids": True}, lambda body: body["choices"][0].get("token_ids")),
}
CHECKS_MODEL = ("specbound", "vllm")  # servers that refuse a model they do not serve (llama-server ignores the name)
REQUEST_TIMEOUT = 60.0  # seconds a request may wait for its reply
PROBE_TIMEOUT = 5.0  # seconds ``probe_endpoint`` waits at most


def endpoint_address(url: str, name: str = "endpoint") -> str:
    """``url`` (``http(s)://HOST[:PORT][/PATH]``) without its trailing slash, checked without
    a connection; ValueError naming ``name`` for anything else."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as error:
        raise ValueError(f"{name}: {url!r} is not a URL: {error}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{name}: expected an http:// or https:// URL, got {url!r}")
    if not parts.hostname:
        raise ValueError(f"{name}: {url!r} names no host; expected {parts.scheme}://HOST[:PORT]")
    if port == 0:
        raise ValueError(f"{name}: {url!r} names port 0; expected a port in [1, 65535]")
    return url.rstrip("/")


def probe_endpoint(url: str, model: str, server: str = "specbound", api_key: str | None = None,
                   timeout: float = PROBE_TIMEOUT, name: str = "endpoint") -> None:
    """Ask ``GET {url}/v1/models`` whether the endpoint is up, takes the key and serves
    ``model`` (where ``server`` refuses other names: ``CHECKS_MODEL``); ValueError naming
    ``name`` (``model`` for a model it does not serve). A server without that route passes."""
    address = endpoint_address(url, name) + "/v1/models"
    try:
        reply = _fetched(urllib.request.Request(address, headers=_headers(api_key)), address, timeout, name)
    except urllib.error.HTTPError as error:
        if error.code in (401, 403):
            raise ValueError(f"{name}: {address} answered {error.code}: its API key is not "
                             f"{'this one' if api_key else 'set'} ($SPECBOUND_API_KEY)") from None
        return  # no /v1/models here: the first sample tells
    served = [entry.get("id") for entry in reply.get("data", []) if isinstance(entry, dict)] \
        if isinstance(reply, dict) and isinstance(reply.get("data"), list) else []
    if server in CHECKS_MODEL and served and model not in served:
        raise ValueError(f"model: {url} serves {', '.join(map(repr, served))}, not {model!r}")


def _headers(api_key: str | None) -> dict:
    return {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {api_key}"} if api_key else {})


def _fetched(request: urllib.request.Request, address: str, timeout: float, name: str):
    """The JSON reply to ``request``; ValueError naming ``name`` where the endpoint cannot be
    reached, does not answer within ``timeout`` seconds, or answers something that is not JSON
    (an ``HTTPError`` is left to the caller)."""
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            payload = response.read()
    except urllib.error.HTTPError:
        raise
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        if isinstance(reason, TimeoutError):
            raise ValueError(f"{name}: {address} did not answer within {timeout:g} s") from None
        raise ValueError(f"{name}: cannot reach {address}: {reason}") from None
    try:
        return json.loads(payload.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{name}: {address} answered bytes that are not UTF-8 text, not JSON: "
                         f"{payload[:40]!r}") from None
    except json.JSONDecodeError:
        raise ValueError(f"{name}: {address} answered something that is not JSON: {payload[:80]!r}") from None


def endpoint_sampler(url: str, model: str, temperature: float, top_k: int = 0, top_p: float = 1.0,
                     server: str = "specbound", api_key: str | None = None, eos_token_ids=(),
                     timeout: float = REQUEST_TIMEOUT) -> Sampler:
    """``POST {url}/v1/completions`` with the prompt's token ids, each request waiting
    ``timeout`` seconds at most; ValueError naming ``endpoint`` where the URL is not one
    (``endpoint_address``), or the endpoint cannot be reached, does not answer in time,
    answers with an error or with something that is not JSON, or returns no list of integer
    token ids. A reply that stopped on EOS ("stop") without it among its ids gets
    ``eos_token_ids[0]`` appended (servers leave it out of the ids)."""
    if server not in SERVERS:
        raise ValueError(f"server: expected one of {', '.join(SERVERS)}, got {server!r}")
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout: expected a positive number of seconds, got {timeout!r}")
    extra, token_ids_of = SERVERS[server]
    address = endpoint_address(url) + "/v1/completions"

    def sample(prompt_ids, max_new_tokens, seed):
        body = {"model": model, "prompt": list(prompt_ids), "max_tokens": max_new_tokens, "temperature": temperature,
                "top_p": top_p, "seed": seed, **({"top_k": top_k} if top_k else {}), **extra}
        request = urllib.request.Request(address, json.dumps(body).encode(), _headers(api_key), method="POST")
        try:
            reply = _fetched(request, address, timeout, "endpoint")
        except urllib.error.HTTPError as error:
            raise ValueError(f"endpoint: {address} answered {error.code}: "
                             f"{error.read()[:300].decode(errors='replace')}") from None
        try:
            tokens = token_ids_of(reply)
            finish = reply["choices"][0].get("finish_reason")
        except (KeyError, IndexError, TypeError, AttributeError):
            tokens = None
        if not isinstance(tokens, list):
            raise ValueError(f"endpoint: {address} returned no token ids (a {server} server puts them "
                             f"{'in the body as ' + json.dumps(extra) + ' asks' if extra else 'in specbound.token_ids'})")
        strays = [token for token in tokens if isinstance(token, bool) or not isinstance(token, int)]
        if strays:
            raise ValueError(f"endpoint: {address} returned token ids holding {type(strays[0]).__name__} "
                             f"{json.dumps(strays[0])[:40]}; expected integers")
        if finish == "stop" and eos_token_ids and (not tokens or tokens[-1] not in eos_token_ids):
            tokens = tokens + [eos_token_ids[0]]
        return tokens
    return sample
