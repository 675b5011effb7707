"""A job judged on speed, in Chromium against the real stack: a cut change that succeeds but misses its predicted
speedup reads "succeeded, missed prediction" on the job list and the job page; the operator clicks "Propose revert"
and lands on a new job, back to the layout before, proposed and awaiting review, linked to the job it reverts.

How the job misses, for real: the job runs on the stack's engine under its demo traffic, and the speedup measured is
the engine's own (beat's measurement of the layout before and of the layout after, run on demand as a process of the
stack: e2e_calibration.py). The prediction is made with a calibration the operator could have had and should not
have trusted: besides that real measurement of the layout before, six runs each of two other cuts claiming rank 0
costs 50 ms a layer and the others 1 ms, run to run within 0.1%. The fit over them predicts a speedup nothing like
what the CPU ranks do, judged by the floor measured from those repeats (about 0.1%): the real speedup misses it.
Nothing of Seam's is faked; only the operator's calibration is wrong.
"""

from __future__ import annotations

import re
import time

import pytest

from tests.support.browser import log_in
from tests.support.stack_calibration import console_step

pytestmark = pytest.mark.slow

CANDIDATES = ([8, 4, 4], [7, 5, 4], [6, 6, 4], [7, 4, 5])


@pytest.fixture(scope="module")
def missed(stack) -> dict:
    """The job that missed its prediction, with the layout it replaced."""
    operator, reviewer = stack.api("operator"), stack.api("reviewer")
    assert console_step(stack, "measure")["said"].startswith("measured layout")  # the real layout before
    before = operator.get("frontier/").json()["incumbent"]["cut"]
    for cut in (cut for cut in CANDIDATES if cut != before):
        reply = operator.post("jobs/", json={"kind": "cut", "target": {"cut": cut}})
        if reply.status_code == 201:
            break
    assert reply.status_code == 201, reply.text
    job = reply.json()
    console_step(stack, "wrong-arms", ",".join(map(str, before)), ",".join(map(str, cut)))
    # Recorded before the job starts, so its prediction is made with them: approve only now.
    approved = reviewer.post(f"jobs/{job['id']}/approve/", json={"plan_hash": job["plan_hash"]})
    assert approved.status_code == 200, approved.text
    for _ in range(600):
        status = operator.get(f"jobs/{job['id']}/").json()["status"]
        if status not in ("approved", "queued", "running"):
            break
        time.sleep(0.1)
    assert status == "succeeded", operator.get(f"jobs/{job['id']}/").json()["error"]
    judged = console_step(stack, "measure-job", str(job["id"]))
    assert judged["speed_verdict"] == "missed", judged
    return {"id": job["id"], "before": before, "cut": cut}


def test_the_job_list_and_page_read_succeeded_missed_prediction(browser, stack, missed):
    context, page = log_in(browser, stack, "operator")
    try:
        page.goto(f"{stack.url}/jobs/")
        row = page.locator(f"[data-testid=job-row][data-job-id='{missed['id']}'] [data-testid=job-outcome]")
        assert row.inner_text().strip() == "succeeded, missed prediction"
        page.goto(f"{stack.url}/jobs/{missed['id']}/")
        assert page.inner_text("[data-testid=job-status]").strip() == "succeeded"
        assert page.inner_text("[data-testid=job-outcome]").strip() == "succeeded, missed prediction"
        assert page.inner_text("[data-testid=speed-verdict]").startswith("missed prediction")
        body = stack.api("viewer").get(f"jobs/{missed['id']}/").json()
        assert body["outcome"] == "succeeded, missed prediction" and body["speedup"]["missed"]
    finally:
        context.close()


def test_the_operator_clicks_revert_and_sees_the_new_job_awaiting_review(browser, stack, missed):
    context, page = log_in(browser, stack, "operator")
    try:
        page.goto(f"{stack.url}/jobs/{missed['id']}/")
        page.click("[data-testid=revert-button]")
        page.wait_for_url(re.compile(r"/jobs/\d+/$"))
        revert_id = int(page.get_attribute("main[data-job-id]", "data-job-id"))
        assert revert_id != missed["id"]
        assert page.inner_text("[data-testid=job-status]").strip() == "proposed"
        assert page.get_attribute("[data-testid=reverts-link]", "href") == f"/jobs/{missed['id']}/"
        assert page.query_selector("[data-testid=approve-button]") is None  # the proposer cannot approve it
        body = stack.api("viewer").get(f"jobs/{revert_id}/").json()
        assert (body["status"], body["reverts"], body["target"]) == ("proposed", missed["id"],
                                                                     {"cut": missed["before"]})
        page.goto(f"{stack.url}/jobs/{missed['id']}/")
        assert page.query_selector("[data-testid=revert-button]") is None  # one revert at a time
        assert page.get_attribute("[data-testid=reverted-by-link]", "href") == f"/jobs/{revert_id}/"
    finally:
        context.close()
    reviewer_context, reviewer = log_in(browser, stack, "reviewer")
    try:
        reviewer.goto(f"{stack.url}/jobs/{revert_id}/")
        assert reviewer.is_visible("[data-testid=approve-button]")  # awaiting review, like any other job
    finally:
        reviewer_context.close()
