"""GET /api/v1/frontier/ without an engine to follow (its running layout: tests/console/calibration)."""

import pytest

from tests.support.live_service import free_port

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_engine(settings):
    """Nothing listens at the engine's URL: the frontier is the rig's, whatever runs on this machine."""
    settings.ENGINE_URL = f"http://127.0.0.1:{free_port()}"


def test_frontier_json(get, make_user):
    body = get("/api/v1/frontier/", user=make_user("viewer"))
    assert {"incumbent", "points", "refused", "elapsed_s", "timing", "noise_floor", "noise_floor_source"} <= set(body)
    assert (body["incumbent_source"], body["incumbent"]["cut"], body["timing"]["source"]) == ("rig", [7, 5, 4], "rig")
    assert any("engine unreachable at http://127.0.0.1:" in note for note in body["notes"])


def test_frontier_min_pool_ratio(get, make_user):
    assert "points" in get("/api/v1/frontier/", {"min_pool_ratio": "0.5"}, user=make_user("viewer"))


@pytest.mark.parametrize("value", ["lots", "-1", "-0.5", "nan", "NaN", "inf", "-inf", "Infinity", "1e999"])
def test_frontier_bad_min_pool_ratio_is_400(get, make_user, value):
    body = get("/api/v1/frontier/", {"min_pool_ratio": value}, user=make_user("viewer"), expect=400)
    assert "min_pool_ratio" in str(body)
