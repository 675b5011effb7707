"""DRF's authtoken kept each key in plain text (table authtoken_token). A database from before console.accounts
stored tokens hashed still has that table: each key becomes a hashed ApiToken (it keeps working, with its issue
time, so its expiry is unchanged), then the table is dropped, taking the plain keys with it, and authtoken's
migration records are forgotten (the app is no longer installed). A database created since has no such table.
"""

import datetime as dt

from django.db import migrations
from django.db.migrations.recorder import MigrationRecorder
from django.utils import timezone

from console.accounts.models.api_token import prefix_of, token_digest

LEGACY_TABLE = "authtoken_token"


def adopt_legacy_tokens(api_token_model, connection) -> int:
    """Hash every key of LEGACY_TABLE into `api_token_model`, drop the table; returns how many were adopted. A key
    whose prefix another one already took is dropped with the table: its holder gets a new token at next login."""
    if LEGACY_TABLE not in connection.introspection.table_names():
        return 0
    table, *columns = map(connection.ops.quote_name, (LEGACY_TABLE, "key", "user_id", "created"))
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {', '.join(columns)} FROM {table}")
        rows = cursor.fetchall()
    adopted = 0
    for key, user_id, created in rows:
        if api_token_model.objects.filter(prefix=prefix_of(key)).exists():
            continue
        if timezone.is_naive(created):  # SQLite hands back UTC without its zone
            created = timezone.make_aware(created, dt.UTC)
        api_token_model.objects.create(user_id=user_id, prefix=prefix_of(key), digest=token_digest(key),
                                       created=created)
        adopted += 1
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE {table}")
    MigrationRecorder(connection).migration_qs.filter(app="authtoken").delete()
    return adopted


def forwards(apps, schema_editor) -> None:
    adopt_legacy_tokens(apps.get_model("accounts", "ApiToken"), schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0001_initial"),
    ]

    # No way back: the plain keys are gone, which is the point.
    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
