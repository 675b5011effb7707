"""deploy/prometheus/alerts.yml: Prometheus rule groups (parsed with PyYAML) whose every alert has a for:, a severity,
a summary and a description, and whose every expr names what the real engine and console expose."""

from __future__ import annotations

from pathlib import Path

import yaml

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "alerts.yml"
# What the issue asks to be alerted on, by alert name.
EXPECTED = {"SeamEngineDown", "SeamRecoveryLoop", "SeamKVPoolNearlyFull", "SeamUnexplainedLayoutChange",
            "SeamJobFailed", "SeamPredictionMissed", "SeamAuditVerifyFailing"}


def _rules() -> list[dict]:
    document = yaml.safe_load(RULES.read_text())
    assert set(document) == {"groups"}
    for group in document["groups"]:
        assert set(group) == {"name", "rules"} and group["rules"]
    return [rule for group in document["groups"] for rule in group["rules"]]


def test_every_alert_is_complete():
    rules = _rules()
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names)) and set(names) >= EXPECTED
    for rule in rules:
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert isinstance(rule["expr"], str) and rule["expr"].strip()
        assert rule["for"][:-1].isdigit() and rule["for"][-1] in "smh", rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        assert set(rule["annotations"]) == {"summary", "description"}, rule["alert"]
        assert all(text.strip() for text in rule["annotations"].values())


def test_every_expr_names_what_the_services_expose(exposed):
    problems = {rule["alert"]: unknown for rule in _rules() if (unknown := exposed.unknown_in(rule["expr"]))}
    assert not problems
