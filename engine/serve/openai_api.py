"""The OpenAI dialect of the engine's HTTP service: strict request parsing and the response shapes.

Parsing refuses anything it would otherwise have to guess at, naming the field: wrong types, values out of
range, features the engine does not have (stop strings, logprobs, n > 1, ...) and arguments it does not know,
as OpenAI itself does. Features it lacks are still accepted at the value that changes nothing, because
clients often send them explicitly (`"logprobs": null`, `"presence_penalty": 0`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.runtime.sampler import (
    MAX_TEMPERATURE,
    MIN_TEMPERATURE,
    MIN_TOP_P,
    SEED_MAX,
    TEMPERATURE_RULE,
    TOP_P_RULE,
    SamplingParams,
)

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
_COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids", "ignore_eos",
           "n", "stream", "stream_options", "user", "logprobs", "presence_penalty", "frequency_penalty", "logit_bias"}
COMPLETION_FIELDS = _COMMON | {"prompt", "echo", "best_of", "suffix"}
CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens", "top_logprobs"}
# Features the engine lacks, accepted only at the values that leave a request unchanged.
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, False), "top_logprobs": (None, 0), "echo": (None, False), "best_of": (None, 1),
    "suffix": (None, ""), "presence_penalty": (None, 0), "frequency_penalty": (None, 0), "logit_bias": (None, {}),
}


class ApiError(Exception):
    """A request the service refuses; `param` names the offending field, as OpenAI's errors do."""

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status


@dataclass(frozen=True)
class GenerationRequest:
    """A parsed completion or chat request; the prompt is still text when the client sent text."""

    prompt: str | list[int]
    prompt_field: str  # where the prompt came from ("prompt" or "messages"), named when it is refused
    max_tokens: int | None  # None: whatever the context leaves (chat's default, as OpenAI)
    sampling: dict[str, Any]
    stream: bool
    include_usage: bool

    def check_prompt_chars(self, limit: int | None, max_model_len: int) -> None:
        """ApiError when a text prompt is longer than `limit` characters (Driver.max_prompt_chars): no such text fits
        max_model_len tokens, and tokenizing megabytes to find that out would take seconds."""
        if isinstance(self.prompt, str) and limit is not None and len(self.prompt) > limit:
            raise ApiError(f"{self.prompt_field}: {len(self.prompt):,} characters of prompt text, more than the "
                           f"{limit:,} that can fit this engine's max_model_len of {max_model_len:,} tokens; shorten "
                           "it", self.prompt_field)

    def params(self, prompt_tokens: int, max_model_len: int) -> SamplingParams:
        max_tokens = self.max_tokens or max(1, max_model_len - prompt_tokens)
        return SamplingParams(max_tokens=max_tokens, **self.sampling)


def parse_completion(body: dict[str, Any], model_name: str) -> GenerationRequest:
    _check_fields(body, COMPLETION_FIELDS, model_name)
    return _generation(body, _prompt(body.get("prompt")), "prompt", max_tokens=_integer(body, "max_tokens", 16, 1))


def parse_chat(body: dict[str, Any], model_name: str) -> GenerationRequest:
    _check_fields(body, CHAT_FIELDS, model_name)
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    return _generation(body, render_chat(body.get("messages")), "messages", max_tokens=_integer(body, name, None, 1))


def render_chat(messages: Any) -> str:
    """The chat template: one "<|role|>\\ncontent\\n" block per message, then "<|assistant|>\\n" to answer.

    Deliberately the same for every checkpoint: the engine reads no chat template from tokenizer files, so
    a client that needs a model's own template renders it and calls /v1/completions instead.
    """
    if not isinstance(messages, list) or not messages:
        raise ApiError("messages must be a non-empty list of {role, content} objects", "messages")
    lines = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise ApiError(f"{where} must be an object with role and content", where)
        extra = sorted(set(message) - {"role", "content", "name"})
        if extra:
            raise ApiError(f"{where}.{extra[0]} is not supported", f"{where}.{extra[0]}")
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise ApiError(f"{where}.role must be one of {', '.join(CHAT_ROLES)} (got {_show(role)})", f"{where}.role")
        lines.append(f"<|{role}|>\n{_content(message.get('content'), f'{where}.content')}\n")
    return "".join(lines) + "<|assistant|>\n"


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    # The list form OpenAI accepts: text parts only, since the engine reads no images or audio.
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise ApiError(f"{where} must be a string or a list of {{type: text, text}} parts", where)


def _check_fields(body: dict[str, Any], known: set[str], model_name: str) -> None:
    unknown = sorted(set(body) - known)
    if unknown:
        raise ApiError(f"unrecognized request argument: {', '.join(unknown)}", unknown[0])
    for name, neutral in _NEUTRAL.items():
        if name in known and body.get(name) not in neutral:
            raise ApiError(f"{name} is not supported by this engine (got {_show(body[name])})", name)
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise ApiError("user must be a string", "user")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(f"model must be a string (got {_show(model)})", "model")
    if model is not None and model != model_name:
        raise ApiError(f"the model {model!r} does not exist; this engine serves {model_name!r}", "model", 404)


def _prompt(prompt: Any) -> str | list[int]:
    # OpenAI's batch forms are accepted when they hold exactly one prompt.
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        if len(prompt) != 1:
            raise ApiError(f"one prompt per request (got {len(prompt)}): send each prompt as its own request",
                           "prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise ApiError("prompt must not be empty", "prompt")
        return prompt
    ids = _token_ids(prompt, "prompt")
    if not ids:
        raise ApiError("prompt must be a string or a non-empty list of token ids", "prompt")
    return ids


def _token_ids(value: Any, name: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                              for t in value):
        raise ApiError(f"{name} must be a list of non-negative integer token ids (got {_show(value)})", name)
    return value


def _generation(body: dict[str, Any], prompt: str | list[int], prompt_field: str,
                max_tokens: int | None) -> GenerationRequest:
    if _integer(body, "n", 1, 1) != 1:
        raise ApiError("n must be 1: send one request per completion", "n")
    if body.get("stop") not in (None, "", []):
        raise ApiError("stop strings are not supported (the engine stops on token ids): use stop_token_ids", "stop")
    stream = _boolean(body, "stream")
    options = body.get("stream_options")
    if options is not None and (not stream or not isinstance(options, dict) or set(options) - {"include_usage"}):
        raise ApiError("stream_options must be {include_usage: bool}, and only with stream: true", "stream_options")
    include_usage = _boolean(options or {}, "include_usage", "stream_options.include_usage")
    sampling = {
        "temperature": _temperature(body),
        "top_p": _top_p(body),
        "top_k": _integer(body, "top_k", 0, 0),  # extension; 0 disables it
        "seed": _integer(body, "seed", None, 0, maximum=SEED_MAX),
        "stop_token_ids": tuple(_token_ids(body.get("stop_token_ids") or [], "stop_token_ids")),
        "ignore_eos": _boolean(body, "ignore_eos"),
    }
    return GenerationRequest(prompt, prompt_field, max_tokens, sampling, stream, include_usage)


def _integer(body: dict[str, Any], name: str, default: int | None, minimum: int,
             maximum: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (
            maximum is not None and value > maximum):
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        what = what if maximum is None else f"an integer from {minimum} to {maximum}"
        raise ApiError(f"{name} must be {what} (got {_show(value)})", name)
    return value


def _temperature(body: dict[str, Any]) -> float:
    value = body.get("temperature")
    if value is None:
        return 1.0  # OpenAI's default
    # Not an open interval: a tiny positive temperature overflows the logits (see engine/runtime/sampler.py).
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            value == 0 or MIN_TEMPERATURE <= value <= MAX_TEMPERATURE):
        raise ApiError(f"temperature must be {TEMPERATURE_RULE} (got {_show(value)})", "temperature")
    return float(value)


def _top_p(body: dict[str, Any]) -> float:
    value = body.get("top_p")
    if value is None:
        return 1.0
    if isinstance(value, bool) or not isinstance(value, int | float) or not MIN_TOP_P <= value <= 1:
        raise ApiError(f"top_p must be {TOP_P_RULE} (got {_show(value)})", "top_p")
    return float(value)


def _boolean(body: dict[str, Any], name: str, param: str | None = None) -> bool:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise ApiError(f"{param or name} must be true or false (got {_show(value)})", param or name)
    return bool(value)


def _show(value: Any) -> str:
    text = repr(value)  # a client's mistake may be megabytes long; the message keeps its start
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True)
class Reply:
    """The OpenAI shapes of one request's answer, whole or as stream chunks, sharing one id and timestamp."""

    chat: bool
    model: str
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))

    def _head(self, suffix: str = "") -> dict[str, Any]:
        kind = ("chat.completion" if self.chat else "text_completion") + suffix
        return {"id": ("chatcmpl-" if self.chat else "cmpl-") + self.id, "object": kind, "created": self.created,
                "model": self.model}

    def whole(self, text: str, token_ids: list[int], finish_reason: str | None, prompt_tokens: int) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}}
        else:
            choice = {"index": 0, "text": text}
        choice |= {"token_ids": token_ids, "finish_reason": finish_reason}  # token_ids: an extension
        return self._head() | {"choices": [choice], "usage": usage(prompt_tokens, len(token_ids))}

    def chunk(self, text: str, token_ids: list[int], finish_reason: str | None = None,
              role: bool = False) -> dict:
        if self.chat:
            delta = ({"role": "assistant"} if role else {}) | ({"content": text} if text or role else {})
            choice = {"index": 0, "delta": delta}
        else:
            choice = {"index": 0, "text": text}
        choice |= {"token_ids": token_ids, "finish_reason": finish_reason}
        return self._head(".chunk" if self.chat else "") | {"choices": [choice]}

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict:
        """stream_options.include_usage: one last chunk with no choices and the usage, as OpenAI sends it."""
        return self._head(".chunk" if self.chat else "") | {"choices": [],
                                                            "usage": usage(prompt_tokens, completion_tokens)}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def error_body(message: str, status: int, param: str | None = None) -> dict[str, Any]:
    kind = {404: "not_found_error"}.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param}}


class IncrementalText:
    """Turns streamed token ids into text pieces whose concatenation is the decode of them all.

    Decoding token by token is wrong twice over: a character may span tokens (its bytes decode to U+FFFD
    until the last arrives), and tokenizers that strip a leading space change a token's text by what
    precedes it. So each step decodes a short window and emits only what the window added once it is
    whole (vLLM's prefix/read offsets).
    """

    def __init__(self, decode: Callable[[list[int]], str]):
        self._decode = decode
        self._ids: list[int] = []
        self._prefix = 0  # start of the window decoded for context
        self._read = 0  # tokens whose text has been emitted

    def push(self, token_ids: list[int]) -> str:
        self._ids.extend(token_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """What is still held back at the end of generation, even an incomplete character."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        if self._read == len(self._ids):
            return ""
        before = self._decode(self._ids[self._prefix:self._read])
        text = self._decode(self._ids[self._prefix:])
        if len(text) <= len(before) or (text.endswith("\ufffd") and not final):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(before):]
