"""The engine's OpenAI dialect through the official `openai` client, against the run's shared demo engine (three CPU
ranks): stop strings, logprobs, n choices, penalties, models.retrieve, and the refusals as BadRequestError.

Every request here only reads (generates), so the shared engine serves them whatever layout it has. Expected values
come from outside the service: the checkpoint's tokenizer, and the model's own logits (engine.loader's model run
step by step by tests.support.engine_checkpoints.TinyRunner), on which each option's definition is computed by hand.
The chat default cap is tested on an in-process app (its cap set low), since the shared engine keeps the default.
"""

from __future__ import annotations

import math
import time

import openai
import pytest
import torch
from starlette.testclient import TestClient
from tokenizers import Tokenizer

from engine.loader import load_model
from engine.serve.access import Credentials
from engine.serve.http import build_app
from tests.support.engine_checkpoints import TinyRunner
from tests.support.faults import wait_until
from tests.support.metrics import scrape

PROMPT = [5, 17, 300, 9, 44, 120]  # token ids: the prompt is exactly these, whatever the tokenizer
TEXT_PROMPT = "The operator asks which rank binds the pool"
GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def client(engine) -> openai.OpenAI:
    deadline = time.monotonic() + 120  # an operation another test started may still be moving the layout
    while engine.state()["phase"] != "serving":
        assert time.monotonic() < deadline, "the shared engine is not serving"
        time.sleep(0.05)
    with openai.OpenAI(base_url=f"{engine.url}/v1", api_key=engine.api_key or "unused", max_retries=0) as client:
        yield client


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id


@pytest.fixture(scope="module")
def tokenizer(demo_checkpoint) -> Tokenizer:
    return Tokenizer.from_file(str(demo_checkpoint / "tokenizer.json"))


@pytest.fixture(scope="module")
def logits_of(demo_checkpoint):
    """The model's next-token logits after each of prompt + tokens[:-1] (one row per generated token)."""
    model = load_model(demo_checkpoint)

    def run(prompt: list[int], tokens: list[int]) -> torch.Tensor:
        logits = TinyRunner(model).step({"a": prompt + tokens[:-1]}, all_logits=True)
        return logits[len(prompt) - 1:].float()

    return run


def _complete(client, model, **fields):
    return client.completions.create(model=model, prompt=PROMPT, **GREEDY | fields)


def test_models_retrieve_answers_the_served_model_and_404_otherwise(client, model, engine):
    assert client.models.retrieve(model).id == model
    with pytest.raises(openai.NotFoundError) as refused:
        client.models.retrieve("gpt-4")
    assert refused.value.body["type"] == "not_found_error" and "gpt-4" in refused.value.body["message"]


def _a_stop_across_tokens(tokenizer, token_ids: list[int]) -> tuple[str, int]:
    """A stop string made of a token's last characters and the next token's first, that first occurs there: (the
    string, where it starts in the text)."""
    text = tokenizer.decode(token_ids)
    for i in range(1, len(token_ids) - 1):
        before, after = tokenizer.decode(token_ids[:i]), tokenizer.decode(token_ids[:i + 1])
        if not text.startswith(after) or len(after) - len(before) < 1 or len(before) < 2:
            continue
        stop = before[-2:] + after[len(before)]
        if text.find(stop) == len(before) - 2:
            return stop, len(before) - 2
    raise AssertionError(f"no stop string spans a token boundary in {text!r}")


def test_a_stop_string_across_tokens_ends_the_text_before_it(client, model, tokenizer, engine):
    whole = _complete(client, model, max_tokens=24).choices[0]
    stop, at = _a_stop_across_tokens(tokenizer, whole.model_extra["token_ids"])
    before = scrape(engine.client)
    stopped = _complete(client, model, max_tokens=24, stop=["never-generated", stop]).choices[0]
    assert stopped.text == whole.text[:at] and stop not in stopped.text
    assert stopped.finish_reason == "stop"
    # It counts the tokens up to the one that completed the stop string, and no more.
    tokens = stopped.model_extra["token_ids"]
    assert tokens == whole.model_extra["token_ids"][:len(tokens)]
    assert stop in tokenizer.decode(tokens) and stop not in tokenizer.decode(tokens[:-1])
    # The engine ends it as stopped, not as a client that went away (its metrics and latency count it).
    model_label = ("model_name", model)

    def ended(reason: str, samples) -> float:
        return samples[("seam_request_success_total", (("finished_reason", reason), model_label))]

    wait_until(lambda: ended("stop", scrape(engine.client)) > ended("stop", before), timeout=30,
               what="the stopped request's end")
    after = scrape(engine.client)
    assert ended("stop", after) == ended("stop", before) + 1
    assert ended("cancelled", after) == ended("cancelled", before)


def test_a_streamed_stop_string_is_never_sent(client, model, tokenizer):
    messages = [{"role": "user", "content": "Which rank binds the pool?"}]
    whole = client.chat.completions.create(model=model, messages=messages, max_tokens=24, **GREEDY).choices[0]
    stop, at = _a_stop_across_tokens(tokenizer, whole.model_extra["token_ids"])
    chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=24, stop=stop,
                                                 stream=True, **GREEDY))
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
    assert text == whole.message.content[:at]
    assert [c.choices[0].finish_reason for c in chunks][-1] == "stop"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])


def test_completion_logprobs_equal_the_models_log_softmax(client, model, logits_of):
    choice = _complete(client, model, max_tokens=6, logprobs=3).choices[0]
    tokens, logprobs = choice.model_extra["token_ids"], choice.logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == len(tokens) == 6
    expected = torch.log_softmax(logits_of(PROMPT, tokens), dim=-1)
    for n, token in enumerate(tokens):
        assert logprobs.token_logprobs[n] == pytest.approx(expected[n, token].item(), abs=1e-4)
        top = expected[n].topk(3)
        assert sorted(logprobs.top_logprobs[n].values(), reverse=True)[:3] == pytest.approx(top.values.tolist(),
                                                                                              abs=1e-4)
        assert len(logprobs.top_logprobs[n]) <= 4  # three alternatives and the chosen token
    assert "".join(logprobs.tokens) == choice.text
    assert logprobs.text_offset == [len("".join(logprobs.tokens[:n])) for n in range(6)]


def test_chat_logprobs_have_the_chat_shape_streamed_or_not(client, model):
    messages = [{"role": "user", "content": "Which rank binds the pool?"}]
    fields = dict(model=model, messages=messages, max_tokens=5, logprobs=True, top_logprobs=4, **GREEDY)
    whole = client.chat.completions.create(**fields).choices[0]
    content = whole.logprobs.content
    assert len(content) == 5 and "".join(entry.token for entry in content) == whole.message.content
    for entry in content:
        assert entry.bytes == list(entry.token.encode()) and len(entry.top_logprobs) == 4
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)  # greedy: the likeliest was chosen
        assert sum(math.exp(top.logprob) for top in entry.top_logprobs) <= 1 + 1e-6
    streamed = [entry for chunk in client.chat.completions.create(stream=True, **fields)
                for choice in chunk.choices if choice.logprobs for entry in choice.logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]


def test_streamed_completion_logprobs_join_to_the_whole_ones(client, model):
    whole = _complete(client, model, max_tokens=5, logprobs=2).choices[0].logprobs
    chunks = [c.choices[0].logprobs for c in _complete(client, model, max_tokens=5, logprobs=2, stream=True)
              if c.choices and c.choices[0].logprobs]
    assert [t for chunk in chunks for t in chunk.tokens] == whole.tokens
    assert [lp for chunk in chunks for lp in chunk.token_logprobs] == whole.token_logprobs
    assert [o for chunk in chunks for o in chunk.text_offset] == whole.text_offset


def test_sampled_logprobs_are_of_the_tempered_distribution(client, model, logits_of):
    choice = _complete(client, model, max_tokens=4, logprobs=0, temperature=0.7, seed=3).choices[0]
    tokens = choice.model_extra["token_ids"]
    expected = torch.log_softmax(logits_of(PROMPT, tokens) / 0.7, dim=-1)
    assert choice.logprobs.token_logprobs == pytest.approx([expected[n, t].item() for n, t in enumerate(tokens)],
                                                           abs=1e-4)


def test_n_choices_with_a_seed_are_reproducible_and_each_its_own(client, model):
    fields = dict(max_tokens=8, temperature=1.0, seed=42, n=2)
    first, again = _complete(client, model, **fields), _complete(client, model, **fields)
    assert [c.index for c in first.choices] == [0, 1]
    assert [c.text for c in first.choices] == [c.text for c in again.choices]
    assert first.choices[0].text != first.choices[1].text
    assert first.usage.completion_tokens == 16 and first.usage.prompt_tokens == len(PROMPT)
    # Choice i is seeded seed + i: the same as a one-choice request with that seed.
    alone = [_complete(client, model, max_tokens=8, temperature=1.0, seed=seed).choices[0].text for seed in (42, 43)]
    assert alone == [c.text for c in first.choices]


def test_streamed_choices_each_end_with_their_own_finish_reason(client, model):
    chunks = list(client.completions.create(model=model, prompt=PROMPT, max_tokens=4, temperature=1.0, seed=1, n=2,
                                            stream=True, stream_options={"include_usage": True}))
    ends = {c.choices[0].index: c.choices[0].finish_reason for c in chunks if c.choices and
            c.choices[0].finish_reason}
    assert ends == {0: "length", 1: "length"} and chunks[-1].usage.completion_tokens == 8


def test_a_presence_penalty_steers_greedy_decoding_as_defined(client, model, logits_of):
    plain = _complete(client, model, max_tokens=12).choices[0].model_extra["token_ids"]
    assert len(set(plain)) < len(plain), "the demo model's greedy text repeats a token: the penalty has work"
    penalized = _complete(client, model, max_tokens=12, presence_penalty=2.0).choices[0].model_extra["token_ids"]
    assert penalized != plain
    # Each token is the argmax of the model's logits less 2 for every token already generated (OpenAI's definition).
    logits = logits_of(PROMPT, penalized)
    for n, token in enumerate(penalized):
        seen = torch.zeros(logits.shape[-1])
        seen[list(set(penalized[:n]))] = 1.0
        assert token == int(torch.argmax(logits[n] - 2.0 * seen))


def test_a_repetition_penalty_counts_the_prompt_too(client, model, logits_of):
    tokens = _complete(client, model, max_tokens=8, extra_body={"ignore_eos": True, "repetition_penalty": 1.8}
                       ).choices[0].model_extra["token_ids"]
    logits = logits_of(PROMPT, tokens)
    for n, token in enumerate(tokens):
        row = logits[n].clone()
        seen = list(set(PROMPT + tokens[:n]))
        row[seen] = torch.where(row[seen] > 0, row[seen] / 1.8, row[seen] * 1.8)
        assert token == int(torch.argmax(row))


@pytest.mark.parametrize("fields, param", [
    ({"temperature": 2.5}, "temperature"), ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"), ({"n": 0}, "n"), ({"logprobs": 6}, "logprobs"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"), ({"extra_body": {"repetition_penalty": 0}}, "repetition_penalty"),
])
def test_out_of_range_completion_options_are_400(client, model, fields, param):
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=model, prompt=PROMPT, max_tokens=2, **fields)
    assert refused.value.status_code == 400 and refused.value.param == param
    assert refused.value.body["type"] == "invalid_request_error" and param in refused.value.body["message"]


@pytest.mark.parametrize("fields, param", [
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"), ({"top_logprobs": 2}, "top_logprobs"),
    ({"n": 129}, "n"),
])
def test_out_of_range_chat_options_are_400(client, model, fields, param):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                       **fields)
    assert refused.value.param == param and param in refused.value.body["message"]


def test_a_chat_without_max_tokens_stops_at_the_default_cap(engine_driver):
    app = build_app(engine_driver, Credentials(control_token="t", approval_key="k"), chat_max_tokens=5)
    with TestClient(app, base_url="http://localhost") as http, openai.OpenAI(
            base_url="http://localhost/v1", api_key="unused", http_client=http, max_retries=0) as client:
        reply = client.chat.completions.create(model=engine_driver.model_name, messages=[
            {"role": "user", "content": TEXT_PROMPT}], temperature=0, extra_body={"ignore_eos": True})
    assert reply.usage.completion_tokens == 5 and reply.choices[0].finish_reason == "length"
