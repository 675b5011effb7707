from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0005_job_speed_verdict_revert"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="engine_boot_id",
            field=models.CharField(blank=True, default="", max_length=64,
                                   help_text="The engine's boot id when the worker applied the plan: another one "
                                             "later means the engine restarted under the job."),
        ),
        migrations.AlterField(
            model_name="layoutobservation",
            name="cause",
            field=models.CharField(max_length=16, choices=[
                ("first_seen", "First seen"), ("job", "A job of the console"), ("unexplained", "No job caused it"),
                ("restarted", "The engine restarted mid-apply")]),
        ),
    ]
