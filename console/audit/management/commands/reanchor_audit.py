"""manage.py reanchor_audit --reason TEXT: start a new anchor file at the trail's head, as an audited event.

The way back from an anchor file that verify reports missing, unreadable, invalid, or deleted and recreated by a
later event, once the operator has found out why (a lost disk, a restore). It refuses while the chain itself is
broken: re-anchoring must never bless a rewritten trail. It records `audit.reanchor` (the reason and what verify
said before) and replaces the file with one whose first line says, under SEAM_AUDIT_KEY, that it was re-anchored.
"""

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from console.audit.anchor import reopen_anchor
from console.audit.services import record, verify_chain

ACTION = "audit.reanchor"


class Command(BaseCommand):
    help = ("Start a new audit anchor file at the trail's head, recorded as an audit event; refused while the chain "
            "is broken.")

    def add_arguments(self, parser):
        parser.add_argument("--reason", required=True, help="why the anchor is re-started (kept in the event)")

    def handle(self, *args, reason: str, **options):
        if not reason.strip():
            raise CommandError("--reason: say why the anchor is re-started (it is kept in the audit event)")
        before = verify_chain()
        if before.first_broken is not None:
            raise CommandError(f"the chain itself is broken, so it is not re-anchored: {before}", returncode=1)
        with transaction.atomic():
            event = record(actor=None, action=ACTION, subject="audit:anchor",
                           payload={"reason": reason.strip(), "verify_before": str(before)})
        reopen_anchor(event.seq, event.hash)
        self.stdout.write(f"re-anchored at event #{event.seq}; {verify_chain()}")
