"""The engine as the audit trail's witness: verify holds the chain against the newest head the engine kept from the
attestations it accepted (engine/control/audit_witness.py), which the console's database writer cannot rewrite."""

from __future__ import annotations

from console.audit.verification import WitnessUnavailable
from console.engine import EngineClient, EngineError
from contracts.control import WitnessedHead

__all__ = ["engine_witness"]


def engine_witness(trail: str) -> WitnessedHead | None:
    """The engine's witnessed head of `trail` (None when it has none); WitnessUnavailable saying why it could not be
    asked (unreachable, refused, or an answer that makes no sense)."""
    try:
        with EngineClient() as client:
            return client.audit_head(trail)
    except EngineError as error:
        raise WitnessUnavailable(str(error)) from None
