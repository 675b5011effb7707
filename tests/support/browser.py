"""Debian's Chromium under Playwright, logging in through the real login page, and what a page received.

Playwright's sync API keeps an event loop running in this thread while it is started, so modules that use it
never touch the Django ORM: they see the stack only through the browser and the HTTP API. For the same reason the
`browser` fixture is one per test module, not per session: the rest of the suite's Django tests must never see
that loop.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, WebSocket, sync_playwright

from tests.support.stack import PASSWORD, Stack

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
WINDOW = {"width": 1400, "height": 1000}


@contextmanager
def chromium() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `make test` (or `apt-get install chromium`) installs Debian's Chromium")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def log_in(browser: Browser, stack: Stack, username: str) -> tuple[BrowserContext, Page]:
    """A fresh browser context (its own cookies) logged in as `username` through the login form."""
    context = browser.new_context(viewport=WINDOW)
    context.set_default_timeout(15_000)
    page = context.new_page()
    page.goto(f"{stack.url}/")  # every page requires login: this lands on the login form
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_selector("[data-testid=nav-user]")
    assert username in page.inner_text("[data-testid=nav-user]")
    return context, page


class SocketLog:
    """Every message the page's live websockets received (across reconnects): telemetry seqs and job updates."""

    def __init__(self, page: Page) -> None:
        self.messages: list[dict] = []
        self.sockets = 0
        page.on("websocket", self._opened)

    def _opened(self, socket: WebSocket) -> None:
        self.sockets += 1
        socket.on("framereceived", self._frame)

    def _frame(self, payload: str | bytes) -> None:
        with suppress(ValueError, TypeError):
            self.messages.append(json.loads(payload))

    def telemetry_seqs(self) -> list[int]:
        """Seqs in arrival order: pushed snapshots and the ones fetched to fill a gap."""
        seqs: list[int] = []
        for message in self.messages:
            if message.get("type") == "telemetry":
                seqs.append(message["snapshot"]["seq"])
            elif message.get("type") == "fetched":
                seqs.extend(snapshot["seq"] for snapshot in message["snapshots"])
        return seqs


# Records every value the page shows for these elements (a MutationObserver installed before any page script),
# kept in sessionStorage so the history survives the job page reloading itself when the job ends.
WATCH_SCRIPT = """
(() => {
  const stored = sessionStorage.getItem('__seen');
  window.__seen = stored ? JSON.parse(stored) : {seq: [], live: [], status: [], progress: []};
  const push = (key, value) => {
    const list = window.__seen[key];
    if (value === null || value === undefined || list[list.length - 1] === value) return;
    list.push(value);
    sessionStorage.setItem('__seen', JSON.stringify(window.__seen));
  };
  const sample = () => {
    const q = (id) => document.querySelector(`[data-testid=${id}]`);
    if (q('telemetry-seq')) push('seq', q('telemetry-seq').textContent.trim());
    if (q('live-status')) push('live', q('live-status').textContent.trim());
    if (q('job-status')) push('status', q('job-status').textContent.trim());
    if (q('job-progress')) push('progress', String(q('job-progress').value));
  };
  new MutationObserver(sample).observe(document, {subtree: true, childList: true, characterData: true,
                                                  attributes: true});
  document.addEventListener('DOMContentLoaded', sample);
})();
"""


def seen(page: Page, key: str) -> list[str]:
    return page.evaluate(f"window.__seen.{key}")


def watch_afresh(page: Page, url: str) -> None:
    """Open `url` with an empty history of what the page showed."""
    page.evaluate("sessionStorage.removeItem('__seen')")
    page.goto(url)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as launched:
        yield launched
