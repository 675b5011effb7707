from __future__ import annotations

from rest_framework.permissions import SAFE_METHODS, BasePermission

from console.jobs.refusals import refuse_access
from console.jobs.roles import roles_of

__all__ = ["HasRole"]


class HasRole(BasePermission):
    """Reading needs one of the console roles (viewer, operator, reviewer); verbs are checked by the services.

    A state-changing request refused here never reaches a service, so it is audited here (`access.refused`).
    """

    message = "this needs one of the console roles (viewer, operator or reviewer)"

    def has_permission(self, request, view) -> bool:
        if roles_of(request.user):
            return True
        # The method the client sent, not request.method: the browsable API and OPTIONS ask this permission again
        # with a pretend POST to decide what to offer, which is no attempt of the user's.
        method = request.META.get("REQUEST_METHOD", "")
        if request.user.is_authenticated and method not in SAFE_METHODS:
            refuse_access(request.user, method=method, path=request.path, why=self.message,
                          job_id=view.kwargs.get("pk"), request_id=getattr(request, "request_id", None))
        return False
