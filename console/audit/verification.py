"""Verify the audit trail: walk the keyed chain from the genesis and hold it against the anchor file.

What is caught: a row changed, removed or re-hashed without SEAM_AUDIT_KEY (its hash no longer matches
under the key); a keyed row downgraded to the unkeyed legacy scheme; an anchored event whose hash changed
(re-hashed by someone holding the key); the newest events deleted (the chain ends before the newest
anchored seq). What cannot be caught: someone holding both the key and the anchor file (docs/console.md).
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Any

from console.audit.anchor import Anchors, AnchorState, read_anchors
from console.audit.chain import CONTENT_FIELDS, compute_hash, event_content
from console.audit.models import GENESIS_HASH, AuditEvent, ChainScheme
from solvers.errors import SolverError

__all__ = ["VerifyResult", "verify_chain"]

_RECREATED = "or the database was recreated while an old anchor file was kept"


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

    def __str__(self) -> str:
        return f"{self.verdict}; {self.anchor_verdict}"


def verify_chain() -> VerifyResult:
    """Recompute every hash from the genesis, check every anchored (seq, hash), and name the first broken link."""
    # The anchors first: each is written after its event commits, so every one read now names an event
    # the walk below must find (events appended meanwhile only make the chain longer).
    anchors = read_anchors()
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
        prev_hash, checked = row["hash"], checked + 1
    if anchors.newest is not None and anchors.newest > checked:
        return _result(anchors, legacy, checked, checked + 1,
                       f"the anchor file names event #{anchors.newest} but the chain ends at #{checked}: "
                       f"events #{checked + 1}..#{anchors.newest} were deleted ({_RECREATED})")
    if anchors.state == AnchorState.INVALID:
        return _result(anchors, legacy, checked, None, anchors.note)
    return _result(anchors, legacy, checked, None, None)


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
    except SolverError as error:
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


def _result(anchors: Anchors, legacy: int, checked: int, first_broken: int | None, reason: str | None
            ) -> VerifyResult:
    return VerifyResult(ok=reason is None, checked=checked, first_broken=first_broken, reason=reason,
                        anchor=anchors.state, anchored_seq=anchors.newest,
                        anchor_note=anchors.note, legacy_events=legacy)
