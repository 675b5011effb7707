import pytest

pytestmark = pytest.mark.django_db


def test_frontier_json(get, make_user):
    body = get("/api/v1/frontier/", user=make_user("viewer"))
    assert {"incumbent", "points", "refused", "elapsed_s"} <= set(body)


def test_frontier_min_pool_ratio(get, make_user):
    assert "points" in get("/api/v1/frontier/", {"min_pool_ratio": "0.5"}, user=make_user("viewer"))


@pytest.mark.parametrize("value", ["lots", "-1", "-0.5", "nan", "NaN", "inf", "-inf", "Infinity", "1e999"])
def test_frontier_bad_min_pool_ratio_is_400(get, make_user, value):
    body = get("/api/v1/frontier/", {"min_pool_ratio": value}, user=make_user("viewer"), expect=400)
    assert "min_pool_ratio" in str(body)
