"""What every page's template gets: the count of jobs awaiting review, for the nav's Jobs link (base.html)."""

from __future__ import annotations

from functools import cache

from django.contrib.auth.models import Group
from django.db.models import Exists

from console.jobs.choices import JobStatus
from console.jobs.models import Job
from console.jobs.roles import ROLES

__all__ = ["pending_review"]


def pending_review(request) -> dict:
    """`pending_review_count`: proposed jobs, counted only for a user holding a console role (others see none).

    Lazy and one query: the template calls it (pages without the nav never do), and the role check rides along
    in the same query as a subquery.
    """
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated or not user.is_active:
        return {}

    @cache
    def count() -> int:
        holds_role = Group.objects.filter(user=user.pk, name__in=ROLES)
        return Job.objects.filter(Exists(holds_role), status=JobStatus.PROPOSED).count()

    return {"pending_review_count": count}
