"""The calibration and predictions pages, the job page's prediction, the nav links, and the frontier page's
provenance and error bars: the same computations as the API, as pages."""

from __future__ import annotations

import json
import re

import pytest

from tests.support.calibration import end_job, executed_job, measurement, stages, state_of

pytestmark = pytest.mark.django_db


def chart_of(page: str) -> dict:
    return json.loads(re.search(r'<script id="frontier-data" type="application/json">(.*?)</script>', page,
                                re.S).group(1))


def test_nav_links_to_both_pages(browse, viewer, dead_engine):
    page = browse(viewer).get("/predictions/").content.decode()
    assert '<a href="/calibration/">Calibration</a>' in page
    assert '<a href="/predictions/" aria-current="page">Predictions</a>' in page


def test_calibration_page_explains_an_empty_state(browse, viewer, dead_engine):
    response = browse(viewer).get("/calibration/")
    page = response.content.decode()
    assert response.status_code == 200 and 'data-testid="calibration-explanation"' in page
    assert "nothing is measured yet" in page and 'data-source="rig"' in page


def test_calibration_page_lists_ranks_and_proposable_arms(browse, viewer, dead_engine, seed):
    seed([7, 5, 4], stages([7, 5, 4]))
    seed([8, 4, 4], stages([8, 4, 4]))
    page = browse(viewer).get("/calibration/").content.decode()
    ranks = re.findall(r'data-testid="calibration-rank" data-rank="(\d)" data-identified="(\w+)"', page)
    assert ranks == [("0", "true"), ("1", "true"), ("2", "false")]
    arms = re.findall(r'data-testid="calibration-arm" data-rank="2" data-cut="([0-9,]+)"', page)
    assert sorted(arms) == ["8,3,5", "8,5,3"]
    links = re.findall(r'<a data-testid="arm-propose" href="([^"]+)">', page)
    assert "/jobs/new/?kind=cut&amp;cut=8,5,3" in links


def test_calibration_page_refuses_a_bad_target(browse, viewer, dead_engine):
    response = browse(viewer).get("/calibration/", {"target": "7"})
    assert response.status_code == 400 and "between 0.0001 and 1" in response.content.decode()


def test_predictions_page_and_the_job_page_show_the_prediction(browse, viewer, dead_engine, seed):
    for cut in ([7, 5, 4], [8, 5, 3], [8, 4, 4]):
        seed(cut, stages(cut))
    prediction = end_job(executed_job([8, 4, 4], [9, 4, 3], pool=10000),
                         state_of(measurement([9, 4, 3], None, pool=9800)))
    seed([9, 4, 3], [19.8, 10.0, 9.0])
    client = browse(viewer)
    page = client.get("/predictions/").content.decode()
    row = re.search(rf'<tr data-testid="prediction-row" data-job-id="{prediction.job_id}">(.*?)</tr>', page,
                    re.S).group(1)
    assert 'data-testid="layout-diff">8 · 4 · 4 → 9 · 4 · 3</td>' in row
    assert 'data-testid="predicted-pool">10000<' in row and 'data-testid="measured-pool">9800<' in row
    assert "-2.0%" in row and "+10.0%" in row and "19.80 · 10.00 · 9.00 ms" in row
    assert "mean 2.0%" not in page and "mean +2.0%" in page  # sizes: |error|
    job_page = client.get(f"/jobs/{prediction.job_id}/").content.decode()
    assert 'data-testid="job-prediction"' in job_page and "8 · 4 · 4 → 9 · 4 · 3" in job_page
    assert 'data-testid="prediction-measured-pool">9800<' in job_page
    assert len(re.findall(r'data-testid="prediction-rank"', job_page)) == 3


def test_frontier_page_says_where_the_incumbent_timing_and_noise_floor_come_from(browse, viewer, dead_engine, seed):
    seed([8, 4, 4], stages([8, 4, 4]))
    seed([7, 5, 4], stages([7, 5, 4]))
    page = browse(viewer).get("/frontier/").content.decode()
    assert 'data-testid="incumbent-source" data-source="last_measured"' in page
    assert 'data-testid="timing-source" data-source="measured"' in page
    assert 'data-testid="noise-floor-source" data-source="rig"' in page
    chart = chart_of(page)
    assert chart["noise_floor"] == chart["frontier"]["noise_floor"] == 0.141
    assert all(len(point["x_pipelined_interval"]) == 2 for point in chart["frontier"]["points"])
    incumbent = re.search(r'<tr data-testid="frontier-point" data-cut="7,5,4" data-incumbent="true">(.*?)</tr>', page,
                          re.S).group(1)
    assert ('data-testid="measured-stage-ms"><span class="nowrap">14.00 · 12.50 · 12.00 ms</span> '
            '<span class="muted">(1)</span>') in incumbent
    # The fitted timing is named once, by the provenance list: no notice repeats it.
    assert 'data-testid="timing-source" data-source="measured">fitted over 2 measured layout samples<' in page
    shown = re.sub(r"<script.*?</script>", "", page, flags=re.S)  # the chart's data is not shown as text
    assert shown.count("fitted over 2 measured layout sample") == 1


def test_calibration_and_frontier_pages_show_the_held_out_validation(browse, viewer, dead_engine, seed):
    for cut in ([7, 5, 4], [8, 4, 4], [6, 6, 4]):
        seed(cut, stages(cut))
    client = browse(viewer)
    page = client.get("/calibration/").content.decode()
    assert 'data-testid="timing-validation" data-validated="true">validated to ±0.0% (max 0.0%) on 3 held-out' in page
    assert sorted(re.findall(r'data-testid="validation-layout" data-cut="([0-9,]+)"', page)) == [
        "6,6,4", "7,5,4", "8,4,4"]
    assert re.findall(r'data-testid="fit-layout" data-cut="[0-9,]+" data-explained="(\w+)"', page) == ["true"] * 3
    frontier = client.get("/frontier/").content.decode()
    assert 'data-testid="timing-validation" data-validated="true">validated to ±0.0% (max 0.0%) on 3' in frontier
