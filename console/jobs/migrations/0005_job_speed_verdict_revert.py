# Jobs judged on speed (speed_verdict), the layout each plan was made for (incumbent_layout), and reverts.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0004_job_not_before"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="incumbent_layout",
            field=models.JSONField(
                blank=True, null=True,
                help_text="The layout the plan was made for, as the engine reported it then ({fingerprint, cut, "
                          "shape}): what a revert goes back to."),
        ),
        migrations.AddField(
            model_name="job",
            name="reverts",
            field=models.ForeignKey(
                blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name="reverted_by",
                to="jobs.job", help_text="The job whose missed prediction this job proposes to undo."),
        ),
        migrations.AddField(
            model_name="job",
            name="speed_verdict",
            field=models.CharField(
                blank=True, default="", max_length=16,
                choices=[("pending", "awaiting a speed measurement"), ("met", "met prediction"),
                         ("missed", "missed prediction"), ("unmeasured", "speed not judged")],
                help_text="The measured speedup against the predicted one; blank: no verdict."),
        ),
    ]
