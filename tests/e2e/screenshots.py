"""`make screenshots`: the real stack and Chromium, driven through a reconfiguration, photographing the
frontier (a point hovered), a finished job (predicted vs measured) and the dashboard after the change.

    python -m tests.e2e.screenshots docs/img
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.support.browser import chromium, log_in
from tests.support.pages import click_frontier_point, frontier_markers, propose, wait_for_seq_above
from tests.support.stack import running_stack


@contextmanager
def _traffic(engine_url: str, seconds: float, clients: int = 4) -> Iterator[None]:
    """A few clients sending completions to the engine, bounded in time."""
    stop = time.monotonic() + seconds

    def client(n: int) -> None:
        with httpx.Client(base_url=engine_url, timeout=30) as http:
            while time.monotonic() < stop:
                http.post("/v1/completions", json={"prompt": f"The operator {n}", "max_tokens": 48, "seed": n})

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(clients)]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        for thread in threads:
            thread.join(timeout=60)


def take(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="seam-screenshots-") as scratch, running_stack(Path(scratch)) as stack, \
            chromium() as browser:
        _, operator = log_in(browser, stack, "operator")
        incumbent = operator.get_attribute("[data-testid=current-cut]", "data-cut")

        operator.goto(f"{stack.url}/frontier/")
        markers = frontier_markers(operator)[::-1]  # the roomiest cut first: every rank keeps some KV pool
        operator.mouse.move(markers[0]["px"], markers[0]["py"])  # the hover label, as an operator sees it
        operator.wait_for_selector("#frontier-chart .hoverlayer .hovertext")
        operator.screenshot(path=folder / "frontier.png", full_page=True)
        click_frontier_point(operator, avoid_cut=incumbent, markers=markers)
        job_id = propose(operator)

        _, reviewer = log_in(browser, stack, "reviewer")
        reviewer.goto(f"{stack.url}/jobs/{job_id}/")
        reviewer.click("[data-testid=approve-button]")
        operator.wait_for_function(
            "document.querySelector('[data-testid=job-status]').textContent.trim() === 'succeeded'", timeout=60_000)
        operator.wait_for_selector("[data-testid=measured-pool]")
        operator.screenshot(path=folder / "job.png", full_page=True)

        operator.goto(f"{stack.url}/")
        with _traffic(stack.engine_url, seconds=8):  # something for the throughput and queue sparklines
            wait_for_seq_above(operator, int(operator.inner_text("[data-testid=telemetry-seq]")) + 2)
            time.sleep(6)
            operator.screenshot(path=folder / "dashboard.png", full_page=True)
        for page in ("calibration", "predictions"):
            operator.goto(f"{stack.url}/{page}/")
            operator.screenshot(path=folder / f"{page}.png", full_page=True)
    pages = ("dashboard.png", "frontier.png", "job.png", "calibration.png", "predictions.png")
    return [folder / name for name in pages]


if __name__ == "__main__":
    for written in take(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/img")):
        print(f"wrote {written}")
