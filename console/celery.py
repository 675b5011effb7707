"""The Celery application: jobs run here, handed over only after the database commit."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("seam")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
