"""The frontier page in a real browser (Debian's Chromium) at the operators' 1400 px window: nothing wider than the
window, the points table inside its box without scrolling.

The page is served by pytest-django's live_server from this test's database. Playwright's sync API runs an event
loop in this thread while it is started (tests/support/browser.py), so every ORM call here happens before Chromium
starts, and the browser gets the session through its cookie instead of the login form.
"""

import pytest
from django.conf import settings
from django.test import Client

from tests.support.browser import WINDOW, chromium
from tests.support.calibration import record_measurement, stages
from tests.support.live_service import free_port

pytestmark = pytest.mark.django_db(transaction=True)

FITS = """() => {
  const table = document.querySelector('#frontier-points');
  const box = table.parentElement;
  return {document: document.documentElement.scrollWidth, window: window.innerWidth,
          table: Math.ceil(table.getBoundingClientRect().width), box: box.clientWidth, boxScroll: box.scrollWidth,
          rows: document.querySelectorAll('[data-testid=frontier-point]').length};
}"""


def test_the_frontier_page_fits_a_1400_px_window(live_server, make_user, settings_override):
    # Measured cuts carry the widest cells (stage ms per rank, samples, pool), with figures of four decimals.
    record_measurement([7, 5, 4], stages([7, 5, 4]))
    record_measurement([8, 4, 4], [16.3969, 10.5071, 12.9725])
    record_measurement([8, 4, 4], [16.4102, 10.4987, 12.9911])
    client = Client()
    client.force_login(make_user("viewer", name="vera"))
    session = client.cookies[settings.SESSION_COOKIE_NAME].value
    with chromium() as browser:
        context = browser.new_context(viewport=WINDOW)
        context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": session, "url": live_server.url}])
        page = context.new_page()
        page.goto(f"{live_server.url}/frontier/")
        page.wait_for_selector("#frontier-chart .main-svg")  # laid out with the chart drawn
        measured = page.evaluate(FITS)
        context.close()
    assert measured["rows"] >= 2, measured
    assert measured["window"] == WINDOW["width"] and measured["document"] <= WINDOW["width"], measured
    assert measured["table"] <= measured["box"] and measured["boxScroll"] <= measured["box"], measured


@pytest.fixture
def settings_override(settings):
    """Nothing listens at the engine's URL: the incumbent is the newest measured layout, whatever runs nearby."""
    settings.ENGINE_URL = f"http://127.0.0.1:{free_port()}"
