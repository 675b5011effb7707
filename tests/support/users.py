"""Console users by role: `make_user(*roles, name=None)` and one user of each role the tests name (olga the operator,
rita the reviewer, vera the viewer, and vic, a viewer who logs in with PASSWORD)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from console.jobs.roles import ensure_roles

PASSWORD = "a-long-right-password"  # vic's, for the login, lockout and token tests


@pytest.fixture
def make_user(db):
    """make_user(*roles, name=None) -> a user in those role groups (none: a user without a console role)."""
    counter = iter(range(1, 10**6))

    def make(*roles: str, name: str | None = None):
        ensure_roles()  # a transactional test's flush removed the migration's groups
        user = get_user_model().objects.create_user(name or f"{'-'.join(roles) or 'nobody'}-{next(counter)}")
        user.groups.add(*Group.objects.filter(name__in=roles))
        return user

    return make


@pytest.fixture
def operator(make_user):
    return make_user("operator", name="olga")


@pytest.fixture
def reviewer(make_user):
    return make_user("reviewer", name="rita")


@pytest.fixture
def viewer(make_user):
    return make_user("viewer", name="vera")


@pytest.fixture
def vic(make_user):
    """A viewer with a known password (PASSWORD)."""
    user = make_user("viewer", name="vic")
    user.set_password(PASSWORD)
    user.save()
    return user
