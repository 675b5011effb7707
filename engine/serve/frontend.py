"""`engine serve`'s front end process: HTTP (uvicorn, engine/serve/http.py's app), the OpenAI dialect, tokenizing,
detokenizing and SSE, serving a RemoteDriver (engine/serve/remote_driver.py) so none of it shares the driver's GIL.

The driver's process spawns it (engine/serve/main.py) and it lives no longer than its driver: when the channel closes,
every open request ends with an error, /healthz answers 503, and uvicorn stops (open streams get a moment to send
their error), which frees the port for an engine started again.

The spent-job ledger and the witnessed audit heads are checked here, where apply's attestation arrives, before the
ApplyAsk is sent: they are files of the state folder, read at this process's start, so the driver's process only
ever sees applies whose attestation verified and whose job id was claimed.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from pathlib import Path

import uvicorn

from engine.control.audit_witness import AuditWitness
from engine.control.job_ledger import JobLedger
from engine.serve.channel import FrontEndSpec
from engine.serve.http import build_app
from engine.serve.remote_driver import RemoteDriver

log = logging.getLogger("seam.engine")

# Open streams would hold a graceful shutdown forever; give them a few seconds to finish.
GRACEFUL_S = 5
# Longer than any client keeps an idle connection (httpx, hence the console and the `openai` client: 5 s; proxies: up
# to 60 s), so the client closes it first: at uvicorn's default of 5 s the two timers race, and a request sent as the
# server closes comes back "Server disconnected without sending a response".
KEEP_ALIVE_S = 75


def frontend_main(spec: FrontEndSpec) -> None:
    # A process group of its own: Ctrl-C reaches the driver's process alone, which stops this one in order (SIGTERM)
    # while the driver still serves its open streams; uvicorn would take a second signal as "stop now".
    os.setpgrp()
    logging.basicConfig(level=logging.WARNING, format="seam front end: %(levelname)s %(name)s: %(message)s")
    driver = RemoteDriver(spec.address.connect(), Path(spec.checkpoint))
    app = build_app(driver, spec.credentials, spec.max_body_bytes, JobLedger(spec.state_dir), spec.allowed_hosts,
                    AuditWitness(spec.state_dir), spec.chat_max_tokens)
    server = uvicorn.Server(uvicorn.Config(app, host=spec.host, port=spec.port, log_level="warning",
                                           timeout_keep_alive=KEEP_ALIVE_S, timeout_graceful_shutdown=GRACEFUL_S))
    threading.Thread(target=_stop_when_lost, args=(driver, server), name="seam-driver-watch", daemon=True).start()
    try:
        server.run()
        lost = driver.lost.is_set()
    finally:
        driver.shutdown()
    sys.exit(1 if lost else 0)


def _stop_when_lost(driver: RemoteDriver, server: uvicorn.Server) -> None:
    driver.lost.wait()
    server.should_exit = True
