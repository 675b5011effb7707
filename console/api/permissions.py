from __future__ import annotations

from rest_framework.permissions import BasePermission

from console.jobs.roles import roles_of

__all__ = ["HasRole"]


class HasRole(BasePermission):
    """Reading needs one of the console roles (viewer, operator, reviewer); verbs are checked by the services."""

    message = "this needs one of the console roles (viewer, operator or reviewer)"

    def has_permission(self, request, view) -> bool:
        return bool(roles_of(request.user))
