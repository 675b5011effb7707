"""The nav's Jobs link shows how many jobs await review (proposed), to every console role, in one query."""

import re

import pytest
from django.db import connection
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext

from console.jobs import lifecycle
from console.ui.context import pending_review

pytestmark = pytest.mark.django_db


def badge(page: str) -> int | None:
    found = re.search(r'data-testid="pending-review-badge"[^>]*>(\d+)<', page)
    return int(found.group(1)) if found else None


def test_every_role_sees_the_count_of_proposed_jobs(browse, viewer, operator, reviewer, propose_cut):
    first, second, third = propose_cut(), propose_cut(), propose_cut()
    lifecycle.reject(reviewer, first, reason="no")  # no longer awaiting review
    lifecycle.cancel(operator, second)
    propose_cut()
    for user in (viewer, operator, reviewer):
        assert badge(browse(user).get("/").content.decode()) == 2, user
    lifecycle.approve(reviewer, third, plan_hash=third.plan_hash)
    assert badge(browse(viewer).get("/jobs/").content.decode()) == 1


def test_no_badge_when_nothing_awaits_review(browse, viewer):
    page = browse(viewer).get("/jobs/").content.decode()
    assert badge(page) is None and 'href="/jobs/"' in page


def test_a_login_without_a_role_is_told_nothing(browse, make_user, propose_cut):
    propose_cut()
    response = browse(make_user()).get("/")
    assert response.status_code == 403 and badge(response.content.decode()) is None


def test_the_count_is_one_query_and_only_when_a_page_shows_it(make_user, propose_cut):
    propose_cut()
    request = RequestFactory().get("/")
    request.user = make_user("viewer")
    with CaptureQueriesContext(connection) as queries:
        context = pending_review(request)
    assert len(queries) == 0  # lazy: a page without the nav asks nothing
    with CaptureQueriesContext(connection) as queries:
        assert context["pending_review_count"]() == 1
        assert context["pending_review_count"]() == 1  # asked twice on one page, counted once
    assert len(queries) == 1
