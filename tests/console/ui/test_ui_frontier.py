"""Frontier page: the same frontier as /api/v1/frontier/ (one computation), as a chart and a table."""

import json
import re

import pytest

from tests.support.live_service import free_port

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_engine(settings):
    """Nothing listens at the engine's URL: the frontier is the rig's (with an engine: tests/console/calibration)."""
    settings.ENGINE_URL = f"http://127.0.0.1:{free_port()}"


def rows(page: str) -> list[tuple[str, bool]]:
    return [(cut, bool(incumbent)) for cut, incumbent in
            re.findall(r'<tr data-testid="frontier-point" data-cut="([0-9,]+)"( data-incumbent="true")?>', page)]


def test_frontier_page_lists_the_same_points_as_the_api(browse, viewer):
    client = browse(viewer)
    api = client.get("/api/v1/frontier/").json()
    page = client.get("/frontier/").content.decode()
    listed = rows(page)
    points = [",".join(map(str, point["cut"])) for point in api["points"]]
    incumbent = ",".join(map(str, api["incumbent"]["cut"]))
    assert [cut for cut, marked in listed if not (marked and cut not in points)] == points
    assert [cut for cut, marked in listed if marked] == [incumbent]
    chart = json.loads(re.search(r'<script id="frontier-data" type="application/json">(.*?)</script>', page,
                                 re.S).group(1))
    assert chart["frontier"]["points"] == api["points"] and chart["frontier"]["incumbent"] == api["incumbent"]


def test_every_row_links_to_a_prefilled_proposal(browse, viewer):
    page = browse(viewer).get("/frontier/").content.decode()
    links = re.findall(r'<a data-testid="propose-link" href="([^"]+)">', page)
    assert len(links) == len(rows(page))
    assert links == [f"/jobs/new/?kind=cut&amp;cut={cut}" for cut, _ in rows(page)]


def test_refused_cuts_are_listed_with_their_reasons(browse, viewer):
    client = browse(viewer)
    api = client.get("/api/v1/frontier/").json()
    page = client.get("/frontier/").content.decode()
    refused = re.findall(r'<tr data-testid="refused-cut" data-cut="([0-9,]+)">\s*<td[^>]*>[^<]*</td><td>([^<]+)</td>',
                         page)
    assert api["refused"], "the demo rig refuses some cuts"
    assert [cut for cut, _ in refused] == [",".join(map(str, item["cut"])) for item in api["refused"]]
    assert "cannot clear its arming floor" in refused[0][1]


def test_noise_floor_and_local_plotly(browse, viewer, settings):
    page = browse(viewer).get("/frontier/").content.decode()
    chart = json.loads(re.search(r'<script id="frontier-data" type="application/json">(.*?)</script>', page,
                                 re.S).group(1))
    assert chart["noise_floor"] == chart["frontier"]["noise_floor"] == 0.141 and chart["propose_url"] == "/jobs/new/"
    assert 'data-testid="noise-floor-source" data-source="rig"' in page
    assert 'id="frontier-chart"' in page and 'src="/static/plotly/plotly.min.js"' in page


def test_a_model_the_planner_cannot_price_is_reported_not_a_traceback(browse, viewer, settings):
    settings.SEAM_MODEL = "no-such-model"
    response = browse(viewer).get("/frontier/")
    assert response.status_code == 503
    assert "cannot be computed for the configured model and rig" in response.content.decode()


def test_figures_are_formatted_and_the_timing_note_is_shown_once(browse, viewer):
    page = browse(viewer).get("/frontier/").content.decode()
    incumbent = re.search(r'<tr data-testid="frontier-point" data-cut="7,5,4" data-incumbent="true">(.*?)</tr>', page,
                          re.S).group(1)
    assert '<td class="mono nowrap">7 · 5 · 4<br><span class="badge binds">incumbent</span></td>' in incumbent
    assert re.search(r'data-testid="pipelined-ms">\d+\.\d\d ms<', incumbent)
    assert 'data-testid="x-pipelined">1.00x<' in incumbent
    assert 'data-testid="incumbent-cut">7 · 5 · 4<' in page
    # The rig's timing says so once, in the provenance list, not again as a notice under it.
    shown = re.sub(r"<script.*?</script>", "", page, flags=re.S)  # the chart's data is not shown as text
    assert shown.count("no measured layout with decode steps yet") == 1
    assert re.search(r'data-testid="timing-source" data-source="rig">no measured layout with decode steps yet', page)
    notes = re.findall(r'data-testid="frontier-note">([^<]*)<', page)
    assert notes and len(notes) == len(set(notes)) and not any("no measured layout" in note for note in notes)
