"""On PostgreSQL, a trigger refuses UPDATE and DELETE of audit events, raw SQL included.

One UPDATE is let through: Django's ON DELETE SET NULL of `actor` when a user is deleted, which sets
`actor_id` to NULL and changes nothing else (`actor_name` keeps who it was, and the hash does not cover
`actor_id`). Other databases rely on the model and queryset guards; verify_audit finds what slips past.
"""

from django.db import migrations

FUNCTION = "audit_auditevent_refuse_change"
TRIGGER = "audit_auditevent_append_only"

CREATE = f"""
CREATE OR REPLACE FUNCTION {FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.actor_id IS NOT NULL AND NEW.actor_id IS NULL
       AND (to_jsonb(NEW) - 'actor_id') = (to_jsonb(OLD) - 'actor_id') THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'the audit trail is append-only: % of audit event #% is refused', TG_OP, OLD.seq
        USING ERRCODE = 'restrict_violation';
END
$$;
DROP TRIGGER IF EXISTS {TRIGGER} ON audit_auditevent;
CREATE TRIGGER {TRIGGER} BEFORE UPDATE OR DELETE ON audit_auditevent
    FOR EACH ROW EXECUTE FUNCTION {FUNCTION}();
"""

DROP = f"""
DROP TRIGGER IF EXISTS {TRIGGER} ON audit_auditevent;
DROP FUNCTION IF EXISTS {FUNCTION}();
"""


def _run_on_postgresql(sql):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql, params=None)  # None: the "%" in RAISE is not a placeholder
    return run


class Migration(migrations.Migration):

    dependencies = [("audit", "0001_initial")]

    operations = [migrations.RunPython(_run_on_postgresql(CREATE), _run_on_postgresql(DROP))]
