"""`python -m engine serve`: the driver and its ranks, the HTTP service, and the telemetry publisher."""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path

from contracts.layout import Cut
from contracts.telemetry import DEFAULT_CHANNEL
from engine.control.audit_witness import AuditWitness
from engine.control.driver import PipelineDriver
from engine.control.job_ledger import JobLedger, default_state_dir
from engine.serve.access import Credentials, exposure_notices
from engine.serve.cross_site import AllowedHosts
from engine.serve.json_body import max_body_bytes
from solvers.rig import load_rig

log = logging.getLogger("seam.engine")


def run_service(checkpoint: str | Path, rig: str, cut: str | None, host: str, port: int,
                redis_url: str | None, telemetry_hz: float, telemetry_channel: str = DEFAULT_CHANNEL,
                ladder: str | None = None, allow_open_v1: bool = False, state_dir: Path | None = None,
                allowed_hosts: tuple[str, ...] = ()) -> None:
    from engine.serve.http import serve

    # Everything the environment and flags decide is checked before the ranks start, so a refusal is immediate.
    credentials = Credentials.from_env()
    for notice in exposure_notices(host, credentials, allow_open_v1):
        print(notice, file=sys.stderr, flush=True)
    body_limit = max_body_bytes()
    state = state_dir or default_state_dir(port)
    jobs = JobLedger(state)  # an unreadable ledger refuses the start, before any rank is spent on it
    witness = AuditWitness(state)  # as the ledger: unreadable refuses the start
    print(f"seam engine: spent-job ledger {jobs.path} (a captured apply never replays, restarts included); "
          f"witnessed audit heads {witness.path}", flush=True)
    rungs = [Cut.from_text(rung) for rung in ladder.split(";")] if ladder else None
    driver = PipelineDriver(checkpoint, load_rig(rig), Cut.from_text(cut) if cut else None, ladder=rungs)
    publisher = None
    if redis_url:
        from engine.telemetry.publisher import TelemetryPublisher

        publisher = TelemetryPublisher(lambda: driver.snapshot(advance=True).to_dict(), redis_url, telemetry_channel,
                                       hz=telemetry_hz)
        publisher.start()
    # SIGTERM stops as cleanly as Ctrl-C: uvicorn handles both, then everything below runs.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        print(f"seam engine: rig {driver.rig.name}, cut {list(driver.cut)}, pool {driver.prediction.pool_tokens} "
              f"tokens, serving on http://{host}:{port}", flush=True)
        serve(driver, credentials, jobs, witness, host, port, body_limit, AllowedHosts.for_bind(host, allowed_hosts))
    finally:
        if publisher is not None:
            publisher.stop()
        driver.shutdown()


def default_redis_url() -> str | None:
    return os.environ.get("REDIS_URL") or None
