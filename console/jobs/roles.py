"""Roles are Django groups (created by migration 0002): viewer reads, operator proposes, reviewer approves.

Membership is the only thing that counts: a superuser is not a reviewer unless it is in the group, so the
review gate cannot be walked around by an admin account.
"""

from __future__ import annotations

from django.contrib.auth.models import Group
from django.db.models import Q

__all__ = ["OPERATOR", "REVIEWER", "ROLES", "VIEWER", "ensure_roles", "has_role", "held_through", "roles_of"]

VIEWER, OPERATOR, REVIEWER = "viewer", "operator", "reviewer"
ROLES = (VIEWER, OPERATOR, REVIEWER)


def roles_of(user) -> set[str]:
    if user is None or not getattr(user, "is_authenticated", False) or not user.is_active:
        return set()
    return set(user.groups.filter(name__in=ROLES).values_list("name", flat=True))


def has_role(user, role: str) -> bool:
    return role in roles_of(user)


def held_through(user_field: str, role: str) -> Q:
    """has_role as a query, for rows that link a user through `user_field` (e.g. an Approval's "reviewer"): the
    user is active and in the role's group."""
    return Q(**{f"{user_field}__is_active": True, f"{user_field}__groups__name": role})


def ensure_roles() -> None:
    """Create the groups where they are missing (a flushed test database, a fresh install before migrate)."""
    for name in ROLES:
        Group.objects.get_or_create(name=name)
