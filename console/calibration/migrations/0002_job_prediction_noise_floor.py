# The noise floor each job's speedup was predicted with: what judges its speed verdict.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("calibration", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="jobprediction",
            name="noise_floor",
            field=models.FloatField(
                blank=True, null=True,
                help_text="The noise floor the speedup was predicted with (the fit's, else the rig's): a miss is a "
                          "speedup error beyond it."),
        ),
    ]
