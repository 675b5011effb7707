"""API views for calibration: coverage (/api/v1/calibration/), each executed job's prediction against what was
measured (/api/v1/predictions/), and the console's metrics in the Prometheus exposition (/api/v1/metrics/)."""

from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from console.api.errors import ApiErrors
from console.api.pagination import Pages
from console.api.permissions import HasRole
from console.api.query import NumberQuery
from console.api.serializers import ErrorSerializer
from console.calibration.coverage import DEFAULT_TARGET, MIN_TARGET, TARGET_BELOW, calibration_report
from console.calibration.metrics import CONTENT_TYPE, exposition
from console.calibration.models import JobPrediction
from console.calibration.predictions import prediction_dict, summary

__all__ = ["CalibrationView", "MetricsView", "PredictionsView", "executed_predictions"]


TARGET = NumberQuery(name="target", minimum=MIN_TARGET, below=TARGET_BELOW, example="0.05",
                     description=f"the relative precision to resolve ms per layer to (default {DEFAULT_TARGET}: "
                                 f"{DEFAULT_TARGET:.0%})")


def executed_predictions():
    """Every executed job's prediction, newest first."""
    return JobPrediction.objects.select_related("job").order_by("-created", "-id")


class CalibrationView(ApiErrors, APIView):
    """Calibration coverage of the running model on the rig: per rank identified or not, ms/layer ± SE, samples
    needed for `target`, the noise floor and its source, and arms (with propose links) for unidentified ranks."""

    permission_classes = [IsAuthenticated, HasRole]

    @extend_schema(parameters=[TARGET.parameter()], responses={200: OpenApiTypes.OBJECT, 400: ErrorSerializer})
    def get(self, request):
        return Response(calibration_report(TARGET.read(request.query_params, DEFAULT_TARGET)))


class PredictionsView(ApiErrors, APIView):
    """Executed jobs, newest first: the layout before -> after, predicted vs measured pool, per rank stage ms,
    decode tok/s and speedup, with their errors; `summary` holds the running mean/max of |pool| and |stage| error."""

    permission_classes = [IsAuthenticated, HasRole]

    @extend_schema(parameters=Pages.parameters(), responses={200: OpenApiTypes.OBJECT, 400: ErrorSerializer})
    def get(self, request):
        rows = executed_predictions()
        pages = Pages()
        page = pages.paginate_queryset(rows, request, view=self)
        response = pages.get_paginated_response([prediction_dict(row) for row in page])
        response.data["summary"] = summary(rows)
        return response


class MetricsView(ApiErrors, APIView):
    """The console's metrics in the Prometheus exposition (console/calibration/metrics.py; same login as the API)."""

    permission_classes = [IsAuthenticated, HasRole]
    renderer_classes = [JSONRenderer]

    def perform_content_negotiation(self, request, force=False):
        # The gauges are text whatever a scraper accepts (text/plain, OpenMetrics); only a refusal is rendered, as
        # JSON like every refusal of the API.
        return JSONRenderer(), JSONRenderer.media_type

    @extend_schema(responses={(200, "text/plain"): OpenApiTypes.STR})
    def get(self, request):
        return HttpResponse(exposition(), content_type=CONTENT_TYPE)
