"""Each audit event names its hash scheme; the rows already there are the unkeyed sha256 ones.

The append-only trigger (0002) does not stand in the way: adding a column is an ALTER TABLE, which fires
no row triggers. On PostgreSQL the column is added with DEFAULT 'sha256' (filling the old rows) and the
default is then dropped; on SQLite Django copies the table into a new one. Either way no existing row is
updated, so no hash changes. New rows get their scheme from console.audit.services.record.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [("audit", "0002_append_only_trigger")]

    operations = [
        migrations.AddField(
            model_name="auditevent",
            name="scheme",
            field=models.CharField(
                choices=[("sha256", "sha256 (unkeyed: recorded before the chain was keyed)"),
                         ("hmac-sha256", "HMAC-SHA256 under SEAM_AUDIT_KEY")],
                default="sha256",
                editable=False,
                help_text="How `hash` was made; not itself hashed (a downgrade is caught by verify).",
                max_length=16,
            ),
            preserve_default=False,
        ),
    ]
