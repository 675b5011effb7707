"""Guarded steps for a one-shot device run: each step has a time budget and its outcome is recorded; a failure or a
timeout is written down and the run goes on. A watchdog writes the record and ends the run before the device call's
own limit would kill it with nothing written.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("seam.rig")


class Record:
    """The run's JSON, saved after every step; steps fill it in from their own threads."""

    def __init__(self, path: Path, data: dict):
        self.path, self.data, self.lock = path, data, threading.Lock()

    def save(self) -> None:
        with self.lock:
            for _ in range(5):  # a step thread may be adding to the record while it is written
                try:
                    text = json.dumps(self.data, indent=1, default=str)
                    break
                except RuntimeError:
                    time.sleep(0.05)
            else:
                return
            partial = self.path.with_suffix(".partial")
            partial.write_text(text)
            partial.replace(self.path)


class Steps:
    """Runs each step in a thread for at most its budget. A step that outlives its budget may still hold the engine,
    so later steps that need the engine are skipped; steps are also skipped when the run's own budget is short."""

    def __init__(self, record: Record, budget_s: float):
        self.record = record
        self.deadline = time.monotonic() + budget_s
        self.outcomes: dict[str, dict] = record.data.setdefault("steps", {})
        self.hung: str | None = None  # the step that timed out holding the engine

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, name: str, budget_s: float, function: Callable[..., Any], *args: Any, engine: bool = True,
            need_s: float | None = None, reserve_s: float = 0.0, skip: str | None = None) -> Any:
        """function(*args)'s value, or None when the step failed, timed out or was skipped (the reason recorded).

        `need_s`: the time the step usually takes (default: its budget), which must be left after `reserve_s`, the
        time kept for the steps after it; `skip`: a reason to skip it (an earlier step failed)."""
        outcome: dict[str, Any] = {"budget_s": budget_s}
        self.outcomes[name] = outcome
        need_s = budget_s if need_s is None else need_s
        if skip is None and engine and self.hung:
            skip = f"step {self.hung} timed out and may still hold the engine"
        if skip is None and self.left() - reserve_s < need_s:
            skip = (f"the run's time budget: {self.left():.0f} s left, {reserve_s:.0f} s kept for later steps, "
                    f"{need_s:.0f} s needed")
        if skip is not None:
            outcome.update(status="skipped", why=skip)
            log.warning("step %s skipped: %s", name, skip)
            self.record.save()
            return None
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["value"] = function(*args)
            except BaseException as error:  # recorded, never raised: the run goes on
                box["error"], box["trace"] = f"{type(error).__name__}: {error}", traceback.format_exc()

        log.info("step %s (budget %.0f s)", name, budget_s)
        started = time.monotonic()
        thread = threading.Thread(target=target, name=f"step-{name}", daemon=True)
        thread.start()
        thread.join(budget_s)
        outcome["seconds"] = round(time.monotonic() - started, 3)
        if thread.is_alive():
            outcome.update(status="timed_out", why=f"still running after its budget of {budget_s:.0f} s")
            self.hung = self.hung or (name if engine else None)
        elif "error" in box:
            outcome.update(status="failed", error=box["error"])
            log.error("step %s failed: %s\n%s", name, box["error"], box["trace"])
        else:
            outcome["status"] = "ok"
        log.info("step %s: %s in %.1f s", name, outcome["status"], outcome["seconds"])
        self.record.save()
        return box.get("value")


def arm_watchdog(record: Record, budget_s: float, stop: Callable[[], None]) -> threading.Timer:
    """After `budget_s`, mark the run aborted, save it, stop what `stop` stops (rank processes) and exit."""

    def expire() -> None:
        record.data["aborted"] = f"the run's watchdog fired after {budget_s:.0f} s"
        log.error(record.data["aborted"])
        record.save()
        try:
            stop()
        finally:
            os._exit(3)

    timer = threading.Timer(budget_s, expire)
    timer.daemon = True
    timer.start()
    return timer


def setup_logging(path: Path) -> None:
    """The run's log: this script's steps and the engine's warnings (rank tracebacks), to a file and stdout."""
    formatter = logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s")
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for handler in (logging.FileHandler(path), logging.StreamHandler()):
        handler.setFormatter(formatter)
        root.addHandler(handler)


def run_arguments(doc: str, budget_s: float) -> argparse.ArgumentParser:
    """The arguments every one-shot rig run takes; a script adds its own."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--toy", action="store_true", help="the CPU demo rig and model (a check of this script)")
    parser.add_argument("--budget-s", type=float, default=budget_s, help="the whole run's time budget")
    parser.add_argument("--work", type=Path, default=Path("/tmp/seam-rig"), help="where the configs are written")
    return parser


def begin_run(args: argparse.Namespace, name: str, case: dict, facts: dict) -> tuple[Record, list]:
    """<out>/<name>.json and <out>/<name>.log, and a watchdog that stops the drivers listed in the returned list."""
    args.out.mkdir(parents=True, exist_ok=True)
    setup_logging(args.out / f"{name}.log")
    record = Record(args.out / f"{name}.json", {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "argv": sys.argv, "case": case,
        "environment": facts, "budget_s": args.budget_s})
    live: list = []  # the drivers running now: the watchdog stops their ranks
    arm_watchdog(record, args.budget_s + 30, lambda: [p.kill() for d in live for p in d.ranks.processes])
    return record, live
