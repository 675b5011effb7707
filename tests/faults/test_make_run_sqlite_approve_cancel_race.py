"""Approvals and cancellations of the same jobs sent all at once to `make run`'s console on SQLite, while its worker
runs the approved ones: every answer is a decision (200, or 409 for the one that lost), never a 500 from SQLite's
"database is locked". Pins issue 30, item 8's SQLite settings (WAL, a busy timeout, transactions that take the write
lock when they begin) in console/settings.py."""

from __future__ import annotations

import threading

import httpx
import pytest

from tests.support.stack import running_stack

pytestmark = pytest.mark.slow
JOBS = 8
CUTS = ([8, 4, 4], [7, 5, 4], [6, 6, 4])


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with running_stack(tmp_path_factory.mktemp("run-race")) as running:
        if not running.env["DATABASE_URL"].startswith("sqlite:"):
            pytest.skip("the suite runs on PostgreSQL: this is SQLite's race")
        yield running


def _at_once(calls) -> list:
    """Each call on its own thread, released together; each one's answer (or exception)."""
    barrier, answers = threading.Barrier(len(calls)), [None] * len(calls)

    def run(index, call):
        barrier.wait()
        try:
            answers[index] = call()
        except Exception as error:  # reported to the test
            answers[index] = error
    threads = [threading.Thread(target=run, args=pair) for pair in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    return answers


def test_concurrent_approvals_and_cancellations_get_decisions_never_a_500(stack):
    operator = stack.api("operator")
    # One client per request, each with the user's one token (a second token issued would revoke the first).
    tokens = {user: stack.api(user).headers["Authorization"] for user in ("operator", "reviewer")}
    jobs, refused = [], []
    for index in range(JOBS):
        proposed = operator.post("jobs/", json={"kind": "cut", "target": {"cut": CUTS[index % len(CUTS)]}})
        (jobs if proposed.status_code == 201 else refused).append(proposed.json())
    assert len(jobs) >= JOBS // 2, refused

    def call(user: str, path: str, body: dict | None):
        def post():
            with httpx.Client(base_url=f"{stack.url}/api/v1", timeout=120,
                              headers={"Authorization": tokens[user]}) as client:
                return client.post(path, json=body)
        return post
    calls = []
    for job in jobs:
        calls.append(call("reviewer", f"jobs/{job['id']}/approve/", {"plan_hash": job["plan_hash"]}))
        calls.append(call("operator", f"jobs/{job['id']}/cancel/", None))
    answers = _at_once(calls)
    statuses = [answer.status_code if isinstance(answer, httpx.Response) else repr(answer) for answer in answers]
    assert all(status in (200, 409) for status in statuses), statuses
    for answer in answers:
        if answer.status_code == 409:  # the loser is told why, in the API's error shape
            assert answer.json().get("detail"), answer.text
    for job in jobs:  # each job was decided: nothing is left waiting for review
        assert operator.get(f"jobs/{job['id']}/").json()["status"] != "proposed", job["id"]
