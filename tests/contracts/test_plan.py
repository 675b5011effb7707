"""The plan reply (contracts/plan.py): a priced plan round trips exactly, so its hash survives the parse, and a wrong
field is named. Requests and hashes are tested with their pricing in tests/solvers/test_plans.py."""

from __future__ import annotations

import pytest

from contracts.errors import ContractError
from contracts.plan import Plan, PlanReply, plan_hash

PLAN = {"kind": "cut", "target": {"cut": [7, 5, 4]}, "incumbent_fingerprint": "0123456789abcdef",
        "predicted": {"cut": [7, 5, 4], "pool_tokens": 9000, "feasible": False, "reasons": ["rank 1: no room"]}}


def reply() -> dict:
    return {"plan": PLAN, "plan_hash": plan_hash(PLAN), "feasible": False, "reasons": ["rank 1: no room"]}


def test_a_plan_reply_round_trips_and_keeps_its_hash():
    parsed = PlanReply.from_dict(reply())
    assert parsed.to_dict() == reply() and parsed.plan.hash == parsed.plan_hash
    assert (parsed.plan.feasible, parsed.plan.reasons) == (False, ("rank 1: no room",))


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda r: r.update(feasible="no"), "^feasible: expected true or false"),
    (lambda r: r.update(reasons="none"), "^reasons: expected a list of strings"),
    (lambda r: r.update(plan_hash=None), "^plan_hash: expected a string"),
    (lambda r: r.pop("plan"), "^plan: missing"),
    (lambda r: r.update(plan={**PLAN, "kind": 3}), r"^plan\.kind: expected a string"),
    (lambda r: r.update(plan={**PLAN, "target": [7, 5, 4]}), r"^plan\.target: expected an object"),
    (lambda r: r.update(plan={**PLAN, "predicted": None}), r"^plan\.predicted: expected an object"),
])
def test_a_wrong_field_of_the_reply_is_named(mutate, message):
    data = reply()
    mutate(data)
    with pytest.raises(ContractError, match=message):
        PlanReply.from_dict(data)


def test_a_plan_that_says_nothing_of_feasibility_is_not_feasible():
    assert not Plan.from_dict({**PLAN, "predicted": {}}).feasible
