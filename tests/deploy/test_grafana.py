"""deploy/grafana/seam.json: a dashboard Grafana can import, whose every query names what the real engine and console
expose."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.metrics import selectors, unknown_in

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "seam.json"
# What an operator asked to see on it (issue 34): each must be the subject of some query.
COVERED = ("seam_request_success_total", "seam_prompt_tokens_total", "seam_generation_tokens_total",
           "seam_time_to_first_token_seconds_bucket", "seam_inter_token_latency_seconds_bucket",
           "seam_e2e_request_latency_seconds_bucket", "seam_request_queue_time_seconds_bucket",
           "seam_kv_cache_usage_perc", "seam_rank_stage_time_seconds_bucket", "seam_num_preemptions_total",
           "seam_recoveries_total", "seam_operations_total", "seam_jobs", "seam_job_speed_verdicts_total",
           "seam_prediction_pool_error_ratio")


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _queries(dashboard: dict) -> list[tuple[str, str]]:
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel.get("targets", [])]


def test_the_dashboard_is_importable():
    dashboard = _dashboard()
    assert dashboard["uid"] == "seam" and dashboard["title"] and isinstance(dashboard["schemaVersion"], int)
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    [variable] = dashboard["templating"]["list"]
    assert (variable["type"], variable["name"], variable["query"]) == ("datasource", "datasource", "prometheus")
    for panel in dashboard["panels"]:
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"} and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        if panel["type"] != "row":
            assert panel["targets"], f"panel {panel['title']!r} has no query"
            assert panel["datasource"]["uid"] == "${datasource}"
            assert len({target["refId"] for target in panel["targets"]}) == len(panel["targets"])


def test_the_dashboard_covers_what_the_issue_asks_for():
    named = {name for _, expr in _queries(_dashboard()) for name, _ in selectors(expr)}
    assert not set(COVERED) - named


def test_every_query_names_what_the_services_expose(exposed):
    problems = {f"{title}: {expr}": unknown for title, expr in _queries(_dashboard())
                if (unknown := exposed.unknown_in(expr))}
    assert not problems


def test_the_check_catches_a_misspelt_name(exposed):
    """Guard: the check above must be able to fail."""
    assert exposed.unknown_in("rate(seam_generation_token_total[5m])") == ["metric seam_generation_token_total"]
    assert exposed.unknown_in('seam_jobs_finished_total{status="failled"}') == [
        'seam_jobs_finished_total{status="failled"}']
    assert exposed.unknown_in("sum by (reason) (rate(seam_request_success_total[5m]))") == ["grouping label reason"]


@pytest.mark.parametrize("expr", ["", "sum(rate(x[5m]))"])
def test_a_query_without_a_seam_metric_is_reported(expr):
    assert unknown_in(expr, {}) == ["no metric at all"]
