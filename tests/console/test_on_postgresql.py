"""The tests whose behaviour only PostgreSQL has, run on a real PostgreSQL server inside the SQLite suite.

`make test` runs on SQLite (DATABASE_URL unset: console/settings.py's default), where these tests skip: the audit
chain's lock is a `select_for_update` that SQLite ignores (it locks the whole file instead), the append-only trigger
is PostgreSQL's, and two reviewers approving at once race only on a database that takes both transactions at once.
Deployments run PostgreSQL, so this test runs them again, in a pytest of their own with DATABASE_URL naming a
database of its own on the server at SEAM_TEST_POSTGRES_URL (default postgres://127.0.0.1:5432/test; the test
database pytest-django migrates, uses and drops is `test_` + that name), and fails if any of them fails or skips.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVER_URL = os.environ.get("SEAM_TEST_POSTGRES_URL", "postgres://127.0.0.1:5432/test")
ON_POSTGRESQL = [
    # concurrent appends queue on the chain lock (select_for_update) and leave one chain; without it they collide
    "tests/console/audit/test_audit_concurrency.py",
    # the append-only trigger refuses raw UPDATE / DELETE / TRUNCATE
    "tests/console/audit/test_audit_immutability.py",
    "tests/console/audit/test_audit_tamper.py",
    "tests/console/audit/test_audit_chain.py",
    "tests/security/test_audit_truncation.py",
    # the job lifecycle's compare-and-set on the status under two transactions at once
    "tests/console/jobs/test_review_gate.py::test_two_reviewers_approving_at_once_queue_the_job_once",
    "tests/console/jobs/test_review_gate.py::test_two_approvals_at_once_both_count",
    # /readyz's database check with PostgreSQL's connect_timeout
    "tests/console/test_health_probes.py::test_readyz_is_ready_with_the_database_redis_and_the_engine",
]


def _server_answers() -> str | None:
    """None when the server takes a connection, else why not."""
    try:
        with psycopg.connect(SERVER_URL, connect_timeout=3):
            return None
    except psycopg.Error as error:
        return str(error).strip().splitlines()[0]


@pytest.mark.skipif(os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")),
                    reason="the suite runs on PostgreSQL already: these tests ran in it")
def test_the_postgresql_only_tests_pass_on_postgresql(tmp_path):
    if (why := _server_answers()) is not None:
        pytest.skip(f"no PostgreSQL server answers at SEAM_TEST_POSTGRES_URL={SERVER_URL} ({why}); start one, or "
                    "point SEAM_TEST_POSTGRES_URL at one that lets this user create databases")
    database = f"{SERVER_URL.rsplit('/', 1)[0]}/seam_pg_{uuid.uuid4().hex[:10]}"
    report = tmp_path / "junit.xml"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs",
                          f"--junitxml={report}", *ON_POSTGRESQL], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "DATABASE_URL": database}, timeout=600)
    assert report.is_file(), f"pytest on PostgreSQL ran no tests:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    suite = ElementTree.parse(report).getroot().find("testsuite")
    counts = {name: int(suite.get(name)) for name in ("tests", "failures", "errors", "skipped")}
    assert run.returncode == 0 and counts["failures"] == counts["errors"] == 0, run.stdout[-5000:]
    assert counts["skipped"] == 0, f"tests skipped on PostgreSQL, so they checked nothing:\n{run.stdout[-3000:]}"
    assert counts["tests"] >= 40, counts  # every file above was collected (a renamed test would drop out)
