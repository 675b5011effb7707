"""The pages' routes (the login pages are in console/urls.py)."""

from django.urls import path, register_converter
from django.urls.converters import IntConverter

from console.ui.views import audit, calibration, dashboard, frontier, job_actions, job_new, jobs


class JobIdConverter(IntConverter):
    """A job id the database can hold: longer numbers are no job (404), never an integer overflow (500)."""

    regex = "[0-9]{1,18}"


register_converter(JobIdConverter, "job_id")

urlpatterns = [
    path("", dashboard.dashboard, name="dashboard"),
    path("frontier/", frontier.frontier, name="frontier"),
    path("calibration/", calibration.calibration, name="calibration"),
    path("predictions/", calibration.predictions, name="predictions"),
    path("jobs/", jobs.job_list, name="jobs"),
    path("jobs/new/", job_new.job_new, name="job-new"),
    path("jobs/<job_id:job_id>/", jobs.job_detail, name="job"),
    path("jobs/<job_id:job_id>/approve/", job_actions.approve, name="job-approve"),
    path("jobs/<job_id:job_id>/reject/", job_actions.reject, name="job-reject"),
    path("jobs/<job_id:job_id>/cancel/", job_actions.cancel, name="job-cancel"),
    path("jobs/<job_id:job_id>/revert/", job_actions.revert, name="job-revert"),
    path("audit/", audit.audit, name="audit"),
    path("audit/export/", audit.audit_export, name="audit-export"),
]
