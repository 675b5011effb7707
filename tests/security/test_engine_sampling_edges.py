"""Sampling parameters at their edges are 400s naming the field, never 500s (issue 30, item 8), against the real
engine service.

`top_p: 5e-324` was a 500: the sampler compares top_p with float32 probabilities, where it rounds to 0, drops every
token, and multinomial refuses the NaN left (engine/runtime/sampler.py, MIN_TOP_P). The sweep sends every sampling
field the
values that break numeric code (subnormals, the largest double, integers past 64 bits, NaN and Infinity) and
accepts only a 200 or a 400 naming the field.
"""

from __future__ import annotations

import pytest
import torch

from engine.errors import EngineRequestError
from engine.runtime.sampler import MIN_TOP_P, Sampler, SamplingParams
from engine.runtime.sequence import Sequence

EDGES = ["5e-324", "1e-320", "2.2250738585072014e-308", "1e-300", "1e-40", "1e-38", "1e308", "-0.0",
         "1.7976931348623157e308", "18446744073709551616", "9223372036854775808", "-9223372036854775809",
         "100000000000000000000000000000", "NaN", "Infinity", "-Infinity"]
FIELDS = ["temperature", "top_p", "top_k", "seed", "max_tokens", "n"]


def _post(engine, raw: str):
    return engine.client.post("/v1/completions", content=raw, headers={"content-type": "application/json"})


@pytest.mark.parametrize("top_p", ["5e-324", "1e-320", "2.2250738585072014e-308", "1e-300", "1e-40"])
def test_a_top_p_below_float32s_smallest_normal_is_400_naming_top_p(engine, top_p):
    """Pins MIN_TOP_P (engine/runtime/sampler.py, issue 30 item 8): without it these reach the sampler, and the reply
    is a 500
    'probability tensor contains either inf, nan or element < 0' (1e-40 survives by luck, as a float32 subnormal)."""
    reply = _post(engine, f'{{"prompt": [5, 6, 7], "max_tokens": 2, "temperature": 0.7, "top_p": {top_p}}}')
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "top_p" and f"from {MIN_TOP_P:.3g}" in error["message"]
    assert len(engine.complete([5, 6, 7], 2)) == 2


@pytest.mark.parametrize("field", FIELDS)
def test_no_sampling_edge_value_is_a_500(engine, field):
    """Every edge of every sampling field is served or refused naming the field; the engine serves on."""
    for value in EDGES:
        reply = _post(engine, f'{{"prompt": [5, 6, 7], "max_tokens": 2, "temperature": 0.7, "{field}": {value}}}')
        assert reply.status_code in (200, 400), f"{field}={value}: {reply.status_code} {reply.text}"
        if reply.status_code == 400:
            error = reply.json()["error"]
            named = error["param"] == field or (error["param"] is None and field == "max_tokens"
                                                and "max_model_len" in error["message"])
            assert named or "not a JSON number" in error["message"], f"{field}={value}: {reply.text}"
    assert len(engine.complete([5, 6, 7], 2)) == 2


def test_sampling_params_refuse_the_same_top_p_for_python_callers():
    """LLM and `engine generate` build SamplingParams directly: the same floor, one rule."""
    with pytest.raises(EngineRequestError, match="top_p"):
        SamplingParams(temperature=0.7, top_p=5e-324)
    SamplingParams(temperature=0.7, top_p=MIN_TOP_P)


def test_the_smallest_top_p_samples_the_most_likely_token():
    """At the floor top_p still keeps one token: the most likely, whatever the seed."""
    logits = torch.randn(1, 1024)
    for seed in range(5):
        params = SamplingParams(temperature=0.7, top_p=MIN_TOP_P, seed=seed)
        assert Sampler().sample(logits, [Sequence(seed, [0], params)]) == [int(logits.argmax())]
