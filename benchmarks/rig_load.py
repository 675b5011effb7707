"""Requests streaming through the engine while it changes layout, each one accounted for.

A thread keeps `width` requests in flight, in waves. Every request is recorded: when it was submitted, when it was
seen done, and how it ended — finished (with its finish reason and token count), refused (with the engine's reason)
or lost (no answer at all within the wait). Nothing else may happen to a request.
"""

from __future__ import annotations

import threading
import time

import torch

from engine.control.driver import PipelineDriver
from engine.errors import EngineRequestError
from engine.runtime.sampler import SamplingParams

ANSWER_S = 600.0  # a request with no answer after this long is counted lost


class Load:
    def __init__(self, driver: PipelineDriver, prompt: int, tokens: int, width: int):
        self.driver, self.prompt, self.tokens, self.width = driver, prompt, tokens, width
        self.t0 = time.monotonic()
        self.requests: list[dict] = []
        self.handles: dict[int, object] = {}
        self.stop, self.running, self.idle = threading.Event(), threading.Event(), threading.Event()
        self.running.set()
        self.thread = threading.Thread(target=self._run, name="rig-load", daemon=True)
        self.thread.start()

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 3)

    def pause(self, timeout: float = 300.0) -> bool:
        """Let the current wave finish and submit nothing more until resumed (the ranks then idle)."""
        self.running.clear()
        return self.idle.wait(timeout)

    def resume(self) -> None:
        self.idle.clear()
        self.running.set()

    def streaming(self, timeout: float) -> bool:
        """Wait until a request in flight has produced tokens: the engine is mid-stream, not between waves."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(handle.token_ids and not handle.done.is_set() for handle in list(self.handles.values())):
                return True
            time.sleep(0.01)
        return False

    def in_flight(self) -> list[int]:
        return [record["id"] for record in list(self.requests) if "outcome" not in record]

    def _run(self) -> None:
        generator = torch.Generator().manual_seed(0)
        vocab = self.driver.config.vocab_size
        while not self.stop.is_set():
            if not self.running.is_set():
                self.idle.set()
                self.running.wait(0.1)
                continue
            wave = []
            for _ in range(self.width):
                prompt = torch.randint(0, vocab, (self.prompt,), generator=generator).tolist()
                record = {"id": None, "submitted": self.now()}
                try:
                    handle = self.driver.submit(prompt, SamplingParams(max_tokens=self.tokens, ignore_eos=True))
                except EngineRequestError as error:  # refused at the door, saying why: accounted, not lost
                    record.update(id=f"refused-{len(self.requests)}", outcome="refused", error=str(error),
                                  done=self.now())
                    self.requests.append(record)
                    continue
                record["id"] = handle.request_id
                self.handles[handle.request_id] = handle
                self.requests.append(record)
                wave.append((record, handle))
            for record, handle in wave:
                self._settle(record, handle)
            if not wave:
                time.sleep(0.5)  # the engine refuses everything: do not spin

    def _settle(self, record: dict, handle) -> None:
        if not handle.wait(timeout=ANSWER_S):
            record.update(outcome="lost", error=f"no answer in {ANSWER_S:.0f} s", done=self.now())
        elif handle.finish_reason == "refused" or handle.error:
            record.update(outcome="refused", error=handle.error, done=self.now(), tokens=len(handle.token_ids))
        else:
            record.update(outcome="finished", finish_reason=handle.finish_reason, tokens=len(handle.token_ids),
                          done=self.now())
        self.handles.pop(handle.request_id, None)

    def outcomes(self, ids: list | None = None) -> dict:
        """Counts by outcome (of `ids`, or of every request): submitted = finished + refused + lost + unsettled."""
        chosen = [r for r in list(self.requests) if ids is None or r["id"] in ids]
        counts = {"submitted": len(chosen), "finished": 0, "refused": 0, "lost": 0, "unsettled": 0}
        for record in chosen:
            counts[record.get("outcome", "unsettled")] += 1
        counts["refusals"] = sorted({r["error"] for r in chosen if r.get("outcome") == "refused"})
        short = [r["id"] for r in chosen if r.get("outcome") == "finished" and r["tokens"] != self.tokens]
        counts["finished_short"] = short  # a finished request must carry every token it asked for
        return counts

    def close(self, timeout: float = 120.0) -> dict:
        """Stop submitting, let the last wave settle (up to `timeout`), and account for every request."""
        self.stop.set()
        self.running.set()
        self.thread.join(timeout)
        return {**self.outcomes(), "requests": list(self.requests)}
