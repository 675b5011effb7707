import json

import pytest

from console.audit.services import record
from tests.support.live_service import free_port

pytestmark = pytest.mark.django_db


@pytest.fixture
def events(operator, reviewer, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):  # committed, so anchored
        record(actor=operator, action="job.proposed", subject="job:1", payload={"n": 1})
        record(actor=reviewer, action="job.approval", subject="job:1", payload={"n": 2})
        record(actor=operator, action="job.proposed", subject="job:2", payload={"n": 3})


def test_list_newest_first(events, get, operator):
    rows = get("/api/v1/audit/", user=operator)["results"]
    assert [row["seq"] for row in rows] == [3, 2, 1]


@pytest.mark.parametrize("params, seqs", [
    ({"action": "job.proposed"}, [3, 1]), ({"subject": "job:1"}, [2, 1]), ({"actor": "rita"}, [2]),
    ({"action": "job.proposed", "subject": "job:2"}, [3]),
])
def test_list_filters(events, get, operator, params, seqs):
    assert [row["seq"] for row in get("/api/v1/audit/", params, user=operator)["results"]] == seqs


def test_verify(events, get, operator, settings):
    settings.ENGINE_URL = f"http://127.0.0.1:{free_port()}"  # the engine is down: the witness cannot be read
    verified = get("/api/v1/audit/verify/", user=operator)
    note = verified.pop("witness_note")
    assert verified == {"ok": True, "checked": 3, "first_broken": None, "reason": None, "anchor": "anchored",
                        "anchored_seq": 3, "anchor_note": None, "legacy_events": 0, "witness": "unreachable",
                        "witnessed_seq": None}
    assert note.startswith("the engine's witnessed head could not be read (engine unreachable at ")


def test_export_is_ndjson_in_seq_order(events, get, operator):
    response = get("/api/v1/audit/export/", user=operator)
    assert response["Content-Type"] == "application/x-ndjson"
    lines = [json.loads(line) for line in b"".join(response.streaming_content).decode().splitlines()]
    assert [line["seq"] for line in lines] == [1, 2, 3] and all(line["hash"] for line in lines)
