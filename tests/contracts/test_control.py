"""The control API's replies (contracts/control.py): what the engine writes parses back to the same JSON, the fields an
older engine leaves out are optional, and a wrong field is refused by its path."""

from __future__ import annotations

import pytest

from contracts.control import (
    Accepted,
    EngineState,
    Health,
    LadderState,
    Operation,
    OperationList,
    OperationStatus,
    Refusal,
    Witnessed,
    WitnessedHead,
)
from contracts.errors import ContractError
from contracts.layout import Cut, ServingShape


def test_a_state_round_trips_exactly(state_wire):
    state = EngineState.from_dict(state_wire)
    assert state.to_dict() == state_wire
    assert state.cut == Cut((8, 4, 4)) and state.shape == ServingShape.from_dict(state_wire["shape"])
    assert state.measurement.cut == state.cut and state.health.ok and state.ladder.current == Cut((8, 4, 4))
    assert state.ladder.pool_tokens == {"8,4,4": 9136, "7,5,4": None}  # `pools` on the wire
    assert state.layout() == {"fingerprint": "0123456789abcdef", "cut": [8, 4, 4], "shape": state_wire["shape"]}


def test_an_unarmed_ladder_is_just_that():
    assert LadderState.from_dict({"armed": False}).to_dict() == {"armed": False}


def test_a_state_of_an_older_engine_leaves_the_optional_fields_empty(state_wire):
    for name in ("model", "rig", "boot_id", "pool_tokens", "binding_rank", "ranks", "ladder", "notes", "measurement",
                 "health"):
        del state_wire[name]
    state = EngineState.from_dict(state_wire)
    assert (state.boot_id, state.pool_tokens, state.ranks, state.ladder, state.measurement) == (None, None, (), None,
                                                                                                None)


@pytest.mark.parametrize(("name", "value", "message"), [
    ("fingerprint", "", "fingerprint: expected a non-empty string"),
    ("cut", [8, 0, 8], r"cut\[1\]: every rank needs at least 1 layer"),
    ("cut", "8,4,4", "cut: expected a list of layer counts"),
    ("shape", {"max_model_len": 0}, r"shape\.max_model_len: must be a positive integer"),
    ("phase", None, "phase: expected a string"),
    ("pool_tokens", -1, "pool_tokens: expected a whole number >= 0"),
    ("ranks", [1, 2], "ranks: expected one object per rank"),
    ("ladder", {"armed": "yes"}, r"ladder\.armed: expected true or false"),
    ("notes", "a note", "notes: expected a list of strings"),
    ("health", {"ok": True}, r"health\.phase: missing"),
])
def test_a_wrong_state_field_is_named(state_wire, name, value, message):
    state_wire[name] = value
    with pytest.raises(ContractError, match=message):
        EngineState.from_dict(state_wire)


def test_a_state_without_its_layout_is_refused(state_wire):
    del state_wire["fingerprint"]
    with pytest.raises(ContractError, match="^fingerprint: missing$"):
        EngineState.from_dict(state_wire)
    with pytest.raises(ContractError, match="expected an object, got list"):
        EngineState.from_dict([state_wire])


def test_a_measurement_that_does_not_parse_leaves_the_state_readable(state_wire):
    del state_wire["measurement"]["model"]
    state = EngineState.from_dict(state_wire)
    assert state.measurement is None and state.measurement_error == "measurement.model: missing"
    assert state.fingerprint == "0123456789abcdef"


def test_an_operation_round_trips_exactly(operation_wire):
    operation = Operation.from_dict(operation_wire)
    assert operation.to_dict() == operation_wire
    assert operation.status is OperationStatus.ROLLED_BACK and operation.status.done and operation.job_id == 7


@pytest.mark.parametrize(("status", "done"), [("queued", False), ("running", False), ("succeeded", True),
                                               ("failed", True), ("rolled_back", True)])
def test_only_the_three_endings_are_done(status, done):
    assert OperationStatus(status).done is done


def test_the_fields_an_older_engine_leaves_out_of_an_operation_are_optional(operation_wire):
    for name in ("kind", "target", "plan_hash", "previous", "notes", "job_id", "started", "finished"):
        del operation_wire[name]
    operation = Operation.from_dict(operation_wire)
    assert (operation.plan_hash, operation.previous, operation.notes, operation.job_id) == (None, None, (), None)


@pytest.mark.parametrize(("name", "value", "message"), [
    ("status", "paused", r"operation\.status: expected one of queued, running, succeeded, failed, rolled_back"),
    ("id", "", r"operation\.id: expected a non-empty string"),
    ("progress", -0.5, r"operation\.progress: expected a finite number >= 0"),
    ("predicted", [1], r"operation\.predicted: expected an object"),
    ("job_id", 0, r"operation\.job_id: expected a positive integer or null"),
    ("job_id", True, r"operation\.job_id: expected a positive integer or null"),
    ("notes", [1], r"operation\.notes\[0\]: expected a string"),
])
def test_a_wrong_operation_field_is_named(operation_wire, name, value, message):
    operation_wire[name] = value
    with pytest.raises(ContractError, match=message):
        Operation.from_dict(operation_wire)


def test_an_operation_without_a_status_is_refused(operation_wire):
    del operation_wire["status"]
    with pytest.raises(ContractError, match=r"operation\.status: missing"):
        Operation.from_dict(operation_wire)


def test_health_round_trips_and_names_a_wrong_field(state_wire):
    health = Health.from_dict(state_wire["health"])
    assert health.to_dict() == state_wire["health"] and health.ok
    with pytest.raises(ContractError, match=r"health\.recoveries: expected a whole number >= 0"):
        Health.from_dict({**state_wire["health"], "recoveries": -1})


def test_a_witnessed_head_round_trips_and_says_its_rollback():
    head = {"trail": "a" * 64, "seq": 12, "hash": "b" * 64, "issued_at": 1700000000.0,
            "rolled_back": {"from_seq": 40, "to_seq": 12, "hash": "c" * 64, "issued_at": 1700000100.0,
                            "problem": "the console's audit trail went back"}}
    witnessed = WitnessedHead.from_dict(head)
    assert witnessed.to_dict() == head and witnessed.rollback_problem == "the console's audit trail went back"
    assert WitnessedHead.from_dict({**head, "rolled_back": None}).rollback_problem is None
    with pytest.raises(ContractError, match=r"witnessed\.seq: expected a whole number >= 0"):
        WitnessedHead.from_dict({**head, "seq": "12"})


def test_figures_carry_the_switch_times_only_when_there_are_some(operation_wire):
    operation_wire["predicted"]["switch_cost_s"] = 0.25
    operation_wire["measured"]["switch_s"] = 0.5
    operation = Operation.from_dict(operation_wire)
    assert operation.to_dict() == operation_wire
    assert (operation.predicted.switch_cost_s, operation.measured.switch_s) == (0.25, 0.5)
    assert "switch_s" not in operation.predicted.to_dict() and "switch_cost_s" not in operation.previous.to_dict()
    with pytest.raises(ContractError, match=r"operation\.measured\.pool_tokens: expected a whole number >= 0"):
        Operation.from_dict({**operation_wire, "measured": {"pool_tokens": -1, "binding_rank": 1, "ranks": []}})
    with pytest.raises(ContractError, match=r"operation\.predicted\.ranks: expected one object per rank"):
        Operation.from_dict({**operation_wire, "predicted": {"pool_tokens": 1, "binding_rank": 1, "ranks": [3]}})


def test_a_list_of_operations_names_the_one_that_is_wrong(operation_wire):
    listed = {"operations": [operation_wire, {**operation_wire, "status": "lost"}]}
    with pytest.raises(ContractError, match=r"^operations\[1\]\.status: expected one of"):
        OperationList.from_dict(listed)
    assert OperationList.from_dict({"operations": [operation_wire]}).to_dict() == {"operations": [operation_wire]}
    with pytest.raises(ContractError, match="^operations: expected a list"):
        OperationList.from_dict({"operations": {}})


def test_the_small_replies():
    assert Accepted.from_dict({"operation_id": "op-1"}).to_dict() == {"operation_id": "op-1"}
    with pytest.raises(ContractError, match="^operation_id: expected a non-empty string"):
        Accepted.from_dict({"operation_id": ""})
    assert Refusal.from_dict({"error": "busy"}).message == "busy"
    with pytest.raises(ContractError, match="^error: missing"):
        Refusal.from_dict({"detail": "busy"})
    assert Witnessed.from_dict({"witnessed": None}).witnessed is None
    with pytest.raises(ContractError, match=r"^witnessed\.trail: missing"):
        Witnessed.from_dict({"witnessed": {"seq": 1}})
