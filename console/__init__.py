"""Seam's console: the operators' web console, REST API, jobs, review gate and audit trail."""

from console.celery import app as celery_app

__all__ = ["celery_app"]
