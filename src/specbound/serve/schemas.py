"""Request bodies of the OpenAI API as this server takes them, and OpenAI's error object.

Fields are checked strictly (a string where a number belongs is refused, not converted) and
unknown fields are refused, as OpenAI refuses them; a refusal names the field
(``param``). OpenAI fields this server does not implement are accepted only at their
neutral value (``n`` = 1, no penalties, no logprobs, no echo), so that a client relying on
them learns it at once. ``top_k`` is an extension (llama.cpp's and vLLM's servers take it).
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

MAX_STOPS = 4  # OpenAI's limit
MAX_DEPTH = 32  # nesting levels of a body; OpenAI's requests nest five at most
_SURROGATE = re.compile("[\ud800-\udfff]")
_SCALARS = {int, float, bool, type(None)}


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class RequestError(Exception):
    """A request refused with an HTTP status and OpenAI's error object."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.status, self.param, self.code, self.kind = status, param, code, kind
        self.headers = headers or {}

    @property
    def body(self) -> dict:
        return error_body(str(self), self.kind, self.param, self.code)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False


def _neutral(value, neutral, name: str):
    if value not in neutral:
        raise ValueError(f"{name} is not supported by this server (only {neutral[0]!r})")
    return value


class _Sampling(BaseModel):
    """What both endpoints share."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)  # JSON's NaN: not a number

    model: str
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=1)] | None = None
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    user: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict | None = None
    logprobs: bool | int | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_strings(cls, value):
        if value is None or isinstance(value, str):
            return value
        if not isinstance(value, list):
            raise ValueError(f"expected a string or a list of strings, got {type(value).__name__}")
        wrong = next((index for index, stop in enumerate(value) if not isinstance(stop, str)), None)
        if wrong is not None:
            raise ValueError(f"expected a string or a list of strings (item {wrong} is {type(value[wrong]).__name__})")
        if len(value) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop sequences, got {len(value)}")
        return value

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value):
        if value != 1:
            raise ValueError("only n = 1 is supported")
        return value

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, value, info):
        return _neutral(value, (None, 0, 0.0), info.field_name)

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, value):
        return _neutral(value, (None, {}), "logit_bias")

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, value):
        return _neutral(value, (None, False, 0), "logprobs")

    @property
    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def token_limit(self) -> int | None:
        """The new tokens asked for (None: the server's default)."""
        return self.max_tokens


class CompletionRequest(_Sampling):
    prompt: str | list[int] | Annotated[list[str], Field(min_length=1, max_length=1)]
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value):
        return _neutral(value, (False,), "echo")

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value):
        return _neutral(value, (None,), "suffix")

    @field_validator("best_of")
    @classmethod
    def _one_best(cls, value):
        return _neutral(value, (None, 1), "best_of")


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class ChatCompletionRequest(_Sampling):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


def parse_request(schema: type[BaseModel], body: bytes) -> BaseModel:
    """The request ``body`` as ``schema``, or a ``RequestError`` (400) naming the field. A
    body that nests deeper than ``MAX_DEPTH`` or holds a string that is not Unicode text (a
    lone surrogate such as ``"\\ud800"``, which no tokenizer can encode) is refused first."""
    try:
        data = json.loads(body)
    except RecursionError:
        raise RequestError(400, f"The JSON body nests deeper than {MAX_DEPTH} levels.") from None
    except UnicodeDecodeError:
        raise RequestError(400, "The request body is not valid UTF-8 text.") from None
    except ValueError as error:
        raise RequestError(400, f"We could not parse the JSON body of your request: {error}.") from None
    if not isinstance(data, dict):
        raise RequestError(400, "The request body must be a JSON object.")
    _check_text(data)
    try:
        return schema.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        location = [part for part in first["loc"] if not _is_union_branch(part)]
        param = _param(location)
        if first["type"] == "extra_forbidden":
            raise RequestError(400, f"Unrecognized request argument supplied: {param}", param) from None
        if first["type"] == "missing":
            raise RequestError(400, f"Missing required parameter: '{param}'.", param) from None
        message = first["msg"].removeprefix("Value error, ")
        raise RequestError(400, f"Invalid value for '{param}': {message}.", param) from None


def _check_text(data: dict) -> None:
    """Refuse nesting deeper than ``MAX_DEPTH`` and strings (keys too) with a lone surrogate,
    naming where."""
    stack = [(data, [], 1)]
    while stack:
        value, location, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise RequestError(400, f"The JSON body nests deeper than {MAX_DEPTH} levels.", _param(location[:1]))
        if isinstance(value, list) and set(map(type, value)) <= _SCALARS:  # token ids: nothing to look into
            continue
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if isinstance(key, str) and _SURROGATE.search(key):
                raise RequestError(400, "A field name holds a lone UTF-16 surrogate (not Unicode text).",
                                   _param(location) or None)
            if isinstance(item, str):
                if _SURROGATE.search(item):
                    where = _param([*location, key])
                    raise RequestError(400, f"Invalid value for '{where}': a lone UTF-16 surrogate is not Unicode "
                                       "text.", where)
            elif isinstance(item, (dict, list)):
                stack.append((item, [*location, key], depth + 1))


def _is_union_branch(part) -> bool:
    """pydantic names the union member it tried (``str``, ``list[int]``, ``function-after[...]``)."""
    return isinstance(part, str) and (part in ("str", "int", "float", "bool") or "[" in part)


def _param(location: list) -> str:
    """OpenAI's spelling of a field path: ``messages[0].content``."""
    text = ""
    for part in location:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text
