from django.contrib.auth.decorators import login_required
from django.urls import include, path, re_path
from rest_framework.routers import DefaultRouter

from console.api import calibration_views, views

router = DefaultRouter()
router.register("jobs", views.JobViewSet, basename="job")
router.register("audit", views.AuditViewSet, basename="audit")

urlpatterns = [
    path("v1/auth/token/", views.TokenView.as_view(), name="api-token"),
    path("v1/auth/token/revoke/", views.RevokeTokenView.as_view(), name="api-token-revoke"),
    path("v1/frontier/", views.FrontierView.as_view(), name="api-frontier"),
    path("v1/calibration/", calibration_views.CalibrationView.as_view(), name="api-calibration"),
    path("v1/predictions/", calibration_views.PredictionsView.as_view(), name="api-predictions"),
    path("v1/metrics/", calibration_views.MetricsView.as_view(), name="api-metrics"),
    path("v1/telemetry/latest/", views.TelemetryLatestView.as_view(), name="api-telemetry-latest"),
    path("v1/", include(router.urls)),
    # The schema and its page need a login like everything else: they map every endpoint and field.
    path("schema/", views.SchemaView.as_view(), name="api-schema"),
    path("docs/", login_required(views.docs_page), name="api-docs"),
    re_path(r"^.*$", views.NoRoute.as_view(), name="api-no-route"),
]
