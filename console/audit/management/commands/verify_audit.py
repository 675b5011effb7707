"""manage.py verify_audit: walk the keyed audit chain, hold it against the anchor file and against the head the
engine witnessed.

Exit 0: intact, anchored and witnessed (or nothing recorded yet, or nothing the engine witnessed yet). 1: broken,
naming the first broken link (a rollback the engine's witness shows included). 2: the chain holds but could not be
held against an anchor file or the engine (unreachable), so deleting the newest events or restoring an older copy
cannot be ruled out; a distinct code, so a cron job or monitor does not read "unchecked" as "fine".
"""

from django.core.management.base import BaseCommand, CommandError

from console.audit.anchor import AnchorState
from console.audit.services import verify_chain
from console.audit.verification import WitnessState
from console.audit.witness import engine_witness

NOT_CHECKED = 2


class Command(BaseCommand):
    help = ("Recompute every audit event's keyed hash, check the anchored head and the engine's witnessed head, and "
            "name the first broken link. Exit 0 when intact, anchored and witnessed, 1 when broken, 2 when intact but "
            "not anchored or the engine could not be asked.")

    def handle(self, *args, **options):
        result = verify_chain(engine_witness)
        if not result.ok:
            raise CommandError(str(result), returncode=1)
        unanchored = result.anchor != AnchorState.ANCHORED and result.checked
        if unanchored or result.witness == WitnessState.UNREACHABLE:
            raise CommandError(str(result), returncode=NOT_CHECKED)
        self.stdout.write(str(result))
