"""Demo traffic for `make run`: short completions sent to the engine one at a time, so its stage times, tokens/s
and latency — the dashboard's live figures and the calibration the frontier reads — keep moving on a demo stack
nobody is sending text to. Each answer is logged at DEBUG (make run keeps those in var/log/demo-traffic.log); a
change, failing or answering again, at WARNING or INFO (make run shows those on the terminal too).

Gentle and bounded: never more than one request in flight, a pause after each answer, and a growing pause (doubling
up to a ceiling) while the engine refuses or cannot be reached. A failure is logged once, not once per attempt; the
driver never stops on its own, only when told (`stop`), with the stack.
"""

from __future__ import annotations

import itertools
import logging
import threading

import httpx

from contracts.attestation import API_KEY_ENV, bearer_token

__all__ = ["DemoTraffic"]

log = logging.getLogger("seam.demo_traffic")

PROMPTS = ("The operator moved one layer from rank 0 to rank 1 because",
           "A pipeline stage that holds more attention layers",
           "Before the live switch, every rank checked its free memory and",
           "The review gate asks a second person to")


class DemoTraffic:
    """Sends POST {engine_url}/v1/completions in a loop on a thread of its own, until `stop`."""

    def __init__(self, engine_url: str, api_key: str | None = None, *, max_tokens: int = 16, pause_s: float = 1.0,
                 backoff_s: tuple[float, float] = (1.0, 30.0), timeout_s: float = 60.0) -> None:
        self.engine_url, self._timeout_s = engine_url, timeout_s
        self._headers = bearer_token(api_key) if api_key else {}
        self.max_tokens, self.pause_s, self.backoff_s = max_tokens, pause_s, backoff_s
        self.answered = self.failed = 0  # counts, for the curious and the tests
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="seam-demo-traffic", daemon=True)

    def start(self) -> DemoTraffic:
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask the loop to end and wait (up to `timeout_s`) for a request in flight to finish."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        # The loop's thread owns the client, so it is never closed under a request in flight.
        with httpx.Client(base_url=self.engine_url, headers=self._headers, timeout=self._timeout_s) as client:
            self._loop(client)

    def _loop(self, client: httpx.Client) -> None:
        backoff, failing = self.backoff_s[0], False
        for prompt in itertools.cycle(PROMPTS):
            if self._stop.is_set():
                return
            problem = self._send(client, prompt)
            if problem is None:
                self.answered += 1
                log.debug("demo traffic: completion %d answered", self.answered)
                if failing:
                    log.info("demo traffic: the engine answers again")
                backoff, failing, pause = self.backoff_s[0], False, self.pause_s
            else:
                self.failed += 1
                if not failing:
                    log.warning("demo traffic: %s; retrying with backoff up to %gs (logged once until it answers)",
                                problem, self.backoff_s[1])
                failing, pause = True, backoff
                backoff = min(backoff * 2, self.backoff_s[1])
            self._stop.wait(pause)

    def _send(self, client: httpx.Client, prompt: str) -> str | None:
        """None when the engine answered the completion; else what went wrong, in words."""
        try:
            reply = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": self.max_tokens,
                                                          "user": "seam-demo-traffic"})
        except httpx.HTTPError as error:
            return f"the engine at {self.engine_url} cannot be reached ({type(error).__name__}: {error})"
        if reply.status_code == 401:
            return f"the engine refused /v1/completions (401): set {API_KEY_ENV} to the engine's API key"
        if reply.status_code != 200:
            return f"the engine answered /v1/completions with {reply.status_code}: {reply.text[:200]}"
        return None
