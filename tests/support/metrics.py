"""Reading a /metrics answer as Prometheus would (prometheus_client's own parser, every sample by name and labels),
and holding the PromQL of deploy/ (the Grafana dashboard, the alert rules) against what the real services expose.
The `exposed` fixture scrapes the run's engine service and the console."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse_samples(text: str) -> Samples:
    """{(sample name, sorted (label, value) pairs): value}; the parser refuses what a scraper would."""
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def scrape_text(client, path: str = "/metrics") -> str:
    """GET `path` with `client` (httpx's or Django's test client); the answer must be the exposition."""
    reply = client.get(path)
    assert reply.status_code == 200, reply
    assert reply.headers["content-type"] == CONTENT_TYPE_LATEST
    return reply.content.decode()


def scrape(client, path: str = "/metrics") -> Samples:
    return parse_samples(scrape_text(client, path))


def empty_families(text: str) -> set[str]:
    """Metrics declared (HELP, TYPE) with no sample now: a statistic with nothing yet to compute it from."""
    return {family.name for family in text_string_to_metric_families(text) if not family.samples}


def sample_names(samples: Samples) -> set[str]:
    return {name for name, _ in samples}


# --- PromQL in the deploy/ files, held against what the engine and the console expose ------------------------------

_SELECTOR = re.compile(r"\b(seam_[A-Za-z0-9_]+|up)\b(\{[^}]*\})?")
_MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"')
_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
# Prometheus' own series for every target it scrapes.
SYNTHETIC = {"up": {"job", "instance"}}


def selectors(expr: str) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """Each series selector of a PromQL expression: (metric name, [(label, operator, value)])."""
    return [(match[1], _MATCHER.findall(match[2] or "")) for match in _SELECTOR.finditer(expr)]


def unknown_in(expr: str, samples: Samples, empty: set[str] = frozenset()) -> list[str]:
    """What `expr` names that `samples` lack: a metric, a label of it, a value an `=` matcher wants, or a label it
    groups by that none of its metrics has. A metric of `empty` is known by name only."""
    labels_of: dict[str, set[str]] = {name: set(labels) for name, labels in SYNTHETIC.items()}
    values_of: dict[tuple[str, str], set[str]] = {}
    for name, labels in samples:
        labels_of.setdefault(name, set()).update(label for label, _ in labels)
        for label, value in labels:
            values_of.setdefault((name, label), set()).add(value)
    problems, used = [], set()
    found = selectors(expr)
    if not found:
        problems.append("no metric at all")
    for name, matchers in found:
        if name in empty and name not in labels_of:
            continue
        if name not in labels_of:
            problems.append(f"metric {name}")
            continue
        used |= labels_of[name]
        for label, operator, value in matchers:
            if label not in labels_of[name]:
                problems.append(f"label {label} of {name}")
            elif operator == "=" and name not in SYNTHETIC and value not in values_of[(name, label)]:
                problems.append(f'{name}{{{label}="{value}"}}')
    for grouping in _GROUPING.findall(expr):
        problems += [f"grouping label {label}" for label in (part.strip() for part in grouping.split(","))
                     if label and label not in used]
    return problems


@dataclass(frozen=True)
class Exposed:
    samples: Samples
    empty: set[str]

    def unknown_in(self, expr: str) -> list[str]:
        return unknown_in(expr, self.samples, self.empty)


@pytest.fixture
def exposed(live_engine, browse, viewer) -> Exposed:
    """Every metric the run's engine service and this console expose (the console asks that engine, too)."""
    texts = scrape_text(live_engine.client), scrape_text(browse(viewer), "/api/v1/metrics/")
    engine, console = (parse_samples(text) for text in texts)
    assert not sample_names(engine) & sample_names(console), "the engine and the console share a name"
    return Exposed({**engine, **console}, set().union(*(empty_families(text) for text in texts)))
