"""The telemetry contract (contracts/telemetry.py): a snapshot round trips exactly, the pool is `pool_tokens` (kv on
the wire), a wrong field is named, and the Redis keys are made in one place."""

from __future__ import annotations

import pytest

from contracts.errors import ContractError
from contracts.layout import Cut
from contracts.telemetry import DEFAULT_CHANNEL, Snapshot, telemetry_keys


def test_a_snapshot_round_trips_exactly(snapshot_wire):
    snapshot = Snapshot.from_dict(snapshot_wire)
    assert snapshot.to_dict() == snapshot_wire
    assert snapshot.engine.cut == Cut((8, 8)) and snapshot.engine.measurement.cut == Cut((8, 8))
    assert [(rank.pool_tokens, rank.pool_tokens_used) for rank in snapshot.ranks] == [(9136, 96), (9136, 96)]


def test_the_fields_past_the_published_schema_are_optional(snapshot_wire):
    for name in ("fingerprint", "pool_tokens", "binding_rank", "preemptions", "healthy", "recoveries_in_a_row",
                 "recoveries", "measurement"):
        del snapshot_wire["engine"][name]
    del snapshot_wire["ranks"][0]["device_memory"]
    snapshot = Snapshot.from_dict(snapshot_wire)
    assert snapshot.engine.fingerprint is None and snapshot.engine.measurement is None
    assert snapshot.ranks[0].device_memory is None


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda s: s["ranks"][1]["kv"].update(tokens_used="96"), r"snapshot\.ranks\[1\]\.kv\.tokens_used: expected a"),
    (lambda s: s["ranks"][0]["used"].pop("arena"), r"snapshot\.ranks\[0\]\.used\.arena: missing"),
    (lambda s: s["engine"].pop("phase"), r"snapshot\.engine\.phase: missing"),
    (lambda s: s["engine"].update(cut=[8, 0]), r"snapshot\.engine\.cut\[1\]: every rank needs at least 1 layer"),
    (lambda s: s.update(ranks={}), r"snapshot\.ranks: expected a list"),
    (lambda s: s.update(seq=True), r"snapshot\.seq: expected a whole number"),
])
def test_a_wrong_snapshot_field_is_named(snapshot_wire, mutate, message):
    mutate(snapshot_wire)
    with pytest.raises(ContractError, match=message):
        Snapshot.from_dict(snapshot_wire)


def test_a_measurement_that_does_not_parse_leaves_the_snapshot_readable(snapshot_wire):
    snapshot_wire["engine"]["measurement"]["decode_tok_s"] = "fast"
    engine = Snapshot.from_dict(snapshot_wire).engine
    assert engine.measurement is None
    assert engine.measurement_error.startswith("snapshot.engine.measurement.decode_tok_s")


def test_the_keys_of_a_channel():
    assert telemetry_keys(DEFAULT_CHANNEL) == ("seam:telemetry:latest", "seam:telemetry:recent")
