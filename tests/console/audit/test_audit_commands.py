"""verify_audit (exit 0 / 1 naming the first broken link / 2 when not anchored or the engine cannot be asked),
export_audit and export_jsonl. Exit 0 with the engine reachable: tests/security/test_audit_attackers.py."""

from __future__ import annotations

import json
import socket
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection

from console.audit.management.commands.verify_audit import Command as VerifyAudit
from console.audit.models import GENESIS_HASH, AuditEvent
from console.audit.services import compute_hash, event_content, export_jsonl

# transaction=True: run_from_argv closes the database connections when it ends, as manage.py does.
pytestmark = pytest.mark.django_db(transaction=True)


def _tamper_seq_2():
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("ALTER TABLE audit_auditevent DISABLE TRIGGER audit_auditevent_append_only")
        cursor.execute("UPDATE audit_auditevent SET subject = 'job:999' WHERE seq = 2")
        if connection.vendor == "postgresql":
            cursor.execute("ALTER TABLE audit_auditevent ENABLE TRIGGER audit_auditevent_append_only")


def _exit_code(capsys) -> tuple[int, str, str]:
    try:
        VerifyAudit().run_from_argv(["manage.py", "verify_audit", "--skip-checks"])
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def no_engine(settings):
    """The console's engine is down: nothing listens at ENGINE_URL (a port just freed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings.ENGINE_URL = f"http://127.0.0.1:{port}"


def test_verify_audit_exits_2_when_intact_but_the_engine_cannot_be_asked(make_events, no_engine, capsys):
    """Pins the command's witness check: an engine that cannot be reached is said, not read as fine (issue 30,
    item 3)."""
    make_events(3)
    code, out, err = _exit_code(capsys)
    assert (code, out) == (2, "")
    assert err.startswith("CommandError: ok: 3 events; anchored at event #3; NOT witnessed (unreachable): the "
                          "engine's witnessed head could not be read (engine unreachable at")


def test_verify_audit_exits_1_when_the_chain_holds_but_is_not_anchored(make_events, anchor_file, capsys):
    make_events(3)
    anchor_file.unlink()
    code, out, err = _exit_code(capsys)
    assert (code, out) == (1, "")
    assert "broken after 3 good events: the chain holds keyed events but there is no anchor file" in err


def test_verify_audit_exits_0_on_an_empty_trail_with_nothing_to_anchor(capsys):
    code, out, _ = _exit_code(capsys)
    assert code == 0 and out.startswith("ok: 0 events; NOT anchored (missing)")


def test_verify_audit_exits_1_naming_the_first_broken_link(make_events, capsys):
    make_events(3)
    _tamper_seq_2()
    code, out, err = _exit_code(capsys)
    assert (code, out) == (1, "")
    assert "broken at event #2" in err and "hash does not match" in err


def test_export_lines_parse_and_match_the_events(make_events, django_user_model):
    judy = django_user_model.objects.create_user("judy")
    make_events(2, actor=judy)
    make_events(2)
    lines = list(export_jsonl())
    assert all(line.endswith("\n") and line.count("\n") == 1 for line in lines)
    parsed = [json.loads(line) for line in lines]
    events = list(AuditEvent.objects.all())
    assert [p["seq"] for p in parsed] == [e.seq for e in events] == [1, 2, 3, 4]
    prev_hash = GENESIS_HASH
    for line, event in zip(parsed, events, strict=True):
        assert line["id"] == event.pk and line["actor_id"] == event.actor_id
        assert line["hash"] == event.hash and line["prev_hash"] == prev_hash
        assert line["payload"] == event.payload and line["actor_name"] == event.actor_name
        assert line["scheme"] == "hmac-sha256"
        assert compute_hash(line["prev_hash"], event_content(line)) == line["hash"]  # verifiable offline, with the key
        prev_hash = line["hash"]
    assert [json.loads(line)["seq"] for line in export_jsonl(AuditEvent.objects.filter(actor=judy))] == [1, 2]


def test_export_audit_writes_the_same_lines_to_stdout_and_to_a_file(make_events, tmp_path):
    make_events(3)
    expected = "".join(export_jsonl())
    out, err = StringIO(), StringIO()
    call_command("export_audit", stdout=out, stderr=err)
    assert out.getvalue() == expected
    path = tmp_path / "audit.jsonl"
    call_command("export_audit", "--output", str(path), stdout=out, stderr=err)
    assert path.read_text(encoding="ascii") == expected
    assert f"exported 3 events to {path}" in err.getvalue()
