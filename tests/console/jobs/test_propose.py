"""Proposing a job: the engine prices the plan; the console stores it, its hash and its prediction."""

import pytest

from console.audit.errors import AuditWriteRefused
from console.audit.models import AuditEvent
from console.jobs import lifecycle
from console.jobs.errors import Conflict, EngineUnavailable, InvalidProposal, NotAllowed, PlanInfeasible
from console.jobs.models import Job
from contracts.plan import plan_hash
from tests.support.jobs import other_cut
from tests.support.live_service import free_port

pytestmark = pytest.mark.django_db


def test_a_proposal_stores_the_engines_plan_hash_and_prediction(live_engine, operator):
    before = live_engine.state()
    cut = other_cut(live_engine)
    job = lifecycle.propose(operator, {"kind": "cut", "target": {"cut": cut}})
    assert (job.status, job.kind, job.target, job.proposer, job.proposer_name) == \
        ("proposed", "cut", {"cut": cut}, operator, "olga")
    assert job.plan_hash == plan_hash(job.plan)
    assert job.incumbent_fingerprint == before["fingerprint"]
    assert job.prediction == job.plan["predicted"]
    assert job.prediction["pool_tokens"] == live_engine.plan("cut", {"cut": cut})["plan"]["predicted"]["pool_tokens"]
    event = AuditEvent.objects.get(subject=f"job:{job.pk}")
    assert (event.action, event.actor, event.payload["plan_hash"]) == ("job.proposed", operator, job.plan_hash)
    assert live_engine.state()["fingerprint"] == before["fingerprint"]  # planning changes nothing


@pytest.mark.parametrize("roles", [("viewer",), ("reviewer",), ()])
def test_only_an_operator_proposes(live_engine, make_user, roles):
    user = make_user(*roles)
    with pytest.raises(NotAllowed, match="needs the operator role"):
        lifecycle.propose(user, {"kind": "cut", "target": {"cut": other_cut(live_engine)}})
    assert not Job.objects.exists()
    # The refused attempt is on the trail (issue 6), and it is the only event.
    assert list(AuditEvent.objects.values_list("action", "actor_name")) == [("job.propose_refused",
                                                                               user.get_username())]


@pytest.mark.parametrize("body, message, field", [
    ([1, 2], "body: expected a JSON object", None),
    ({"kind": "cut"}, "missing field(s) target", "target"),
    ({"kind": "cut", "target": {"cut": [8, 4, 4]}, "force": True}, "unknown field(s) force", "force"),
    ({"kind": "teleport", "target": {}}, "kind: 'teleport' is not a plan kind", "kind"),
    ({"kind": "cut", "target": [8, 4, 4]}, "target: expected an object, got list", "target"),
    ({"kind": "cut", "target": {"cut": [8, 8]}}, "target.cut: has 2 entries; the rig has 3 ranks", "target.cut"),
    ({"kind": "shape", "target": {"max_num_seqs": 0}}, "target.max_num_seqs: 0 is outside", "target.max_num_seqs"),
])
def test_a_bad_body_is_refused_naming_the_problem(live_engine, operator, body, message, field):
    with pytest.raises(InvalidProposal) as refused:
        lifecycle.propose(operator, body)
    assert message in str(refused.value) and refused.value.field == field and refused.value.status_code == 400
    assert not Job.objects.exists()


def test_an_infeasible_plan_is_refused_with_the_engines_reasons(live_engine, operator):
    with pytest.raises(PlanInfeasible) as refused:
        lifecycle.propose(operator, {"kind": "cut", "target": {"cut": [3, 12, 1]}})
    reasons = live_engine.plan("cut", {"cut": [3, 12, 1]})["reasons"]
    assert reasons and refused.value.reasons == reasons and reasons[0] in str(refused.value)
    assert not Job.objects.exists()


def test_a_proposal_for_a_layout_the_engine_has_left_is_refused(live_engine, operator):
    body = {"kind": "cut", "target": {"cut": other_cut(live_engine)}, "incumbent_fingerprint": "0123456789abcdef"}
    with pytest.raises(Conflict, match="the engine now runs layout"):
        lifecycle.propose(operator, body)


def test_an_unreachable_engine_is_named(operator, settings):
    settings.ENGINE_URL = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(EngineUnavailable, match=f"engine unreachable at {settings.ENGINE_URL}"):
        lifecycle.propose(operator, {"kind": "cut", "target": {"cut": [8, 4, 4]}})


def test_a_failed_audit_write_fails_the_proposal(live_engine, operator, monkeypatch):
    def refuse(**event):
        raise AuditWriteRefused("the audit trail is down")

    monkeypatch.setattr(lifecycle, "record", refuse)
    with pytest.raises(AuditWriteRefused):
        lifecycle.propose(operator, {"kind": "cut", "target": {"cut": other_cut(live_engine)}})
    assert not Job.objects.exists()
