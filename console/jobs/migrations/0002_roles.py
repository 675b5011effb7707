"""The three roles as Django groups: viewer (read), operator (propose, cancel own), reviewer (approve, reject)."""

from django.db import migrations

ROLES = ("viewer", "operator", "reviewer")  # frozen here: a migration must not follow later code


def create_roles(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    for name in ROLES:
        Group.objects.get_or_create(name=name)


def remove_roles(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=ROLES).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("jobs", "0001_initial"),
    ]

    operations = [migrations.RunPython(create_roles, remove_roles)]
