"""The running frontier (/api/v1/frontier/, console/api/frontier.py) over crafted measurements, the engine
unreachable: the incumbent falls back to the newest measured layout (else the rig's) and says so; the timing is fitted
across the measured layouts with intervals; measured cuts carry what was measured; the noise floor is measured once
one layout has enough repeats."""

from __future__ import annotations

import pytest

from contracts.layout import ServingShape
from solvers.capacity import CutPricer
from solvers.census import load_census
from solvers.rig import load_rig
from tests.support.calibration import SHAPE, stages

pytestmark = pytest.mark.django_db


def test_with_nothing_measured_and_no_engine_it_is_the_rigs_frontier(get, viewer, dead_engine):
    body = get("/api/v1/frontier/", user=viewer)
    assert (body["incumbent"]["cut"], body["incumbent_source"]) == ([7, 5, 4], "rig")
    assert body["timing"]["source"] == "rig" and body["timing"]["samples"] == 0
    assert (body["noise_floor"], body["noise_floor_source"]) == (0.141, "rig")
    assert any("cannot be reached" in note or "engine unreachable" in note for note in body["notes"])
    assert all(point["x_pipelined_interval"] is None and "measured" not in point for point in body["points"])


def test_measured_layouts_time_the_frontier_and_show_where_they_were_measured(get, viewer, dead_engine, seed):
    repeats = [[14.0, 12.5, 12.0], [14.3, 12.4, 12.1], [13.8, 12.6, 11.9], [14.1, 12.5, 12.2], [14.0, 12.3, 12.0]]
    for ms in repeats:  # five repeats of one layout: enough to measure the noise floor
        seed([7, 5, 4], ms)
    seed([8, 5, 3], stages([8, 5, 3]), pool=8000)
    seed([8, 4, 4], [18.8, 10.5, 10.4], pool=9120)
    body = get("/api/v1/frontier/", user=viewer)
    assert (body["incumbent"]["cut"], body["incumbent_source"]) == ([8, 4, 4], "last_measured")
    assert body["timing"]["source"] == "measured" and body["timing"]["samples"] == 7
    assert [rank["identified"] for rank in body["timing"]["ranks"]] == [True, True, True]
    assert body["noise_floor_source"] == "measured" and body["timing"]["noise_floor_samples"] == 5
    assert 0 < body["noise_floor"] < 0.1
    incumbent = body["incumbent"]
    assert incumbent["provenance"] == "measured"
    assert incumbent["measured"] == {"stage_ms": [18.8, 10.5, 10.4], "pool_tokens": 9120, "samples": 1}
    low, high = incumbent["x_pipelined_interval"]
    assert low <= 1.0 and (high is None or high >= 1.0)
    fitted = body["timing"]["ranks"]
    stage = [fitted[i]["ms_per_layer"] * layers + fitted[i]["fixed_ms"] for i, layers in enumerate([8, 4, 4])]
    assert stage.index(max(stage)) == 0  # the fit puts the slowest stage where it was measured: rank 0
    for point in body["points"]:
        assert (point["provenance"] == "measured") == ("measured" in point)
        low, high = point["x_pipelined_interval"]
        assert low <= point["x_pipelined"] + 1e-6 and (high is None or high >= point["x_pipelined"] - 1e-6)
    points = {tuple(point["cut"]): point for point in body["points"]}
    assert points[(7, 5, 4)]["measured"] == {"stage_ms": [14.0, 12.5, 12.0], "pool_tokens": 9136, "samples": 5}
    assert points[(8, 5, 3)]["measured"] == {"stage_ms": stages([8, 5, 3]), "pool_tokens": 8000, "samples": 1}


def test_the_frontier_prices_the_running_shape(get, viewer, dead_engine, seed):
    smaller = {**SHAPE, "max_num_seqs": 4}
    seed([7, 5, 4], stages([7, 5, 4]), shape=smaller, fingerprint="fp-small")
    body = get("/api/v1/frontier/", user=viewer)
    expected = CutPricer(load_census("demo-hybrid-16"), load_rig("cpu-demo"), ServingShape(**smaller)).price(
        (7, 5, 4)).pool_tokens
    default = CutPricer(load_census("demo-hybrid-16"), load_rig("cpu-demo")).price((7, 5, 4)).pool_tokens
    assert body["shape"] == smaller and body["incumbent"]["pool_tokens"] == expected != default


def test_measurements_of_another_model_or_rig_are_not_used(get, viewer, dead_engine, seed):
    seed([8, 4, 4], stages([8, 4, 4]), model="another-model", fingerprint="fp-other")
    seed([7, 5, 4], stages([7, 5, 4]))  # the newest, so the running model is demo-checkpoint
    seed([2, 2, 2], [1.0, 1.0, 1.0], fingerprint="fp-short")  # not a cut of the 16-layer model
    seed([8, 4, 4], stages([8, 4, 4]), rig="reference", fingerprint="fp-ref")
    body = get("/api/v1/frontier/", user=viewer)
    assert (body["incumbent"]["cut"], body["engine"]["model"]) == ([7, 5, 4], "demo-checkpoint")
    assert body["timing"]["samples"] == 1  # only 7,5,4: the 2,2,2 is left out with a note
    assert any("left out: their cuts are not cuts of demo-hybrid-16" in note for note in body["notes"])


def test_only_the_newest_measurements_of_each_layout_are_used(get, viewer, dead_engine, seed, monkeypatch):
    from console.calibration import running

    monkeypatch.setattr(running, "PER_LAYOUT", 2)
    seed([8, 4, 4], stages([8, 4, 4]))
    for ms in ([99.0, 99.0, 99.0], [14.0, 12.5, 12.0], [14.0, 12.5, 12.0]):  # the oldest falls out
        seed([7, 5, 4], ms)
    body = get("/api/v1/frontier/", user=viewer)
    assert body["timing"]["samples"] == 3 and body["incumbent"]["measured"]["stage_ms"] == [14.0, 12.5, 12.0]
