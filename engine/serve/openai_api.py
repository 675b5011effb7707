"""The OpenAI dialect of the engine's HTTP service: strict request parsing and the response shapes.

Parsing refuses anything it would otherwise have to guess at, naming the field: wrong types, values out of
range, features the engine does not have (echo, best_of, suffix, logit_bias) and arguments it does not know,
as OpenAI itself does. Features it lacks are still accepted at the value that changes nothing, because
clients often send them explicitly (`"echo": false`, `"logit_bias": {}`).

What the sampler does (penalties, logprobs) is engine/runtime/sampler.py's; what is text is done here: stop strings
are matched on the decoded text, across token boundaries (a choice's text is cut before the first, and text that could
begin one is held back until decided), and n choices are n requests to the engine, seeded seed, seed + 1, ...
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.control.protocol import RequestHandle
from engine.errors import EngineError
from engine.runtime.sampler import (
    MAX_LOGPROBS,
    MAX_REPETITION_PENALTY,
    MAX_TEMPERATURE,
    MIN_TEMPERATURE,
    MIN_TOP_P,
    PENALTY_RANGE,
    SEED_MAX,
    TEMPERATURE_RULE,
    TOP_P_RULE,
    SamplingParams,
    TokenLogprobs,
)

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
_COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids", "ignore_eos",
           "n", "stream", "stream_options", "user", "logprobs", "presence_penalty", "frequency_penalty",
           "repetition_penalty", "logit_bias"}
COMPLETION_FIELDS = _COMMON | {"prompt", "echo", "best_of", "suffix"}
CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens", "top_logprobs"}
# Features the engine lacks, accepted only at the values that leave a request unchanged.
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "echo": (None, False), "best_of": (None, 1), "suffix": (None, ""), "logit_bias": (None, {}),
}
MAX_STOPS = 4  # OpenAI's limit on stop strings
MAX_N = 128  # OpenAI's limit on choices
MAX_COMPLETION_LOGPROBS = 5  # the legacy completions API's limit; chat's top_logprobs goes to MAX_LOGPROBS
# A logprob JSON cannot spell: a token the top-k/top-p cut removed has -inf, which OpenAI writes as -9999.
UNLIKELY_LOGPROB = -9999.0
# A chat without max_tokens generates at most this many tokens (or what the context leaves, if less), so a client
# that forgets the field does not hold a sequence until the context is full. Set by this environment variable.
CHAT_MAX_TOKENS_ENV = "SEAM_CHAT_MAX_TOKENS"
DEFAULT_CHAT_MAX_TOKENS = 1024


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
    max_tokens: int | None  # None: the chat default (`params`)
    sampling: dict[str, Any]
    stream: bool
    include_usage: bool
    n: int = 1
    stop: tuple[str, ...] = ()

    def check_prompt_chars(self, limit: int | None, max_model_len: int) -> None:
        """ApiError when a text prompt is longer than `limit` characters (Driver.max_prompt_chars): no such text fits
        max_model_len tokens, and tokenizing megabytes to find that out would take seconds."""
        if isinstance(self.prompt, str) and limit is not None and len(self.prompt) > limit:
            raise ApiError(f"{self.prompt_field}: {len(self.prompt):,} characters of prompt text, more than the "
                           f"{limit:,} that can fit this engine's max_model_len of {max_model_len:,} tokens; shorten "
                           "it", self.prompt_field)

    def params(self, prompt_tokens: int, max_model_len: int, chat_max_tokens: int) -> list[SamplingParams]:
        """One SamplingParams per choice, choice i seeded seed + i. Without max_tokens: chat_max_tokens, or what the
        context leaves if that is less."""
        max_tokens = self.max_tokens or max(1, min(chat_max_tokens, max_model_len - prompt_tokens))
        seed = self.sampling["seed"]
        return [SamplingParams(max_tokens=max_tokens, **self.sampling | {
            "seed": None if seed is None else (seed + i) % (SEED_MAX + 1)}) for i in range(self.n)]


def read_chat_max_tokens(environ: Mapping[str, str] = os.environ) -> int:
    """The chat default cap from SEAM_CHAT_MAX_TOKENS (default 1024); EngineError naming the variable when
    malformed."""
    text = environ.get(CHAT_MAX_TOKENS_ENV, "").strip()
    if not text:
        return DEFAULT_CHAT_MAX_TOKENS
    if not text.isdigit() or int(text) < 1:
        raise EngineError(f"{CHAT_MAX_TOKENS_ENV}={text!r}: expected a positive number of tokens "
                          f"(default {DEFAULT_CHAT_MAX_TOKENS})")
    return int(text)


def parse_completion(body: dict[str, Any], model_name: str) -> GenerationRequest:
    _check_fields(body, COMPLETION_FIELDS, model_name)
    logprobs = _integer(body, "logprobs", None, 0, maximum=MAX_COMPLETION_LOGPROBS)
    return _generation(body, _prompt(body.get("prompt")), "prompt", max_tokens=_integer(body, "max_tokens", 16, 1),
                       logprobs=logprobs)


def parse_chat(body: dict[str, Any], model_name: str) -> GenerationRequest:
    _check_fields(body, CHAT_FIELDS, model_name)
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    top = _integer(body, "top_logprobs", None, 0, maximum=MAX_LOGPROBS)
    if top and not _boolean(body, "logprobs"):
        raise ApiError("top_logprobs needs logprobs: true", "top_logprobs")
    logprobs = (top or 0) if _boolean(body, "logprobs") else None
    return _generation(body, render_chat(body.get("messages")), "messages", max_tokens=_integer(body, name, None, 1),
                       logprobs=logprobs)


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


def _generation(body: dict[str, Any], prompt: str | list[int], prompt_field: str, max_tokens: int | None,
                logprobs: int | None) -> GenerationRequest:
    n = _integer(body, "n", 1, 1, maximum=MAX_N)
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
        "presence_penalty": _number(body, "presence_penalty", 0.0, *PENALTY_RANGE),
        "frequency_penalty": _number(body, "frequency_penalty", 0.0, *PENALTY_RANGE),
        "repetition_penalty": _repetition_penalty(body),  # vLLM's extension
        "logprobs": logprobs,
    }
    return GenerationRequest(prompt, prompt_field, max_tokens, sampling, stream, include_usage, n, _stops(body))


def _stops(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop in (None, ""):
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > MAX_STOPS or not all(isinstance(s, str) and s for s in stops):
        raise ApiError(f"stop must be a string or a list of at most {MAX_STOPS} non-empty strings "
                       f"(got {_show(stop)})", "stop")
    return tuple(stops)


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ApiError(f"{name} must be a number from {low:g} to {high:g} (got {_show(value)})", name)
    return float(value)


def _repetition_penalty(body: dict[str, Any]) -> float:
    value = body.get("repetition_penalty")
    if value is None:
        return 1.0
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= MAX_REPETITION_PENALTY:
        raise ApiError(f"repetition_penalty must be a number above 0 and at most {MAX_REPETITION_PENALTY:g}; 1 "
                       f"disables it (got {_show(value)})", "repetition_penalty")
    return float(value)


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


class Choice:
    """One choice of a reply as the client sees it, fed its engine request's tokens as they come.

    The tokens become text piece by piece (IncrementalText); the text is cut before the first stop string, and text
    that could be the start of one is held back until the next tokens decide. The tokens the choice counts end with
    the one that completed a stop string: those the engine emits after it are ignored (the caller cancels it).
    """

    def __init__(self, index: int, handle: RequestHandle, decode: Callable[[list[int]], str], stops: tuple[str, ...]):
        self.index, self.handle, self.stops = index, handle, stops
        self._text = IncrementalText(decode)
        self._held = ""  # decoded, not yet sent: it may be the start of a stop string
        self.stopped = False
        self.token_ids: list[int] = []
        self.offsets: list[int] = []  # where each token's text starts in the choice's text (text_offset)
        self._chars = 0  # characters of text sent so far

    def push(self, token_ids: list[int]) -> str:
        """The text these tokens make safe to send; they are appended to `token_ids` up to a stop string's end."""
        pieces = []
        for token in token_ids:
            if self.stopped:
                break
            self.token_ids.append(token)
            self.offsets.append(self._chars + len(self._held))  # held text precedes this token's too
            pieces.append(self._cut(self._text.push([token]), final=False))
        return "".join(pieces)

    def flush(self) -> str:
        """At the end of generation: the text still held back (an incomplete character included)."""
        return "" if self.stopped else self._cut(self._text.flush(), final=True)

    @property
    def finish_reason(self) -> str | None:
        return "stop" if self.stopped else self.handle.finish_reason

    def _cut(self, text: str, final: bool) -> str:
        buffer = self._held + text
        found = [at for stop in self.stops if (at := buffer.find(stop)) >= 0]
        if found:
            self.stopped, self._held = True, ""
            return self._sent(buffer[:min(found)])
        keep = 0 if final else _stop_prefix(buffer, self.stops)
        self._held = buffer[len(buffer) - keep:] if keep else ""
        return self._sent(buffer[:len(buffer) - keep])

    def _sent(self, text: str) -> str:
        self._chars += len(text)
        return text


def _stop_prefix(text: str, stops: tuple[str, ...]) -> int:
    """The length of the longest end of `text` that begins a stop string (0: none does)."""
    return max((size for stop in stops for size in range(min(len(stop) - 1, len(text)), 0, -1)
                if text.endswith(stop[:size])), default=0)


@dataclass(frozen=True)
class Reply:
    """The OpenAI shapes of one request's answer, whole or as stream chunks, sharing one id and timestamp.
    `logprobs`: the request asked for them (chat's shape or the legacy completions one, by `chat`)."""

    chat: bool
    model: str
    decode: Callable[[list[int]], str]
    logprobs: bool = False
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))

    def _head(self, suffix: str = "") -> dict[str, Any]:
        kind = ("chat.completion" if self.chat else "text_completion") + suffix
        return {"id": ("chatcmpl-" if self.chat else "cmpl-") + self.id, "object": kind, "created": self.created,
                "model": self.model}

    def whole(self, choices: list[Choice], texts: list[str], prompt_tokens: int) -> dict:
        bodies = []
        for choice, text in zip(choices, texts, strict=True):
            body = {"index": choice.index} | ({"message": {"role": "assistant", "content": text}} if self.chat
                                              else {"text": text})
            body |= self._logprobs(choice, 0, len(choice.token_ids))
            bodies.append(body | {"token_ids": choice.token_ids, "finish_reason": choice.finish_reason})
        completion_tokens = sum(len(choice.token_ids) for choice in choices)
        return self._head() | {"choices": bodies, "usage": usage(prompt_tokens, completion_tokens)}

    def chunk(self, choice: Choice, text: str, start: int, finish_reason: str | None = None,
              role: bool = False) -> dict:
        """A chunk of `choice`: its `text` and its tokens from `start` on (token_ids: an extension)."""
        if self.chat:
            delta = ({"role": "assistant"} if role else {}) | ({"content": text} if text or role else {})
            body = {"index": choice.index, "delta": delta}
        else:
            body = {"index": choice.index, "text": text}
        body |= self._logprobs(choice, start, len(choice.token_ids)) if not role else {}
        body |= {"token_ids": choice.token_ids[start:], "finish_reason": finish_reason}
        return self._head(".chunk" if self.chat else "") | {"choices": [body]}

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict:
        """stream_options.include_usage: one last chunk with no choices and the usage, as OpenAI sends it."""
        return self._head(".chunk" if self.chat else "") | {"choices": [],
                                                            "usage": usage(prompt_tokens, completion_tokens)}

    def _logprobs(self, choice: Choice, start: int, stop: int) -> dict[str, Any]:
        """{"logprobs": ...} for tokens [start, stop) of `choice` when asked, else nothing."""
        if not self.logprobs:
            return {}
        entries: list[TokenLogprobs] = choice.handle.logprobs[start:stop]
        tokens = [self.decode([entry.token_id]) for entry in entries]
        if self.chat:
            content = [self._chat_token(token, entry.logprob) | {
                "top_logprobs": [self._chat_token(self.decode([top]), logprob) for top, logprob in entry.top]}
                for token, entry in zip(tokens, entries, strict=True)]
            return {"logprobs": {"content": content, "refusal": None}}
        # The legacy shape: each token's alternatives by text, with the chosen token's own always among them.
        top = [{self.decode([other]): _finite(logprob) for other, logprob in entry.top}
               | {token: _finite(entry.logprob)} for token, entry in zip(tokens, entries, strict=True)]
        return {"logprobs": {"tokens": tokens, "token_logprobs": [_finite(entry.logprob) for entry in entries],
                             "top_logprobs": top, "text_offset": choice.offsets[start:stop]}}

    @staticmethod
    def _chat_token(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": _finite(logprob), "bytes": list(token.encode())}


def _finite(logprob: float) -> float:
    return max(logprob, UNLIKELY_LOGPROB)


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
