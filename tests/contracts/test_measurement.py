"""The layout measurement contract (contracts/measurement.py): what the engine sends parses back exactly, and a wrong
field is refused by name."""

from __future__ import annotations

import copy

import pytest

from contracts.errors import ContractError
from contracts.layout import Cut
from contracts.measurement import Latency, LayoutMeasurement, PoolFigures, StageStats


def _measurement() -> LayoutMeasurement:
    return LayoutMeasurement(
        model="demo", rig="cpu-demo", fingerprint="abc123", cut=Cut((7, 5, 4)), shape={"max_model_len": 1024},
        decode=StageStats(12, 3.0, (18.8, 10.5, 10.4), (0.5, 0.2, 0.1)), prefill=StageStats(0, None, None, None),
        decode_tok_s=42.5, prefill_tok_s=0.0, pool=PoolFigures(17056, 17056, 17040),
        latency=Latency(4, 120.0, 31.5))


def test_round_trip_is_exact():
    sent = _measurement()
    assert LayoutMeasurement.from_dict(sent.to_dict()) == sent


def test_stats_by_kind():
    measurement = _measurement()
    assert measurement.stats("decode").median_ms == (18.8, 10.5, 10.4)
    assert measurement.stats("prefill").steps == 0
    with pytest.raises(ContractError, match="step kind 'verify'"):
        measurement.stats("verify")


@pytest.mark.parametrize(("path", "value", "message"), [
    (("cut",), [7, 0, 4], r"measurement\.cut"),
    (("model",), "", r"measurement\.model"),
    (("decode", "median_ms"), [1.0, 2.0], r"measurement\.decode: median_ms and spread_ms need one entry per rank"),
    (("decode",), {"steps": 1, "median_tokens": 1, "median_ms": [1.0, 2.0], "spread_ms": [0.0, 0.0]},
     r"measurement\.decode\.median_ms: 2 ranks, the cut has 3"),
    (("decode", "spread_ms"), None, r"measurement\.decode: median_ms and spread_ms"),
    (("decode", "steps"), -1, r"measurement\.decode\.steps"),
    (("pool", "real"), 1.5, r"measurement\.pool\.real"),
    (("latency", "ttft_ms"), float("nan"), r"measurement\.latency\.ttft_ms"),
    (("decode_tok_s",), "fast", r"measurement\.decode_tok_s"),
])
def test_a_wrong_field_is_named(path, value, message):
    data = copy.deepcopy(_measurement().to_dict())
    holder = data
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = value
    with pytest.raises(ContractError, match=message):
        LayoutMeasurement.from_dict(data)


def test_a_missing_field_is_named():
    data = _measurement().to_dict()
    del data["latency"]
    with pytest.raises(ContractError, match=r"measurement\.latency: missing"):
        LayoutMeasurement.from_dict(data)


def test_not_an_object():
    with pytest.raises(ContractError, match="expected an object"):
        LayoutMeasurement.from_dict(["not", "a", "measurement"])
