"""manage.py export_audit: the audit trail as JSON lines, to stdout or --output FILE."""

from pathlib import Path

from django.core.management.base import BaseCommand

from console.audit.services import export_jsonl


class Command(BaseCommand):
    help = "Write every audit event as one canonical JSON line, in chain order."

    def add_arguments(self, parser):
        parser.add_argument("--output", "-o", type=Path, help="write to this file instead of stdout")

    def handle(self, *args, output=None, **options):
        if output is None:
            for line in export_jsonl():
                self.stdout.write(line, ending="")
            return
        count = 0
        with output.open("w", encoding="ascii", newline="\n") as file:
            for line in export_jsonl():
                file.write(line)
                count += 1
        self.stderr.write(f"exported {count} events to {output}")
