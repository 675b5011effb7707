"""engine/serve/openai_api.py's parsing of the options the sampler and the text side act on: each choice's
SamplingParams, the chat default cap, and the operator's SEAM_CHAT_MAX_TOKENS."""

import pytest

from engine.errors import EngineError
from engine.runtime.sampler import SEED_MAX
from engine.serve.openai_api import (
    CHAT_MAX_TOKENS_ENV,
    DEFAULT_CHAT_MAX_TOKENS,
    ApiError,
    parse_chat,
    parse_completion,
    read_chat_max_tokens,
)

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def test_choice_i_is_seeded_seed_plus_i_wrapping_past_the_largest_seed():
    parsed = parse_completion({"prompt": [1], "n": 3, "seed": SEED_MAX - 1, "temperature": 1}, "m")
    assert [params.seed for params in parsed.params(1, 64, 1024)] == [SEED_MAX - 1, SEED_MAX, 0]
    unseeded = parse_completion({"prompt": [1], "n": 2}, "m").params(1, 64, 1024)
    assert [params.seed for params in unseeded] == [None, None]


def test_the_options_reach_every_choices_sampling_params():
    parsed = parse_completion({"prompt": [1], "n": 2, "presence_penalty": 0.5, "frequency_penalty": -1,
                               "repetition_penalty": 1.2, "logprobs": 3, "stop": "x"}, "m")
    assert parsed.stop == ("x",)
    for params in parsed.params(1, 64, 1024):
        assert (params.presence_penalty, params.frequency_penalty, params.repetition_penalty, params.logprobs) == (
            0.5, -1.0, 1.2, 3)


def test_a_chat_without_max_tokens_gets_the_cap_or_the_context_left():
    parsed = parse_chat(CHAT, "m")
    assert parsed.params(10, 2048, 1024)[0].max_tokens == 1024
    assert parsed.params(2000, 2048, 1024)[0].max_tokens == 48
    assert parse_chat(CHAT | {"max_tokens": 1500}, "m").params(10, 2048, 1024)[0].max_tokens == 1500


def test_chat_logprobs_take_top_logprobs_alternatives():
    assert parse_chat(CHAT | {"logprobs": True, "top_logprobs": 7}, "m").sampling["logprobs"] == 7
    assert parse_chat(CHAT | {"logprobs": True}, "m").sampling["logprobs"] == 0
    assert parse_chat(CHAT | {"logprobs": False, "top_logprobs": 0}, "m").sampling["logprobs"] is None
    with pytest.raises(ApiError, match="top_logprobs needs logprobs: true"):
        parse_chat(CHAT | {"top_logprobs": 3}, "m")


def test_the_chat_cap_is_read_from_the_environment_and_a_bad_value_refused():
    assert read_chat_max_tokens({}) == DEFAULT_CHAT_MAX_TOKENS == 1024
    assert read_chat_max_tokens({CHAT_MAX_TOKENS_ENV: "256"}) == 256
    for bad in ("0", "-5", "lots"):
        with pytest.raises(EngineError, match=CHAT_MAX_TOKENS_ENV):
            read_chat_max_tokens({CHAT_MAX_TOKENS_ENV: bad})
