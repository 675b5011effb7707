"""Reading a /metrics answer as Prometheus would: prometheus_client's own parser, every sample by name and labels."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse_samples(text: str) -> Samples:
    """{(sample name, sorted (label, value) pairs): value}; the parser refuses what a scraper would."""
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def scrape(client, path: str = "/metrics") -> Samples:
    """GET `path` with `client` (httpx's or Django's test client) and parse it; the answer must be the exposition."""
    reply = client.get(path)
    assert reply.status_code == 200, reply
    assert reply.headers["content-type"] == CONTENT_TYPE_LATEST
    text = reply.text if hasattr(reply, "text") else reply.content.decode()
    return parse_samples(text)


def sample_names(samples: Samples) -> set[str]:
    return {name for name, _ in samples}
