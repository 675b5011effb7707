"""Verify the audit trail: walk the keyed chain from the genesis, hold it against the anchor file, and against the
head the engine witnessed (engine/control/audit_witness.py) when a witness is passed.

What is caught: a row changed, removed or re-hashed without SEAM_AUDIT_KEY (its hash no longer matches
under the key); a keyed row downgraded to the unkeyed legacy scheme; an anchored event whose hash changed
(re-hashed by someone holding the key); the newest events deleted (the chain ends before the newest
anchored seq); the anchor file missing, or deleted and recreated by a later event, while keyed events exist;
the database rolled back to an older copy, anchor file and all, once the engine witnessed a newer head (the chain
no longer holds the engine's seq with its hash). The table of who can do what is docs/console.md, "Trust model".
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from console.audit.anchor import Anchors, AnchorState, read_anchors
from console.audit.chain import CONTENT_FIELDS, compute_hash, event_content
from console.audit.models import GENESIS_HASH, AuditEvent, ChainScheme
from contracts.control import WitnessedHead
from contracts.errors import ContractError

__all__ = ["VerifyResult", "Witness", "WitnessState", "WitnessUnavailable", "verify_chain"]

_RECREATED = "or the database was recreated while an old anchor file was kept"
_REANCHOR = "find out why, then re-anchor knowingly with `manage.py reanchor_audit --reason ...` (an audited step)"


class WitnessState(StrEnum):
    WITNESSED = "witnessed"  # the chain holds the head the engine witnessed
    UNWITNESSED = "unwitnessed"  # the engine has witnessed no head of this trail yet (no job applied since it began)
    UNREACHABLE = "unreachable"  # the engine could not be asked: a rollback cannot be ruled out
    NOT_CHECKED = "not checked"  # no witness was asked (the trail is empty, or the caller passed none)


class WitnessUnavailable(Exception):
    """The witness could not be read; the message says why."""


# trail (the first event's hash) -> the engine's witnessed head of it, or None
Witness = Callable[[str], WitnessedHead | None]


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    checked: int  # events whose links verified, in seq order
    first_broken: int | None  # seq of the first event whose link is broken (for a truncation: the first missing)
    reason: str | None
    anchor: AnchorState  # whether the chain could be held against the anchor file
    anchored_seq: int | None  # the newest seq the anchor file validly names; None when it names none
    anchor_note: str | None  # why it is not anchored
    legacy_events: int  # unkeyed sha256 events, recorded before the chain was keyed
    witness: WitnessState = WitnessState.NOT_CHECKED
    witnessed_seq: int | None = None  # the seq the engine witnessed, where it named one
    witness_note: str | None = None  # why it is not witnessed

    @property
    def verdict(self) -> str:
        """The chain's verdict, for one line of a page or a terminal."""
        if not self.ok:
            where = "" if self.first_broken is None else f" at event #{self.first_broken}"
            return f"broken{where} after {self.checked} good events: {self.reason}"
        legacy = f" ({self.legacy_events} unkeyed, recorded before the chain was keyed)" if self.legacy_events else ""
        return f"ok: {self.checked} events{legacy}"

    @property
    def anchor_verdict(self) -> str:
        if self.anchor == AnchorState.ANCHORED:
            return f"anchored at event #{self.anchored_seq}"
        return f"NOT anchored ({self.anchor}): {self.anchor_note}; deleting the newest events would go unnoticed"

    @property
    def witness_verdict(self) -> str:
        if self.witness == WitnessState.WITNESSED:
            return f"holds event #{self.witnessed_seq} the engine witnessed"
        return f"NOT witnessed ({self.witness}): {self.witness_note}"

    def __str__(self) -> str:
        checked = "" if self.witness == WitnessState.NOT_CHECKED else f"; {self.witness_verdict}"
        return f"{self.verdict}; {self.anchor_verdict}{checked}"


def verify_chain(witness: Witness | None = None) -> VerifyResult:
    """Recompute every hash from the genesis, check every anchored (seq, hash) and the head `witness` names (the
    engine's, console.audit.witness), and name the first broken link."""
    # The anchors first: each is written after its event commits, so every one read now names an event
    # the walk below must find (events appended meanwhile only make the chain longer).
    anchors = read_anchors()
    # The witness too: it names an event committed before this read, which the walk must find.
    trail = AuditEvent.objects.order_by("seq").values_list("hash", flat=True).first()
    head, witnessed = _read_witness(witness, trail)
    found: str | None = None  # the chain's hash at the witnessed seq
    prev_hash, checked, legacy, first_keyed = GENESIS_HASH, 0, 0, None
    rows = AuditEvent.objects.order_by("seq").values(*CONTENT_FIELDS, "id", "prev_hash", "hash", "scheme")
    for row in rows.iterator(chunk_size=2000):
        seq = row["seq"]
        reason = _broken_link(row, checked + 1, prev_hash, first_keyed) or _unanchored_hash(row, anchors)
        if reason is not None:
            return _result(anchors, legacy, checked, seq, f"event #{seq} (id {row['id']}): {reason}")
        if row["scheme"] == ChainScheme.SHA256:
            legacy += 1
        elif first_keyed is None:
            first_keyed = seq
        if head is not None and seq == head.seq:
            found = row["hash"]
        prev_hash, checked = row["hash"], checked + 1
    if anchors.newest is not None and anchors.newest > checked:
        return _result(anchors, legacy, checked, checked + 1,
                       f"the anchor file names event #{anchors.newest} but the chain ends at #{checked}: "
                       f"events #{checked + 1}..#{anchors.newest} were deleted ({_RECREATED})")
    reason = anchors.note if anchors.state == AnchorState.INVALID else _unsound_anchor(anchors, first_keyed)
    return _result(anchors, legacy, checked, None, reason or _rolled_back(head, found, checked), witnessed)


def _broken_link(row: dict[str, Any], expected: int, prev_hash: str, first_keyed: int | None) -> str | None:
    seq, scheme = row["seq"], row["scheme"]
    if seq != expected:
        return f"seq {seq} where {expected} was expected: events are missing or out of order"
    if not hmac.compare_digest(row["prev_hash"], prev_hash):
        where = "the genesis value" if expected == 1 else f"the hash of event #{expected - 1}"
        return f"prev_hash is not {where}: the chain was cut or an earlier event rewritten"
    if scheme not in ChainScheme.values:
        return f"unknown hash scheme {scheme!r}"
    if scheme == ChainScheme.SHA256 and first_keyed is not None:
        return (f"unkeyed sha256 after keyed event #{first_keyed}: keyed events were downgraded to the legacy "
                "scheme, to be re-hashed without the key")
    try:
        recomputed = compute_hash(prev_hash, event_content(row), scheme=scheme)
    except ContractError as error:
        return f"content cannot be hashed ({error})"
    if hmac.compare_digest(recomputed, row["hash"]):
        return None
    keyed = " under SEAM_AUDIT_KEY" if scheme == ChainScheme.HMAC_SHA256 else ""
    return (f"hash does not match the event's content{keyed}: the row was changed after it was recorded (or "
            "re-hashed without the key, or recorded under another SEAM_AUDIT_KEY)")


def _unanchored_hash(row: dict[str, Any], anchors: Anchors) -> str | None:
    anchored = anchors.hashes.get(row["seq"])
    if anchored is None or hmac.compare_digest(anchored, row["hash"]):
        return None
    return (f"hash differs from the one anchored for event #{row['seq']}: the trail was rewritten and re-hashed "
            f"after it was anchored ({_RECREATED})")


def _unsound_anchor(anchors: Anchors, first_keyed: int | None) -> str | None:
    """Why the anchor file cannot vouch for the keyed events: it is missing or unreadable, or it begins after the
    first keyed event without a keyed line saying why (deleted, then recreated by the next append)."""
    if first_keyed is None:
        return None  # nothing keyed to anchor yet: a fresh trail verifies without a file
    if anchors.state in (AnchorState.MISSING, AnchorState.UNREADABLE):
        return (f"the chain holds keyed events but {anchors.note}: deleting the newest events could not be "
                f"caught; {_REANCHOR}")
    if anchors.opened is None and anchors.oldest is not None and anchors.oldest > first_keyed:
        return (f"the anchor file begins at event #{anchors.oldest}, after the first keyed event #{first_keyed}, "
                f"and no line under SEAM_AUDIT_KEY says it was rotated or re-anchored: it was deleted and recreated "
                f"by a later event, or cut from its head; {_REANCHOR}")
    return None


@dataclass(frozen=True)
class _Witnessed:
    state: WitnessState = WitnessState.NOT_CHECKED
    seq: int | None = None
    note: str | None = "verify was not asked to hold the chain against the engine's witnessed head"


def _read_witness(witness: Witness | None, trail: str | None) -> tuple[WitnessedHead | None, _Witnessed]:
    """The head `witness` names for `trail` (None when none) and what to say about it."""
    if witness is None:
        return None, _Witnessed()
    if trail is None:
        return None, _Witnessed(note="the trail is empty: there is no head to witness")
    try:
        head = witness(trail)
    except WitnessUnavailable as error:
        return None, _Witnessed(WitnessState.UNREACHABLE, note=f"the engine's witnessed head could not be read "
                                                               f"({error}): a rollback of the database cannot be "
                                                               "ruled out")
    if head is None:
        return None, _Witnessed(WitnessState.UNWITNESSED, note="the engine has witnessed no head of this trail yet "
                                                               "(no job was applied since the trail began)")
    return head, _Witnessed(WitnessState.WITNESSED, head.seq, None)


def _rolled_back(head: WitnessedHead | None, found: str | None, checked: int) -> str | None:
    """Why the chain does not hold the witnessed head: the database went back to an older (or another) copy."""
    if head is None:
        return None
    seq = head.seq
    if head.rollback_problem is not None:
        return f"rolled back: the engine refused this trail's attestation: {head.rollback_problem}"
    if found is None:
        return (f"rolled back: the engine witnessed event #{seq} but the chain ends at #{checked}: the database was "
                "restored to an older copy (with the anchor file cut to match, or the anchor would have said so)")
    if not hmac.compare_digest(found, head.hash):
        return (f"rolled back: event #{seq} is not the one the engine witnessed: the database was restored to "
                "another copy and rewritten from there on")
    return None


def _result(anchors: Anchors, legacy: int, checked: int, first_broken: int | None, reason: str | None,
            witnessed: _Witnessed | None = None) -> VerifyResult:
    witnessed = witnessed or _Witnessed()
    return VerifyResult(ok=reason is None, checked=checked, first_broken=first_broken, reason=reason,
                        anchor=anchors.state, anchored_seq=anchors.newest,
                        anchor_note=anchors.note, legacy_events=legacy, witness=witnessed.state,
                        witnessed_seq=witnessed.seq, witness_note=witnessed.note)
