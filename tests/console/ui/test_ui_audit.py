"""Audit page: newest first, filters, details whole as JSON, chain verification and the JSON-lines export."""

import html
import json
import re
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from console.audit.models import AuditEvent
from console.audit.services import record

pytestmark = pytest.mark.django_db


@pytest.fixture
def events(make_user, django_capture_on_commit_callbacks):
    """Five events by two actors on two subjects, committed (so anchored)."""
    alice, bob = make_user("operator", name="alice"), make_user("reviewer", name="bob")
    made = []
    with django_capture_on_commit_callbacks(execute=True):
        for actor, action, subject in [(alice, "job.proposed", "job:1"), (bob, "job.approval", "job:1"),
                                       (alice, "job.proposed", "job:2"), (None, "job.running", "job:1"),
                                       (bob, "job.rejected", "job:2")]:
            made.append(record(actor=actor, action=action, subject=subject, payload={"n": len(made)}))
    return made


def seqs(page: str) -> list[int]:
    return [int(seq) for seq in re.findall(r'data-testid="audit-row" data-seq="(\d+)"', page)]


def test_the_trail_is_listed_newest_first(browse, viewer, events):
    assert seqs(browse(viewer).get("/audit/").content.decode()) == [5, 4, 3, 2, 1]


@pytest.mark.parametrize("query, expected", [
    ("actor=alice", [3, 1]), ("actor=system", [4]), ("action=job.proposed", [3, 1]), ("subject=job:2", [5, 3]),
    ("actor=bob&subject=job:1", [2]), ("actor=nobody", []),
])
def test_filters_select_the_right_rows(browse, viewer, events, query, expected):
    assert seqs(browse(viewer).get(f"/audit/?{query}").content.decode()) == expected


def test_the_time_range_filter(browse, viewer, events):
    client = browse(viewer)
    later = (timezone.now() + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M")
    earlier = (timezone.now() - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M")
    assert seqs(client.get(f"/audit/?since={earlier}&until={later}").content.decode()) == [5, 4, 3, 2, 1]
    assert seqs(client.get(f"/audit/?since={later}").content.decode()) == []
    assert seqs(client.get(f"/audit/?until={earlier}").content.decode()) == []


@pytest.mark.parametrize("query, expected", [("since=yesterday", "since: Enter a valid date/time"),
                                             ("since=2026-01-02T00:00&until=2026-01-01T00:00", "starts after it ends")])
def test_a_bad_filter_is_a_400_with_the_reason(browse, viewer, events, query, expected):
    response = browse(viewer).get(f"/audit/?{query}")
    assert response.status_code == 400
    assert expected in " ".join(re.findall(r'data-testid="form-error">([^<]+)<', response.content.decode()))


def test_the_trail_is_paginated(browse, viewer, make_user):
    actor = make_user("operator", name="pager")
    for n in range(55):
        record(actor=actor, action="test.event", subject="page", payload={"n": n})
    client = browse(viewer)
    assert seqs(client.get("/audit/").content.decode()) == list(range(55, 5, -1))
    assert seqs(client.get("/audit/?page=2").content.decode()) == list(range(5, 0, -1))


def test_verify_says_ok_with_the_count(browse, viewer, events):
    page = browse(viewer).get("/audit/?verify=1").content.decode()
    assert re.search(r'data-testid="verify-result"[^>]*>ok: 5 events<', page)
    assert 'data-testid="verify-button"' in page


def test_verify_names_the_first_broken_link(browse, viewer, events):
    with connection.cursor() as cursor:  # tamper below the ORM, as an intruder with database access would
        if connection.vendor == "postgresql":  # its append-only trigger off; pending FK checks first
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            cursor.execute("ALTER TABLE audit_auditevent DISABLE TRIGGER audit_auditevent_append_only")
        cursor.execute("UPDATE audit_auditevent SET payload = %s WHERE seq = 3", [json.dumps({"n": 99})])
        if connection.vendor == "postgresql":
            cursor.execute("ALTER TABLE audit_auditevent ENABLE TRIGGER audit_auditevent_append_only")
    page = browse(viewer).get("/audit/?verify=1").content.decode()
    result = re.search(r'data-testid="verify-result"[^>]*>([^<]+)<', page).group(1)
    assert result.startswith("broken at event #3 after 2 good events")


def test_export_returns_the_filtered_events_as_json_lines(browse, viewer, events):
    client = browse(viewer)
    page = client.get("/audit/?actor=alice").content.decode()
    link = re.search(r'data-testid="export-link" href="([^"]+)"', page).group(1).replace("&amp;", "&")
    assert link == "/audit/export/?actor=alice"
    response = client.get(link)
    assert response["Content-Type"] == "application/x-ndjson"
    lines = [json.loads(line) for line in b"".join(response.streaming_content).decode().splitlines()]
    assert [(line["seq"], line["actor_name"]) for line in lines] == [(1, "alice"), (3, "alice")]
    assert [line["hash"] for line in lines] == [event.hash for event in (events[0], events[2])]


def test_export_of_everything_matches_the_chain(browse, viewer, events):
    response = browse(viewer).get("/audit/export/")
    lines = [json.loads(line) for line in b"".join(response.streaming_content).decode().splitlines()]
    assert [line["hash"] for line in lines] == list(AuditEvent.objects.order_by("seq").values_list("hash", flat=True))


def details(page: str) -> dict[int, dict]:
    """Each row's details cell, parsed back from the page: seq -> the JSON shown."""
    rows = re.findall(r'data-testid="audit-row" data-seq="(\d+)">.*?<pre data-testid="audit-details">(.*?)</pre>',
                      page, re.S)
    return {int(seq): json.loads(html.unescape(shown)) for seq, shown in rows}


def test_details_are_shown_whole_as_indented_json(browse, viewer, make_user):
    actor = make_user("operator", name="long-winded")
    payload = {"reason": "x" * 400, "nested": {"reviewers": ["rita", "rolf"], "ratio": 1.25, "none": None},
               "quote": '<script>alert("no")</script>', "accent": "Zoë"}
    record(actor=actor, action="job.rejected", subject="job:9", payload=payload,
           before={"status": "proposed"}, after={"status": "rejected"})
    record(actor=actor, action="test.bare", subject="page", payload={"n": 1})
    page = browse(viewer).get("/audit/").content.decode()
    shown = details(page)
    assert shown[1] == {"payload": payload, "before": {"status": "proposed"}, "after": {"status": "rejected"}}
    assert shown[2] == {"payload": {"n": 1}}  # no before or after: none shown
    assert '>{\n  "payload": {\n    "' in html.unescape(page)  # indented, one key a line
    assert "<script>alert" not in page and "&lt;script&gt;" in page  # escaped, never markup
    assert "Zoë" in page and "{'reason'" not in page  # JSON, not a Python repr


def rows_of(page: str) -> list[str]:
    return re.findall(r'<tr data-testid="audit-row".*?</tr>', page, re.S)


def test_each_event_is_one_row_with_a_summary_and_its_details_on_demand(browse, viewer, make_user):
    actor = make_user("operator", name="olga")
    plan_hash = "ab" * 32
    record(actor=actor, action="job.approved", subject="job:7", request_id="req-42",
           payload={"plan_hash": plan_hash, "approvals": 1, "note": None},
           before={"status": "proposed"}, after={"status": "approved"})
    record(actor=actor, action="test.long", subject="page", payload={"reason": "y" * 400})
    page = browse(viewer).get("/audit/").content.decode()
    rows = rows_of(page)
    assert len(rows) == 2
    assert all(row.count("<details") == 1 and "<details open" not in row for row in rows)  # closed until asked
    summaries = re.findall(r'<summary data-testid="audit-summary">([^<]*)</summary>', page)
    assert summaries[1] == f"proposed → approved · approvals=1 · plan_hash={plan_hash[:12]}…"  # None left out
    assert len(summaries[0]) == 100 and summaries[0].endswith("…")  # long payloads are cut in the line
    approved = rows[1]
    assert '<td class="mono">job.approved</td>' in approved and '<a href="/jobs/7/">job:7</a>' in approved
    event = AuditEvent.objects.get(action="job.approved")
    # What the page showed before the one-line rows stays reachable in the details: payload whole, before and after,
    # the request id and both hashes.
    assert details(page)[1] == {"payload": event.payload, "before": {"status": "proposed"},
                                "after": {"status": "approved"}}
    assert 'data-testid="audit-request-id">req-42<' in approved
    assert f'data-testid="audit-hash">{event.hash} ' in approved and event.prev_hash in approved
