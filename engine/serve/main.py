"""`python -m engine serve`: the driver, its ranks and the telemetry publisher in this process, the HTTP front end
(engine/serve/frontend.py) in a child process, the channel between them (engine/serve/channel.py).

The driver's process is the parent: it holds what must outlive any one HTTP connection (the ranks, the operations,
the boot id) and stops last. On SIGTERM or Ctrl-C it stops the front end first (SIGTERM: open streams get a few
seconds, served by a driver that still runs), then the driver. A front end that exits on its own (it crashed, was
killed, or could not bind the port) stops the engine: its requests are cancelled, the ranks stopped, and the start or
the run ends with an error naming the front end, for the supervisor (launch/) to restart the whole engine.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
from pathlib import Path

from contracts.layout import Cut
from contracts.telemetry import DEFAULT_CHANNEL
from engine.control.audit_witness import AuditWitness
from engine.control.driver import PipelineDriver
from engine.control.job_ledger import JobLedger, default_state_dir
from engine.errors import EngineError
from engine.serve.access import Credentials, exposure_notices
from engine.serve.channel import ChannelAddress, FrontEndSpec, accept_front_end
from engine.serve.channel_server import ChannelServer
from engine.serve.cross_site import AllowedHosts
from engine.serve.frontend import GRACEFUL_S, frontend_main
from engine.serve.json_body import max_body_bytes
from engine.serve.openai_api import read_chat_max_tokens
from solvers.rig import load_rig

log = logging.getLogger("seam.engine")

CONNECT_S = 120.0  # spawning the front end imports torch (the sampler's types): seconds on a busy CPU


def run_service(checkpoint: str | Path, rig: str, cut: str | None, host: str, port: int,
                redis_url: str | None, telemetry_hz: float, telemetry_channel: str = DEFAULT_CHANNEL,
                ladder: str | None = None, allow_open_v1: bool = False, state_dir: Path | None = None,
                allowed_hosts: tuple[str, ...] = (), deterministic: bool = False) -> None:
    # Everything the environment and flags decide is checked before the ranks start, so a refusal is immediate.
    credentials = Credentials.from_env()
    for notice in exposure_notices(host, credentials, allow_open_v1):
        print(notice, file=sys.stderr, flush=True)
    body_limit = max_body_bytes()
    chat_max_tokens = read_chat_max_tokens()
    state = state_dir or default_state_dir(port)
    # Read here only to refuse the start, before any rank is spent: the front end opens both again and checks them.
    jobs = JobLedger(state)  # an unreadable ledger refuses the start
    witness = AuditWitness(state)  # as the ledger: unreadable refuses the start
    print(f"seam engine: spent-job ledger {jobs.path} (a captured apply never replays, restarts included); "
          f"witnessed audit heads {witness.path}", flush=True)
    rungs = [Cut.from_text(rung) for rung in ladder.split(";")] if ladder else None
    driver = PipelineDriver(checkpoint, load_rig(rig), Cut.from_text(cut) if cut else None, ladder=rungs,
                            deterministic=deterministic)
    publisher = None
    if redis_url:
        from engine.telemetry.publisher import TelemetryPublisher

        publisher = TelemetryPublisher(lambda: driver.snapshot(advance=True).to_dict(), redis_url, telemetry_channel,
                                       hz=telemetry_hz)
        publisher.start()
    # SIGTERM stops as cleanly as Ctrl-C: both raise KeyboardInterrupt here, then everything below runs.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    address = ChannelAddress.fresh()
    spec = FrontEndSpec(address, str(checkpoint), host, port, credentials, body_limit,
                        AllowedHosts.for_bind(host, allowed_hosts), state, chat_max_tokens)
    frontend = multiprocessing.get_context("spawn").Process(target=frontend_main, args=(spec,),
                                                             name="seam-frontend")
    server = None
    try:
        listener = address.listen()
        try:
            frontend.start()
            server = ChannelServer(driver, accept_front_end(listener, frontend.is_alive, CONNECT_S))
        finally:
            listener.close()
            address.remove()  # one front end per run: nobody else may connect once it is in
        print(f"seam engine: rig {driver.rig.name}, cut {list(driver.cut)}, pool {driver.prediction.pool_tokens} "
              f"tokens, serving on http://{host}:{port} (driver pid {os.getpid()}, front end pid {frontend.pid})",
              flush=True)
        while frontend.is_alive():
            frontend.join(0.5)
        raise EngineError(f"the front end (pid {frontend.pid}) exited with code {frontend.exitcode}: the engine "
                          "stopped")
    except KeyboardInterrupt:
        _stop(frontend)
    finally:
        if frontend.is_alive():  # the start failed
            frontend.kill()
        if server is not None:
            server.close()
        if publisher is not None:
            publisher.stop()
        driver.shutdown()


def _stop(frontend: multiprocessing.process.BaseProcess) -> None:
    """SIGTERM the front end and wait for its graceful shutdown (the driver still serves its streams meanwhile)."""
    if frontend.pid is None:
        return
    frontend.terminate()
    frontend.join(GRACEFUL_S + 10)


def default_redis_url() -> str | None:
    return os.environ.get("REDIS_URL") or None
