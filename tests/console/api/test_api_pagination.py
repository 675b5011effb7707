"""Every paged list checks its limit and offset: a value that is not a whole number in range is refused with 400
naming the parameter, never replaced by the default (console/api/pagination.py)."""

import pytest

from console.audit.services import record

pytestmark = pytest.mark.django_db

LISTS = ["/api/v1/audit/", "/api/v1/jobs/", "/api/v1/predictions/"]


@pytest.mark.parametrize("url", LISTS)
@pytest.mark.parametrize("params, name", [
    ({"limit": ""}, "limit"), ({"limit": "ten"}, "limit"), ({"limit": "0"}, "limit"), ({"limit": "-3"}, "limit"),
    ({"offset": ""}, "offset"), ({"offset": "1.5"}, "offset"), ({"offset": "-1"}, "offset"),
    ({"limit": "\u0663"}, "limit"),  # an Arabic-Indic three: a digit to str.isdigit, not a number to the API
])
def test_a_bad_limit_or_offset_is_refused_naming_it(get, operator, url, params, name):
    error = get(url, params, user=operator, expect=400)
    assert name in str(error) and "expected a whole number" in str(error)


def test_limit_and_offset_page_the_list_and_the_limit_is_capped(get, operator, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        for n in range(5):
            record(actor=operator, action="job.proposed", subject=f"job:{n}", payload={"n": n})
    page = get("/api/v1/audit/", {"limit": "2", "offset": "1"}, user=operator)
    assert [row["seq"] for row in page["results"]] == [4, 3] and page["count"] == 5
    assert len(get("/api/v1/audit/", {"limit": "5000"}, user=operator)["results"]) == 5  # capped at 1000, not refused
    assert [row["seq"] for row in get("/api/v1/audit/", user=operator)["results"]] == [5, 4, 3, 2, 1]
