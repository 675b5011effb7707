"""GET /api/v1/calibration/, /api/v1/predictions/ and /api/v1/metrics/: who may read them, bad input, the empty
state, and what they report over crafted measurements (the engine unreachable: the running layout is then the
newest measured one)."""

from __future__ import annotations

import pytest

from tests.support.calibration import end_job, executed_job, measurement, stages, state_of
from tests.support.metrics import parse_samples

pytestmark = pytest.mark.django_db

ENDPOINTS = ["/api/v1/calibration/", "/api/v1/predictions/", "/api/v1/metrics/"]


@pytest.mark.parametrize("url", ENDPOINTS)
def test_a_login_and_a_console_role_are_needed(get, make_user, dead_engine, url):
    body = get(url, expect=401)
    assert "credentials were not provided" in body["detail"]
    body = get(url, user=make_user(), expect=403)
    assert "console roles" in body["detail"]


@pytest.mark.parametrize("target", ["lots", "0", "0.00001", "-0.1", "1", "1.5", "nan", "inf", "-inf"])
def test_a_bad_target_is_400_naming_it(get, viewer, dead_engine, target):
    body = get("/api/v1/calibration/", {"target": target}, user=viewer, expect=400)
    assert body["field"] == "target" and "from 0.0001 up to (not including) 1" in body["detail"]


def test_with_nothing_measured_it_explains_rather_than_fails(get, viewer, dead_engine):
    body = get("/api/v1/calibration/", user=viewer)
    assert body["samples"] == 0 and body["unidentified"] == [0, 1, 2] and body["arms"] == []
    assert "nothing is measured yet" in body["explanation"]
    assert (body["incumbent_source"], body["noise_floor_source"], body["noise_floor"]) == ("rig", "rig", 0.141)
    predictions = get("/api/v1/predictions/", user=viewer)
    assert predictions["results"] == [] and predictions["summary"]["pool_error"]["mean"] is None
    samples = parse_samples(get("/api/v1/metrics/", user=viewer).content.decode())
    assert samples[("seam_calibration_unidentified_ranks", ())] == 3 and samples[("seam_calibration_samples", ())] == 0
    assert ("seam_prediction_pool_error_ratio", (("stat", "mean"),)) not in samples  # no job: never a made-up 0


def test_one_cut_change_identifies_the_two_ranks_it_moved(get, viewer, dead_engine, seed):
    seed([7, 5, 4], stages([7, 5, 4]))
    seed([7, 5, 4], [14.2, 12.4, 12.1])
    seed([8, 4, 4], stages([8, 4, 4]))
    body = get("/api/v1/calibration/", {"target": "0.1"}, user=viewer)
    assert (body["samples"], body["target"], body["cuts"]) == (3, 0.1, [[7, 5, 4], [8, 4, 4]])
    assert (body["incumbent"], body["incumbent_source"]) == ([8, 4, 4], "last_measured")
    assert [rank["identified"] for rank in body["ranks"]] == [True, True, False] and body["unidentified"] == [2]
    identified = body["ranks"][0]
    assert identified["ms_per_layer"] > 0 and identified["ms_per_layer_se"] is not None
    assert isinstance(identified["samples_needed"], int) and identified["sd_source"] == "repeats"
    assert body["ranks"][2]["samples_needed"] == "inf" and body["ranks"][2]["ms_per_layer_se"] is None
    [plan] = body["arms"]
    assert plan["rank"] == 2 and plan["from"] == [8, 4, 4]
    arms = {tuple(arm["cut"]): arm for arm in plan["arms"]}
    assert set(arms) == {(8, 3, 5), (8, 5, 3)}  # rank 2 takes one layer from rank 1, and gives one
    assert {arm["delta_layers"] for arm in arms.values()} == {1, -1}
    assert arms[(8, 5, 3)]["propose_url"] == "/jobs/new/?kind=cut&cut=8,5,3"
    assert all(arm["feasible"] == (not arm["reasons"]) for arm in arms.values())


def test_predictions_list_executed_jobs_newest_first_with_a_summary(get, viewer, dead_engine, seed):
    for cut in ([7, 5, 4], [8, 5, 3], [8, 4, 4]):
        seed(cut, stages(cut))
    older = end_job(executed_job([8, 4, 4], [9, 4, 3], pool=10000), state_of(measurement([9, 4, 3], None, pool=9800)))
    seed([9, 4, 3], [19.8, 10.0, 9.0])
    newer = end_job(executed_job([9, 4, 3], [8, 4, 4], pool=9136), state_of(measurement([8, 4, 4], None)))
    body = get("/api/v1/predictions/", user=viewer)
    assert body["count"] == 2 and [row["job"] for row in body["results"]] == [newer.job_id, older.job_id]
    row = body["results"][1]
    assert (row["layout_diff"], row["status"], row["comparable"]) == ("8,4,4 -> 9,4,3", "succeeded", True)
    assert row["pool"] == {"predicted": 10000, "measured": 9800, "error": -0.02}
    assert row["stage_ms"]["measured"] == [19.8, 10.0, 9.0] and row["stage_ms"]["error"] == pytest.approx(0.1)
    assert row["speedup"]["predicted"] == pytest.approx(16 / 18, abs=1e-5) and row["decode_tok_s"] == 12.5
    assert body["summary"]["pool_error"] == {"jobs": 2, "mean": 0.01, "max": 0.02, "last": 0.0}
    assert get("/api/v1/predictions/", {"limit": "1"}, user=viewer)["results"][0]["job"] == newer.job_id
    assert get("/api/v1/predictions/", {"limit": "x"}, user=viewer, expect=400)["field"] == "limit"
    samples = parse_samples(get("/api/v1/metrics/", user=viewer, HTTP_ACCEPT="text/plain").content.decode())
    assert samples[("seam_prediction_pool_error_ratio", (("stat", "max"),))] == 0.02
    assert samples[("seam_prediction_pool_error_ratio", (("stat", "last"),))] == 0
    assert samples[("seam_prediction_stage_error_ratio", (("stat", "mean"),))] == 0.1
    assert samples[("seam_calibration_samples", ())] == 4 and samples[("seam_calibration_unidentified_ranks", ())] == 0


def test_the_timing_model_is_validated_on_held_out_layouts(get, viewer, dead_engine, seed):
    """Leave-one-layout-out (issue 29, item 2): each layout predicted by a fit over the others, in the API, the
    gauges and with how many more layouts are needed until there are three."""
    seed([7, 5, 4], stages([7, 5, 4]))
    seed([8, 4, 4], stages([8, 4, 4]))
    body = get("/api/v1/calibration/", user=viewer)
    assert body["validation"]["validated"] is False and body["validation"]["layouts_needed"] == 1
    assert body["validation"]["summary"] == "not yet validated: 1 more measured layout(s) needed"
    slow = [ms * 1.2 for ms in stages([6, 6, 4])]  # 20% slower than the line through the others
    seed([6, 6, 4], slow)
    body = get("/api/v1/calibration/", user=viewer)
    validation = body["validation"]
    assert validation["validated"] is True and validation["measured_layouts"] == 3
    rows = {tuple(row["cut"]): row for row in validation["layouts"]}
    assert set(rows) == {(7, 5, 4), (8, 4, 4), (6, 6, 4)}
    assert rows[(6, 6, 4)]["measured_ms"] == pytest.approx(max(slow))
    assert rows[(6, 6, 4)]["error"] < -0.1  # a fit over the others under-predicts the slow layout
    assert validation["max_abs_error"] == pytest.approx(max(abs(row["error"]) for row in rows.values()))
    assert [layout["cut"] for layout in body["layouts"]] == [[6, 6, 4], [8, 4, 4], [7, 5, 4]]
    samples = parse_samples(get("/api/v1/metrics/", user=viewer).content.decode())
    assert samples[("seam_timing_validation_error_ratio", (("stat", "max"),))] == validation["max_abs_error"]
    assert samples[("seam_timing_validation_error_ratio", (("stat", "mean"),))] == validation["mean_abs_error"]
    assert samples[("seam_timing_validation_layouts", ())] == 3


def test_frontier_intervals_are_finite_numbers(get, viewer, dead_engine, seed):
    seed([7, 5, 4], stages([7, 5, 4]))
    seed([8, 4, 4], stages([8, 4, 4]))  # rank 2 never moved: unidentified, so its band widens every interval
    body = get("/api/v1/frontier/", user=viewer)
    for point in [body["incumbent"], *body["points"]]:
        low, high = point["x_pipelined_interval"]
        assert isinstance(low, float) and isinstance(high, float) and 0 < low <= point["x_pipelined"] <= high
    assert body["timing"]["validation"]["layouts_needed"] == 1
