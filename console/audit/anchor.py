"""The audit head's anchor: a file outside the database naming the newest events, checked by verify.

The keyed chain stops a database writer from re-hashing, but not from deleting the newest events: what
is left is still a valid chain. So after each append commits, `append_anchor` adds one line
`{"seq", "hash", "mac", "ts"}` to SEAM_AUDIT_ANCHOR_PATH, with `mac = HMAC(SEAM_AUDIT_KEY, seq:hash)`, so
the database writer can neither edit the file (it is not in the database) nor forge a line (no key).
`read_anchors` hands verify every anchored (seq, hash); verify checks each still exists with that hash and
that the chain reaches the newest one.

Size: only the newest anchor is needed (each hash covers every earlier event through prev_hash); older
lines are history, and each line is checked while they are there. Past ROTATE_BYTES (about 5,000 lines)
the file is renamed to `<name>.1`, replacing the previous one, and a new one starts with the next
append, so the two files stay near 2 MiB however long the trail grows (unless the file is made
append-only with `chattr +a`, which refuses the rename: then it grows, at ~190 bytes an event).
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
from solvers.plans import canonical_json

__all__ = ["ROTATE_BYTES", "AnchorState", "Anchors", "anchor_mac", "anchor_path", "append_anchor", "read_anchors"]

logger = logging.getLogger(__name__)

ROTATE_BYTES = 1 << 20
# Sets the anchor's MAC apart from the chain's hashes, which are made under the same key.
_MAC_DOMAIN = "seam-audit-anchor:"
_LINE_KEYS = {"seq", "hash", "mac", "ts"}


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

    @property
    def newest(self) -> int | None:
        return max(self.hashes, default=None)


def anchor_path() -> Path:
    return Path(settings.SEAM_AUDIT_ANCHOR_PATH)


def anchor_mac(seq: int, hash_: str, key: bytes | None = None) -> str:
    message = f"{_MAC_DOMAIN}{seq}:{hash_}".encode("ascii")
    return hmac.new(chain_key() if key is None else key, message, hashlib.sha256).hexdigest()


def append_anchor(seq: int, hash_: str) -> None:
    """Anchor event `seq`; run on commit, so an event that rolled back is never anchored.

    The event is committed already and a failure here cannot undo it, so it is logged as an error, not
    raised; the next append anchors a newer head, which covers this event too.
    """
    path = anchor_path()
    timestamp = dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")
    line = canonical_json({"seq": seq, "hash": hash_, "mac": anchor_mac(seq, hash_), "ts": timestamp}) + "\n"
    try:
        _append(path, line.encode("ascii"))
    except OSError as error:
        logger.error("audit anchor NOT written: event #%s is committed but %s could not be appended (%s); "
                     "verify cannot tell whether events past the previous anchor were deleted until an append "
                     "succeeds", seq, path, error)


def _append(path: Path, data: bytes) -> None:
    """One write under an exclusive lock, fsynced; rotates first when the file is past ROTATE_BYTES."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(3):  # another writer may rotate the file while this one waits for the lock
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if not _is_current(fd, path):
                continue
            if os.fstat(fd).st_size >= ROTATE_BYTES and _rotated(path):
                continue
            os.write(fd, data)
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
    hashes: dict[int, str] = {}
    invalid: str | None = None
    for number, raw in enumerate(lines, 1):
        anchored = _parse(raw, key)
        if anchored is None:
            invalid = invalid or (f"line {number} of the anchor file {path} is not an anchor made with "
                                  "SEAM_AUDIT_KEY: someone else wrote to it, or a crash tore the line")
            continue
        hashes.setdefault(*anchored)  # the first line for a seq is the one written when it was recorded
    if invalid is not None:
        return Anchors(AnchorState.INVALID, hashes, invalid)
    if not hashes:
        return Anchors(AnchorState.MISSING, note=f"the anchor file {path} is empty")
    return Anchors(AnchorState.ANCHORED, hashes)


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
