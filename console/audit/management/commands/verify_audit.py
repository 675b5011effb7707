"""manage.py verify_audit: walk the keyed audit chain and hold it against the anchor file.

Exit 0: intact and anchored (or nothing recorded yet). 1: broken, naming the first broken link. 2: the
chain holds but could not be held against an anchor file, so deleting the newest events cannot be ruled
out; a distinct code, so a cron job or monitor does not read "unchecked" as "fine".
"""

from django.core.management.base import BaseCommand, CommandError

from console.audit.anchor import AnchorState
from console.audit.services import verify_chain

NOT_ANCHORED = 2


class Command(BaseCommand):
    help = ("Recompute every audit event's keyed hash, check the anchored head, and name the first broken link. "
            "Exit 0 when intact and anchored, 1 when broken, 2 when intact but not anchored.")

    def handle(self, *args, **options):
        result = verify_chain()
        if not result.ok:
            raise CommandError(str(result), returncode=1)
        if result.anchor != AnchorState.ANCHORED and result.checked:
            raise CommandError(str(result), returncode=NOT_ANCHORED)
        self.stdout.write(str(result))
