"""Migration 0003 on a trail recorded before the key: the rows get scheme 'sha256' without being updated (on
PostgreSQL the append-only trigger stays on throughout), keep verifying, and the next append is keyed."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from console.audit.chain import compute_hash, event_content
from console.audit.models import GENESIS_HASH, AuditEvent, ChainScheme
from console.audit.services import record, verify_chain

# transaction=True: migrations run their own schema changes, which SQLite refuses inside the test's transaction.
pytestmark = pytest.mark.django_db(transaction=True)
BEFORE_KEY = ("audit", "0002_append_only_trigger")


@pytest.fixture
def unmigrated():
    """The audit app at 0002 for the test; every app back at its newest migration afterwards."""
    MigrationExecutor(connection).migrate([BEFORE_KEY])
    yield MigrationExecutor(connection).loader.project_state([BEFORE_KEY]).apps
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


def test_rows_from_before_the_key_become_legacy_and_keep_verifying(unmigrated):
    old_event = unmigrated.get_model("audit", "AuditEvent")
    prev_hash = GENESIS_HASH
    for seq in (1, 2):  # as the console wrote them before: plain sha256, no scheme column
        row = {"seq": seq, "timestamp": timezone.now(), "actor_name": "system", "action": "job.propose",
               "subject": f"job:{seq}", "payload": {"n": seq}, "before": None, "after": None, "request_id": ""}
        prev_hash = old_event.objects.create(
            **row, prev_hash=prev_hash,
            hash=compute_hash(prev_hash, event_content(row), scheme=ChainScheme.SHA256)).hash
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    assert list(AuditEvent.objects.values_list("scheme", flat=True)) == [ChainScheme.SHA256] * 2
    keyed = record(actor=None, action="job.approve", subject="job:1", payload={})
    assert (keyed.scheme, keyed.prev_hash) == (ChainScheme.HMAC_SHA256, prev_hash)
    result = verify_chain()
    assert (result.ok, result.checked, result.legacy_events, result.anchored_seq) == (True, 3, 2, 3)
