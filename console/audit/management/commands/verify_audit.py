"""manage.py verify_audit: walk the audit chain; exit 0 when intact, 1 naming the first broken link."""

from django.core.management.base import BaseCommand, CommandError

from console.audit.services import verify_chain


class Command(BaseCommand):
    help = "Recompute every audit event's hash and name the first broken link. Exit 0 when intact, 1 when not."

    def handle(self, *args, **options):
        result = verify_chain()
        if not result.ok:
            raise CommandError(str(result), returncode=1)
        self.stdout.write(str(result))
