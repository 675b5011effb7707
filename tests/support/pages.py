"""Steps on the console's pages, by the DOM contract (data-testid attributes), shared by the tests and
`make screenshots`."""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlparse

from playwright.sync_api import Page

# Pixel centre (in the page's viewport) and data of every plotted marker of the Plotly chart, from Plotly's own
# axes, so the click lands where the marker is drawn whatever the chart's size or axis type.
_MARKERS_SCRIPT = """
(gd) => {
  const rect = gd.getBoundingClientRect();
  const layout = gd._fullLayout;
  const markers = [];
  gd._fullData.forEach((trace, t) => {
    if (!trace.visible || trace.visible === 'legendonly' || !(trace.mode || '').includes('markers')) return;
    const xa = layout[(trace.xaxis || 'x').replace('x', 'xaxis')];
    const ya = layout[(trace.yaxis || 'y').replace('y', 'yaxis')];
    (trace.x || []).forEach((x, i) => {
      const y = trace.y[i];
      if (x === null || y === null) return;
      markers.push({trace: trace.name || '', index: t, point: i,
                    px: rect.left + xa._offset + xa.c2p(xa.d2c(x)), py: rect.top + ya._offset + ya.c2p(ya.d2c(y))});
    });
  });
  return markers;
}
"""


def current_seq(page: Page) -> int:
    return int(page.inner_text("[data-testid=telemetry-seq]"))


def wait_for_seq_above(page: Page, seq: int, timeout_ms: float = 15_000) -> int:
    page.wait_for_function("s => +document.querySelector('[data-testid=telemetry-seq]').textContent > s", arg=seq,
                           timeout=timeout_ms)
    return current_seq(page)


def frontier_markers(page: Page) -> list[dict]:
    """The chart's plotted markers other than the incumbent's, with their pixel centres in the viewport."""
    page.wait_for_selector("#frontier-chart .main-svg").scroll_into_view_if_needed()
    markers = page.evaluate(_MARKERS_SCRIPT, page.query_selector("#frontier-chart"))
    markers = [marker for marker in markers if "incumbent" not in marker["trace"].lower()]
    assert markers, "the frontier chart plots no markers"
    return markers


def click_frontier_point(page: Page, avoid_cut: str, markers: list[dict] | None = None) -> str:
    """Really click (mouse) plotted markers (by default all, in plotting order) until one opens a proposal for a
    cut other than `avoid_cut`. Returns the cut the proposal page was opened for, read from its URL."""
    markers = markers or frontier_markers(page)
    frontier_url = page.url
    for marker in markers:
        page.mouse.move(marker["px"], marker["py"])
        page.mouse.click(marker["px"], marker["py"])
        try:
            page.wait_for_url(re.compile(r"/jobs/new/\?"), timeout=3_000)
        except Exception:  # the click fell between markers or on a hover-only trace: try the next marker
            continue
        query = parse_qs(urlparse(page.url).query)
        assert query.get("kind") == ["cut"], page.url
        cut = query["cut"][0]
        if cut != avoid_cut:
            return cut
        page.goto(frontier_url)
        page.wait_for_selector("#frontier-chart .main-svg")
    raise AssertionError(f"no click on the {len(markers)} plotted markers opened a proposal for another cut")


def propose(page: Page) -> int:
    """Submit the open proposal form; returns the new job's id from the job page it redirects to."""
    page.click("[data-testid=propose-submit]")
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    return int(page.get_attribute("main[data-job-id]", "data-job-id"))


def tokens(page: Page, testid: str) -> int:
    return int(page.get_attribute(f"[data-testid={testid}]", "data-tokens"))
