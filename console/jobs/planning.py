"""Turning an operator's body into a priced plan: check the body, ask the engine, check what it answered.

The engine prices the plan (one parser and one pricing for everyone, solvers.plans); the console checks the
body's shape first (so a malformed one gets a message without a round trip), then that the plan the engine
answered hashes to its plan_hash, is for this request and this layout, and is feasible; a refused shape comes back
with the longest max_model_len that would fit (console.jobs.shape_fit).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from console.engine import EngineClient, EngineError, EngineRefused, EngineUnreachable
from console.jobs.choices import JobKind
from console.jobs.errors import Conflict, EngineUnavailable, InvalidProposal, PlanInfeasible
from console.jobs.shape_fit import advise_length
from contracts.errors import ContractError
from contracts.plan import verify_plan

__all__ = ["BODY_FIELDS", "parse_body", "plan"]

BODY_FIELDS = ("kind", "target", "incumbent_fingerprint")


def parse_body(body: object) -> tuple[str, dict, str | None]:
    if not isinstance(body, dict):
        raise InvalidProposal(f"body: expected a JSON object with kind and target, got {type(body).__name__}")
    unknown = sorted(str(key) for key in body if key not in BODY_FIELDS)
    if unknown:
        raise InvalidProposal(f"body: unknown field(s) {', '.join(unknown)[:200]}; allowed: kind, target, "
                              "incumbent_fingerprint", unknown[0][:64])
    missing = [key for key in ("kind", "target") if key not in body]
    if missing:
        raise InvalidProposal(f"body: missing field(s) {', '.join(missing)}", missing[0])
    kind, target, seen = body["kind"], body["target"], body.get("incumbent_fingerprint")
    if kind not in JobKind.values:
        raise InvalidProposal(f"kind: {str(kind)[:40]!r} is not a plan kind; use one of: "
                              f"{', '.join(JobKind.values)}", "kind")
    if not isinstance(target, dict):
        raise InvalidProposal(f"target: expected an object, got {type(target).__name__}", "target")
    if seen is not None and not isinstance(seen, str):
        raise InvalidProposal(f"incumbent_fingerprint: expected a string, got {type(seen).__name__}",
                              "incumbent_fingerprint")
    return kind, target, seen


@contextmanager
def _engine(client: EngineClient | None, doing: str) -> Iterator[EngineClient]:
    """The given client or a fresh one; engine failures become the job errors callers map to HTTP."""
    own = client is None
    engine = client or EngineClient()
    try:
        yield engine
    except EngineUnreachable as error:
        raise EngineUnavailable(f"cannot {doing}: {error}") from error
    except EngineRefused as error:
        if 400 <= error.status < 500:
            raise InvalidProposal(error.message, _field_of(error.message)) from error
        raise EngineUnavailable(f"cannot {doing}: {error}") from error
    except EngineError as error:
        raise EngineUnavailable(f"cannot {doing}: {error}") from error
    finally:
        if own:
            engine.close()


def _field_of(message: str) -> str | None:
    """The engine names the field first ("target.cut[1]: ..."); keep it when it looks like one."""
    head = message.split(":", 1)[0]
    return head if head and len(head) <= 64 and " " not in head else None


def plan(kind: str, target: dict, seen: str | None, client: EngineClient | None) -> tuple[dict, str, dict]:
    """The engine's plan, its hash, and the layout it was made for ({fingerprint, cut, shape}: what a revert of the
    job goes back to)."""
    with _engine(client, "plan") as engine:
        state = engine.state()
        current = state.fingerprint
        if seen is not None and seen != current:
            raise Conflict(f"incumbent_fingerprint: the engine now runs layout {current}, not {seen[:40]}: "
                           "look at the current layout and plan again")
        reply = engine.plan(kind, target, current)
    plan = reply.plan.to_dict()
    try:
        verify_plan(plan, reply.plan_hash)
    except ContractError as error:
        raise EngineUnavailable(f"the engine's plan does not match its plan_hash: {error}") from error
    if reply.plan.kind != kind or reply.plan.incumbent_fingerprint != current:
        raise EngineUnavailable("the engine answered with a plan for another request "
                                f"({reply.plan.kind!r:.20} for {reply.plan.incumbent_fingerprint!r:.40})")
    if not reply.feasible or not reply.plan.feasible:
        advice = advise_length(reply.plan.target, state.cut, state.shape) if kind == JobKind.SHAPE else None
        raise PlanInfeasible(list(reply.reasons or reply.plan.reasons), advice)
    return plan, reply.plan_hash, state.layout()
