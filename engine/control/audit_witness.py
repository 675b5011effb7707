"""The newest audit head each console trail's attestations carried, kept where the console's database writer cannot
rewrite it (docs/console.md, "Trust model"; docs/engine.md).

Every attestation carries the console's audit head when it was signed (contracts/attestation.py: `{trail, seq, hash}`,
`trail` naming the console database by its first event's hash). The engine keeps, per trail, the newest head and
when the attestation carrying it was issued, in `audit_heads.json` beside the spent-job ledger (0600 in the 0700
state folder). An attestation of a trail is refused (409) when

- it names the witnessed seq with another hash (the trail was forked: rewritten from there on), or
- it was issued after the witnessed one yet names an older seq (the console's database went back: a restore of an
  older copy). One signed earlier and delivered later (two workers racing) is no rollback and passes.

A rollback, once seen, is kept: every later attestation of that trail is refused too, so a restored database that
records its way past the witnessed seq does not make the engine forget. The operator clears it, after finding out
what happened, by removing the trail's entry from the file with the engine stopped. The console's verify reads the
witnessed head (GET /control/audit-head) and checks its chain still holds it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from contracts.attestation import Attestation, AuditHead
from contracts.control import WitnessedHead
from engine.control.protocol import ApplyRefused
from engine.control.state_files import private_folder, write_json
from engine.errors import EngineError

__all__ = ["WITNESS_FILE", "AuditWitness"]

WITNESS_FILE = "audit_heads.json"


class AuditWitness:
    """Per trail: `{seq, hash, issued_at, rolled_back}`; in memory only when `folder` is None (an app built
    in-process), else in `folder`/audit_heads.json. Only the service's event loop calls it, with no await inside."""

    def __init__(self, folder: Path | None = None) -> None:
        self.path = None if folder is None else Path(folder) / WITNESS_FILE
        self._trails: dict[str, dict[str, Any]] = {}
        if self.path is not None:
            private_folder(self.path.parent)
            self._trails = _read(self.path)

    def head(self, trail: str) -> WitnessedHead | None:
        """What this engine witnessed of `trail`, or None."""
        seen = self._trails.get(trail)
        return None if seen is None else _head(trail, seen)

    def heads(self) -> list[WitnessedHead]:
        return [_head(trail, seen) for trail, seen in sorted(self._trails.items())]

    def witness(self, attestation: Attestation) -> None:
        """Keep the attestation's head when it is the newest of its trail; ApplyRefused(409) when it shows the trail
        went back or forked (then recorded, so the trail stays refused)."""
        head, issued_at = attestation.audit_head, attestation.issued_at
        seen = self._trails.get(head.trail)
        if seen is not None and seen["rolled_back"] is None:
            problem = _rollback(seen, head, issued_at)
            if problem is not None:
                seen["rolled_back"] = {"from_seq": seen["seq"], "to_seq": head.seq, "hash": head.hash,
                                       "issued_at": issued_at, "problem": problem}
                self._save()
        if seen is not None and seen["rolled_back"] is not None:  # kept as witnessed: the head before the rollback
            raise ApplyRefused(409, f"apply refused: {seen['rolled_back']['problem']}; this engine refuses the "
                                    "trail's attestations until its operator has looked (docs/console.md, \"Trust "
                                    "model\")")
        if seen is None or head.seq > seen["seq"]:
            # The newest issue time too: an attestation signed before it and delivered late is no rollback.
            self._trails[head.trail] = {"seq": head.seq, "hash": head.hash, "rolled_back": None,
                                        "issued_at": max(issued_at, seen["issued_at"]) if seen else issued_at}
            self._save()

    def _save(self) -> None:
        if self.path is not None:
            write_json(self.path, {"trails": self._trails})


def _head(trail: str, seen: dict[str, Any]) -> WitnessedHead:
    return WitnessedHead(trail=trail, seq=seen["seq"], hash=seen["hash"], issued_at=seen["issued_at"],
                         rolled_back=seen["rolled_back"])


def _rollback(seen: dict[str, Any], head: AuditHead, issued_at: float) -> str | None:
    """Why `head` shows the trail went back from what was witnessed; None when it does not (seq not newer here)."""
    if head.seq == seen["seq"] and head.hash != seen["hash"]:
        return (f"the console's audit trail has another event #{head.seq} than it had when this engine witnessed "
                "it: its database was rewritten from there on (a restore of another copy)")
    if head.seq < seen["seq"] and issued_at > seen["issued_at"]:
        return (f"the console's audit trail went back from #{seen['seq']} to #{head.seq}: a rollback of its "
                "database (an older copy restored)")
    return None


def _read(path: Path) -> dict[str, dict[str, Any]]:
    """The witnessed heads as written; EngineError naming the file when unreadable (a file silently emptied would
    let a rolled-back console through)."""
    if not path.exists():
        return {}
    try:
        trails = json.loads(path.read_text())["trails"]
        return {str(trail): {"seq": int(seen["seq"]), "hash": str(seen["hash"]),
                             "issued_at": float(seen["issued_at"]), "rolled_back": seen["rolled_back"]}
                for trail, seen in trails.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise EngineError(f"the witnessed audit heads {path} are unreadable ({type(error).__name__}: {error}): "
                          "restore the file from a backup, or delete it knowingly (a console whose database was "
                          "rolled back would then go unnoticed until its next attestation)") from None
