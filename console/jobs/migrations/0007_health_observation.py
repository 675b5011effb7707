import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0006_job_engine_boot_id"),
    ]

    operations = [
        migrations.CreateModel(
            name="HealthObservation",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("engine_url", models.CharField(max_length=255)),
                ("status", models.CharField(choices=[
                    ("ok", "Healthy"), ("unhealthy", "Unhealthy (broken or in a recovery loop)"),
                    ("unreachable", "Unreachable")], max_length=16)),
                ("reason", models.CharField(
                    blank=True, default="", max_length=500,
                    help_text="Why it is not ok: the engine's reason, or why it could not be read.")),
                ("observed_at", models.DateTimeField(default=django.utils.timezone.now)),
            ],
            options={
                "ordering": ["-observed_at", "-id"],
                "indexes": [models.Index(fields=["engine_url", "observed_at"], name="jobs_health_engine_seen")],
            },
        ),
    ]
