"""The anchor file: one MAC'd line per committed append, never for a rolled-back one; verify's anchor states."""

from __future__ import annotations

import json
import logging

import pytest
from django.db import transaction

from console.audit import anchor
from console.audit.anchor import AnchorState, anchor_mac, read_anchors
from console.audit.models import AuditEvent
from console.audit.services import record, verify_chain

pytestmark = pytest.mark.django_db


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="ascii").splitlines()]


def test_each_committed_append_anchors_its_seq_and_hash_with_a_mac(make_events, anchor_file):
    events = make_events(3)
    lines = _lines(anchor_file)
    assert [(line["seq"], line["hash"]) for line in lines] == [(e.seq, e.hash) for e in events]
    assert all(line["mac"] == anchor_mac(line["seq"], line["hash"]) and line["ts"] for line in lines)
    assert anchor_file.stat().st_mode & 0o777 == 0o600


def test_an_event_that_rolled_back_is_never_anchored(make_events, anchor_file, django_capture_on_commit_callbacks):
    make_events(2)
    with django_capture_on_commit_callbacks(execute=True), pytest.raises(RuntimeError), transaction.atomic():
        record(actor=None, action="job.approve", subject="job:9", payload={})
        raise RuntimeError("the change failed after its event was written")
    assert [line["seq"] for line in _lines(anchor_file)] == [1, 2]
    assert verify_chain().ok  # the next append takes seq 3 again: no false truncation


def test_a_failed_anchor_write_is_logged_not_raised(make_events, settings, tmp_path, caplog):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    settings.SEAM_AUDIT_ANCHOR_PATH = blocker / "anchor.jsonl"
    with caplog.at_level(logging.ERROR, logger="console.audit.anchor"):
        make_events(1)
    assert AuditEvent.objects.count() == 1  # the committed event stays
    assert "audit anchor NOT written: event #1 is committed" in caplog.text
    result = verify_chain()  # the keyed event is unanchored, which verify reports (issue 30, item 3)
    assert (result.ok, result.anchor, result.anchored_seq) == (False, AnchorState.UNREADABLE, None)
    assert result.reason.startswith("the chain holds keyed events but the anchor file")


def test_events_past_the_newest_anchor_still_verify(make_events):
    """An anchor may lag the head (a failed write, an append whose commit callback has not run yet)."""
    make_events(2)
    record(actor=None, action="job.approve", subject="job:3", payload={})  # never committed, so never anchored
    result = verify_chain()
    assert (result.ok, result.checked, result.anchored_seq) == (True, 3, 2)


@pytest.mark.parametrize(("setup", "state", "note"), [
    (lambda path: None, AnchorState.MISSING, "there is no anchor file at"),
    (lambda path: path.write_text(""), AnchorState.MISSING, "is empty"),
    (lambda path: path.mkdir(), AnchorState.UNREADABLE, "cannot be read"),
])
def test_a_missing_or_unreadable_anchor_fails_verify(make_events, anchor_file, setup, state, note):
    """Pins verification._unsound_anchor: a keyed chain without its anchor file is an error, not a notice (issue 30,
    item 3); it passed as ok before."""
    make_events(2)
    anchor_file.unlink()
    setup(anchor_file)
    result = verify_chain()
    assert (result.ok, result.checked, result.anchor, result.anchored_seq) == (False, 2, state, None)
    assert note in result.anchor_note and note in result.reason
    assert str(result).startswith("broken after 2 good events: the chain holds keyed events but ")


@pytest.mark.parametrize("line", [
    json.dumps({"hash": "f" * 64, "mac": "0" * 64, "seq": 9, "ts": "x"}),  # a forged MAC
    "not json",  # torn by a crash
    '{"seq": 9}',
])
def test_a_line_not_made_with_the_key_fails_verify(make_events, anchor_file, line):
    make_events(2)
    with anchor_file.open("a") as file:
        file.write(line + "\n")
    result = verify_chain()
    assert (result.ok, result.anchor, result.anchored_seq, result.first_broken) == (False, AnchorState.INVALID, 2,
                                                                                    None)
    assert "line 3 of the anchor file" in result.reason and "not an anchor made with SEAM_AUDIT_KEY" in result.reason


def test_an_anchor_made_under_another_key_is_not_trusted(make_events, anchor_file, settings):
    make_events(2)
    settings.SEAM_AUDIT_KEY = "another-key-" * 4
    assert read_anchors().state == AnchorState.INVALID


def test_the_file_rotates_and_keeps_naming_the_head(make_events, anchor_file, monkeypatch):
    make_events(1)
    monkeypatch.setattr(anchor, "ROTATE_BYTES", 2 * anchor_file.stat().st_size)  # two lines per file
    make_events(4)
    rotated = anchor_file.with_name(anchor_file.name + ".1")
    assert [(line.get("opened"), line["seq"]) for line in _lines(rotated)] == [("rotation", 3), (None, 3), (None, 4)]
    assert [(line.get("opened"), line["seq"]) for line in _lines(anchor_file)] == [("rotation", 5), (None, 5)]
    result = verify_chain()
    assert (result.ok, result.anchored_seq) == (True, 5)


def test_the_first_line_for_a_seq_is_the_one_that_counts(make_events, anchor_file):
    """A later line re-anchoring seq 2 with another hash (a recreated database, or a key holder) does not win."""
    events = make_events(2)
    forged = "e" * 64
    with anchor_file.open("a") as file:
        file.write(json.dumps({"seq": 2, "hash": forged, "mac": anchor_mac(2, forged), "ts": "x"}) + "\n")
    assert read_anchors().hashes == {1: events[0].hash, 2: events[1].hash}


def test_a_file_that_refuses_the_rename_keeps_growing(make_events, anchor_file, monkeypatch):
    """chattr +a refuses the rename (as os.replace does here): the anchor still gets every line."""
    make_events(1)
    monkeypatch.setattr(anchor, "ROTATE_BYTES", 1)

    def refused(*args):
        raise PermissionError("Operation not permitted")
    monkeypatch.setattr(anchor.os, "replace", refused)
    make_events(2)
    assert [line["seq"] for line in _lines(anchor_file)] == [1, 2, 3]
    assert verify_chain().anchored_seq == 3
