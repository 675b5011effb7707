"""The audit head's anchor: a file outside the database naming the newest events, checked by verify.

The keyed chain stops a database writer from re-hashing, but not from deleting the newest events: what
is left is still a valid chain. So after each append commits, `append_anchor` adds one line
`{"seq", "hash", "mac", "ts"}` to SEAM_AUDIT_ANCHOR_PATH, with `mac = HMAC(SEAM_AUDIT_KEY, seq:hash)`, so
the database writer can neither edit the file (it is not in the database) nor forge a line (no key).
`read_anchors` hands verify every anchored (seq, hash); verify checks each still exists with that hash and
that the chain reaches the newest one.

A file deleted (or lost) is recreated by the next append, which would hide that its earlier lines are gone; so a
file must name the chain's first keyed event, or open with a line `{"opened", "seq", "mac", "ts"}` saying, under the
key, why it began later: `rotation` (below) or `reanchor` (`manage.py reanchor_audit`, an audited operator step,
`reopen_anchor`). Verify fails on a file that does neither, and on a missing or empty one while keyed events exist.

Size: only the newest anchor is needed (each hash covers every earlier event through prev_hash); older
lines are history, and each line is checked while they are there. Past ROTATE_BYTES (about 5,000 lines)
the file is renamed to `<name>.1`, replacing the previous one, and a new one starts with the next
append (opening with a `rotation` line), so the two files stay near 2 MiB however long the trail grows (unless the
file is made append-only with `chattr +a`, which refuses the rename: then it grows, at ~190 bytes an event).
"""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import hmac
import json
import logging
import os
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from django.conf import settings

from console.audit.chain import chain_key
from contracts.canonical import canonical_json

__all__ = ["ROTATE_BYTES", "AnchorState", "Anchors", "Opening", "anchor_mac", "anchor_path", "append_anchor",
           "read_anchors", "reopen_anchor"]

logger = logging.getLogger(__name__)

ROTATE_BYTES = 1 << 20
# Sets the anchor's MAC apart from the chain's hashes, which are made under the same key.
_MAC_DOMAIN = "seam-audit-anchor:"
_OPENING_DOMAIN = "seam-audit-anchor-opened:"
_LINE_KEYS = {"seq", "hash", "mac", "ts"}
_OPENING_KEYS = {"opened", "seq", "mac", "ts"}


class Opening(StrEnum):
    """Why an anchor file begins after the chain's first keyed event (its first line says so, under the key)."""

    ROTATION = "rotation"  # the previous file grew past ROTATE_BYTES and was renamed to <name>.1
    REANCHOR = "reanchor"  # an operator re-anchored the trail (manage.py reanchor_audit, an audited event)


class AnchorState(StrEnum):
    ANCHORED = "anchored"  # the file names at least one event, every line verified
    MISSING = "missing"  # no anchor file, or an empty one: deleting the newest events cannot be ruled out
    UNREADABLE = "unreadable"  # the file is there but cannot be read: the same, and worth a look
    INVALID = "invalid"  # a line not made with the key: the file was written by someone else, or torn by a crash


@dataclass(frozen=True)
class Anchors:
    state: AnchorState
    hashes: dict[int, str] = field(default_factory=dict)  # seq -> anchored hash (the first line naming the seq)
    note: str | None = None  # why the state is not ANCHORED
    opened: Opening | None = None  # the file's first line, where it says why the file began late

    @property
    def newest(self) -> int | None:
        return max(self.hashes, default=None)

    @property
    def oldest(self) -> int | None:
        return min(self.hashes, default=None)


def anchor_path() -> Path:
    return Path(settings.SEAM_AUDIT_ANCHOR_PATH)


def anchor_mac(seq: int, hash_: str, key: bytes | None = None) -> str:
    message = f"{_MAC_DOMAIN}{seq}:{hash_}".encode("ascii")
    return hmac.new(chain_key() if key is None else key, message, hashlib.sha256).hexdigest()


def _opening_mac(opened: Opening, seq: int, key: bytes | None = None) -> str:
    message = f"{_OPENING_DOMAIN}{opened}:{seq}".encode("ascii")
    return hmac.new(chain_key() if key is None else key, message, hashlib.sha256).hexdigest()


def _timestamp() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")


def _anchor_line(seq: int, hash_: str) -> bytes:
    line = {"seq": seq, "hash": hash_, "mac": anchor_mac(seq, hash_), "ts": _timestamp()}
    return (canonical_json(line) + "\n").encode("ascii")


def _opening_line(opened: Opening, seq: int) -> bytes:
    line = {"opened": str(opened), "seq": seq, "mac": _opening_mac(opened, seq), "ts": _timestamp()}
    return (canonical_json(line) + "\n").encode("ascii")


def reopen_anchor(seq: int, hash_: str) -> None:
    """Replace the anchor file with one opened by a re-anchoring at event `seq` (which must be committed): the
    operator's way back from a missing or recreated file, after finding out why (manage.py reanchor_audit)."""
    path = anchor_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".reanchor")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, _opening_line(Opening.REANCHOR, seq) + _anchor_line(seq, hash_))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)


def append_anchor(seq: int, hash_: str) -> None:
    """Anchor event `seq`; run on commit, so an event that rolled back is never anchored.

    The event is committed already and a failure here cannot undo it, so it is logged as an error, not
    raised; the next append anchors a newer head, which covers this event too.
    """
    path = anchor_path()
    try:
        _append(path, seq, _anchor_line(seq, hash_))
    except OSError as error:
        logger.error("audit anchor NOT written: event #%s is committed but %s could not be appended (%s); "
                     "verify cannot tell whether events past the previous anchor were deleted until an append "
                     "succeeds", seq, path, error)


def _append(path: Path, seq: int, data: bytes) -> None:
    """One write under an exclusive lock, fsynced; rotates first when the file is past ROTATE_BYTES, and opens the
    file that follows a rotation with a line saying so."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rotated = False
    for _ in range(3):  # another writer may rotate the file while this one waits for the lock
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if not _is_current(fd, path):
                continue
            size = os.fstat(fd).st_size
            if size >= ROTATE_BYTES and _rotated(path):
                rotated = True
                continue
            os.write(fd, _opening_line(Opening.ROTATION, seq) + data if rotated and size == 0 else data)
            os.fsync(fd)
            return
        finally:
            os.close(fd)
    raise OSError(f"{path} kept being rotated away while waiting for its lock")


def _rotated(path: Path) -> bool:
    """Rename the full file to `<name>.1`; False where that is refused (an append-only `chattr +a` file, the
    strongest place for an anchor), which then just keeps growing."""
    try:
        os.replace(path, path.with_name(path.name + ".1"))
    except PermissionError:
        return False
    return True


def _is_current(fd: int, path: Path) -> bool:
    try:
        named = path.stat()
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (opened.st_dev, opened.st_ino) == (named.st_dev, named.st_ino)


def read_anchors(path: Path | None = None) -> Anchors:
    """Every (seq, hash) the anchor file names, each line's MAC checked under SEAM_AUDIT_KEY."""
    path = anchor_path() if path is None else path
    try:
        with path.open("rb") as file:
            fcntl.flock(file, fcntl.LOCK_SH)  # never a half-written line from an append in progress
            lines = file.read().splitlines()
    except FileNotFoundError:
        return Anchors(AnchorState.MISSING, note=f"there is no anchor file at {path}")
    except OSError as error:
        return Anchors(AnchorState.UNREADABLE, note=f"the anchor file {path} cannot be read ({error})")
    key = chain_key()
    opened = _parse_opening(lines[0], key) if lines else None
    hashes: dict[int, str] = {}
    invalid: str | None = None
    for number, raw in enumerate(lines, 1):
        if number == 1 and opened is not None:
            continue
        anchored = _parse(raw, key)
        if anchored is None:
            invalid = invalid or (f"line {number} of the anchor file {path} is not an anchor made with "
                                  "SEAM_AUDIT_KEY: someone else wrote to it, or a crash tore the line")
            continue
        hashes.setdefault(*anchored)  # the first line for a seq is the one written when it was recorded
    if invalid is not None:
        return Anchors(AnchorState.INVALID, hashes, invalid, opened)
    if not hashes:
        return Anchors(AnchorState.MISSING, note=f"the anchor file {path} is empty")
    return Anchors(AnchorState.ANCHORED, hashes, opened=opened)


def _parse_opening(raw: bytes, key: bytes) -> Opening | None:
    try:
        line = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(line, dict) or set(line) != _OPENING_KEYS or line["opened"] not in Opening.__members__.values():
        return None
    seq, mac = line["seq"], line["mac"]
    if not (type(seq) is int and seq > 0 and isinstance(mac, str) and mac.isascii()):
        return None
    opened = Opening(line["opened"])
    return opened if hmac.compare_digest(mac, _opening_mac(opened, seq, key)) else None


def _parse(raw: bytes, key: bytes) -> tuple[int, str] | None:
    try:
        line = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(line, dict) or set(line) != _LINE_KEYS:
        return None
    seq, hash_, mac = line["seq"], line["hash"], line["mac"]
    if not (type(seq) is int and seq > 0 and isinstance(hash_, str) and hash_.isascii()
            and isinstance(mac, str) and mac.isascii()):
        return None
    return (seq, hash_) if hmac.compare_digest(mac, anchor_mac(seq, hash_, key)) else None
