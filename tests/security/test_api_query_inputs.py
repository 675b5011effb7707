"""Item 6's query inputs: a ratio that is not a finite number, and a status filter that must filter.

The API's own tests (tests/console/api) cover every form; these pin the two holes the attacker found, at the
API and at the planner both (NaN compares false with everything, so an unchecked NaN keeps every point).
"""

import math

import pytest

from solvers.census import load_census
from solvers.errors import SolverError
from solvers.frontier import compute_frontier
from solvers.rig import load_rig

pytestmark = pytest.mark.django_db
JOBS = "/api/v1/jobs/"


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_ratio_that_is_not_finite_is_400_not_the_whole_frontier(get, viewer, value):
    body = get("/api/v1/frontier/", {"min_pool_ratio": value}, user=viewer, expect=400)
    assert "min_pool_ratio" in str(body)


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_the_planner_refuses_a_ratio_that_is_not_finite(value):
    with pytest.raises(SolverError, match="min_pool_ratio must be a finite number"):
        compute_frontier(load_census("demo-hybrid-16"), load_rig("cpu-demo"), min_pool_ratio=value)


def test_the_status_filter_filters(proposed, reviewer, viewer, post, get):
    kept, rejected = proposed(), proposed()
    post(f"{JOBS}{rejected['id']}/reject/", {}, user=reviewer)
    assert [row["id"] for row in get(JOBS, {"status": "proposed"}, user=viewer)["results"]] == [kept["id"]]
    assert get(JOBS, {"status": "nonsense"}, user=viewer, expect=400)["field"] == "status"
