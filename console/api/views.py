"""API views. Every state change goes through console.jobs.lifecycle; nothing here writes a job itself."""

from __future__ import annotations

import json

import redis
from django.conf import settings
from django.http import Http404, StreamingHttpResponse
from django.shortcuts import render
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from drf_spectacular.views import SCHEMA_KWARGS, SpectacularAPIView
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.authtoken.views import ObtainAuthToken
from rest_framework.decorators import action
from rest_framework.exceptions import APIException, NotFound, ValidationError
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.throttling import ScopedRateThrottle
from rest_framework.views import APIView

from console.accounts.lockout import LockedOut, clear_failures, is_locked_out
from console.accounts.serializers import IssuedTokenSerializer, TokenRequestSerializer
from console.accounts.tokens import expires_at, issue_token, revoke_tokens
from console.api.errors import ApiErrors
from console.api.frontier import running_frontier
from console.api.pagination import Pages
from console.api.permissions import HasRole
from console.api.query import NumberQuery
from console.api.serializers import (
    ApproveSerializer,
    AuditEventSerializer,
    ErrorSerializer,
    JobSerializer,
    ProposeSerializer,
    RejectSerializer,
)
from console.audit.anchor import AnchorState
from console.audit.models import AuditEvent
from console.audit.services import export_jsonl, verify_chain
from console.audit.verification import WitnessState
from console.audit.witness import engine_witness
from console.jobs import lifecycle
from console.jobs.choices import JobStatus
from console.jobs.errors import JobNotFound
from console.jobs.models import Job
from console.jobs.refusals import body_digest, refuse_proposal, refuse_verb
from contracts.telemetry import telemetry_keys

__all__ = ["AuditViewSet", "FrontierView", "JobViewSet", "NoRoute", "RevokeTokenView", "SchemaView",
           "TelemetryLatestView", "TokenView", "docs_page"]


def _valid(serializer_class, data):
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


class TokenView(ApiErrors, ObtainAuthToken):
    """POST username + password -> {"token", "prefix", "expires_at"} (send it as `Authorization: Token <token>`).

    Every POST issues a new token and the user's previous one stops working: the console stores only a hash, so
    the secret is in this answer and nowhere else. Failed logins count toward django-axes' lockout
    (console.accounts); a client address is also rate-limited here (ScopedRateThrottle).
    """

    serializer_class = TokenRequestSerializer
    throttle_classes = [ScopedRateThrottle]
    throttle_scope = "auth-token"

    @extend_schema(request=TokenRequestSerializer, responses={200: IssuedTokenSerializer, 429: ErrorSerializer},
                   description="Issues a new token on every call, replacing the caller's previous one (one per user): "
                               "the secret is shown in this answer only, and named by its prefix afterwards.")
    def post(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        if not serializer.is_valid():
            if is_locked_out(request):
                raise LockedOut()
            raise ValidationError(serializer.errors)
        user = serializer.validated_data["user"]
        clear_failures(request, user)
        issued = issue_token(user)
        return Response(IssuedTokenSerializer({"token": issued.secret, "prefix": issued.token.prefix,
                                               "expires_at": expires_at(issued.token)}).data)


class RevokeTokenView(ApiErrors, APIView):
    """POST -> 204: the caller's API token stops working at once (audited). A new one: POST /api/v1/auth/token/."""

    permission_classes = [IsAuthenticated]

    @extend_schema(request=None, responses={204: None})
    def post(self, request):
        revoke_tokens(request.user, actor=request.user, reason="revoked by its user")
        return Response(status=status.HTTP_204_NO_CONTENT)


SCHEMA_FORMATS = ("json", "yaml")  # the renderers SpectacularAPIView has, as its ?format= enum declares


class SchemaView(ApiErrors, SpectacularAPIView):
    """The OpenAPI schema, for logged-in users only: it maps every endpoint and field."""

    permission_classes = [IsAuthenticated]

    def perform_content_negotiation(self, request, force=False):
        # DRF reads an empty ?format= as none given; the schema declares json or yaml, so it is refused too.
        if request.query_params.get("format", "json") not in SCHEMA_FORMATS:
            self._refuse_format(request)
        try:
            return super().perform_content_negotiation(request, force)
        except Http404:  # ?format= names no renderer: say so, as JSON, like every refusal
            self._refuse_format(request)

    @staticmethod
    def _refuse_format(request) -> None:
        request.accepted_renderer, request.accepted_media_type = JSONRenderer(), "application/json"
        raise ValidationError({"format": f"use {' or '.join(SCHEMA_FORMATS)} (or leave it out for YAML)"})

    @extend_schema(**SCHEMA_KWARGS)
    def get(self, request, *args, **kwargs):
        lang, languages = request.query_params.get("lang"), dict(settings.LANGUAGES)
        if lang is not None and lang not in languages:
            raise ValidationError({"lang": f"{lang[:20]!r} is not a language of this console"})
        return super().get(request, *args, **kwargs)


class NoRoute(ApiErrors, APIView):
    """Any other path under /api/: a JSON 404 (after the login check), never the site's HTML page."""

    permission_classes = [IsAuthenticated]

    @extend_schema(exclude=True)
    def get(self, request, *args, **kwargs):
        raise NotFound(f"no API route {request.path[:200]} (routes end with a slash; see /api/schema/)")

    post = put = patch = delete = get


STATUS_FILTER = OpenApiParameter(
    "status", str, many=True, explode=False, enum=JobStatus.values,
    description="only jobs in these statuses: one (`?status=queued`) or several (`?status=queued,running`)")


class JobViewSet(ApiErrors, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    queryset = Job.objects.select_related("layout_prediction").prefetch_related("reverted_by")
    serializer_class = JobSerializer
    permission_classes = [IsAuthenticated, HasRole]
    pagination_class = Pages

    def get_queryset(self):
        jobs = super().get_queryset()
        wanted = [part.strip() for raw in self.request.query_params.getlist("status") for part in raw.split(",")]
        wanted = [name for name in wanted if name]
        # Refused rather than ignored: an ignored typo would answer a list that looks filtered and is not.
        unknown = [name for name in wanted if name not in JobStatus.values]
        if unknown:
            raise ValidationError({"status": f"unknown status {unknown[0][:40]!r}; expected one or several "
                                             f"(comma-separated) of {', '.join(JobStatus.values)}"})
        return jobs.filter(status__in=wanted) if wanted else jobs

    @extend_schema(parameters=[STATUS_FILTER])
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    def get_object(self):
        pk = self.kwargs["pk"]
        job = Job.objects.filter(pk=pk).first() if str(pk).isdigit() else None
        if job is None:
            raise JobNotFound(f"no job {str(pk)[:40]}")
        return job

    def _answer(self, job, code=status.HTTP_200_OK):
        return Response(JobSerializer(job).data, status=code)

    def _body(self, verb: str, serializer_class) -> dict:
        """The verb's body, validated. One refused here (not JSON, approve without its plan_hash) never reaches
        the service, so it is audited here as `job.<verb>_refused`, as the service records its own refusals."""
        try:
            return _valid(serializer_class, self.request.data)
        except APIException as refusal:
            refuse_verb(verb, self.request.user, self.kwargs["pk"], json.dumps(refusal.detail),
                        type(refusal).__name__, request_id=self.request.request_id)
            raise

    @extend_schema(request=ProposeSerializer, responses={201: JobSerializer, 409: ErrorSerializer, 422: ErrorSerializer,
                                                        503: ErrorSerializer})
    def create(self, request):
        """Propose a job (operator): the engine prices the plan; the answer carries plan_hash and prediction."""
        try:
            body = request.data
        except APIException as refusal:  # not JSON, too large, too deep: refused before the lifecycle sees it
            digest = getattr(refusal, "body_sha256", None) or body_digest(None)
            refuse_proposal(request.user, digest, refusal, request_id=request.request_id)
            raise
        job = lifecycle.propose(request.user, body, request_id=request.request_id)
        return self._answer(job, status.HTTP_201_CREATED)

    @extend_schema(request=ApproveSerializer, responses=JobSerializer)
    @action(detail=True, methods=["post"])
    def approve(self, request, pk=None):
        """Approve the plan you saw (reviewer, not the proposer); the last approval needed queues the job."""
        body = self._body("approve", ApproveSerializer)
        job = lifecycle.approve(request.user, self.get_object(), plan_hash=body["plan_hash"],
                                request_id=request.request_id)
        return self._answer(job)

    @extend_schema(request=RejectSerializer, responses=JobSerializer)
    @action(detail=True, methods=["post"])
    def reject(self, request, pk=None):
        body = self._body("reject", RejectSerializer)
        job = lifecycle.reject(request.user, self.get_object(), reason=body.get("reason", ""),
                               request_id=request.request_id)
        return self._answer(job)

    @extend_schema(request=None, responses=JobSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        return self._answer(lifecycle.cancel(request.user, self.get_object(), request_id=request.request_id))

    @extend_schema(request=None, responses={201: JobSerializer, 409: ErrorSerializer, 422: ErrorSerializer,
                                            503: ErrorSerializer})
    @action(detail=True, methods=["post"])
    def revert(self, request, pk=None):
        """Propose a revert (operator) of a succeeded job that missed its predicted speedup: a new proposed job back
        to the layout it replaced (`reverts` names this job), reviewed like any other. 409 if the job did not miss
        its prediction, or the engine no longer runs the layout it left."""
        job = lifecycle.propose_revert(request.user, self.get_object(), request_id=request.request_id)
        return self._answer(job, status.HTTP_201_CREATED)


AUDIT_FILTERS = [OpenApiParameter(name, str, description=f"exact {name}") for name in ("action", "subject", "actor")]


class AuditViewSet(ApiErrors, mixins.ListModelMixin, viewsets.GenericViewSet):
    serializer_class = AuditEventSerializer
    permission_classes = [IsAuthenticated, HasRole]
    pagination_class = Pages

    def get_queryset(self):
        events = AuditEvent.objects.order_by("-seq")
        params = self.request.query_params
        for param, field in (("action", "action"), ("subject", "subject"), ("actor", "actor_name")):
            if params.get(param):
                events = events.filter(**{field: params[param]})
        return events

    @extend_schema(parameters=AUDIT_FILTERS)
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    @extend_schema(responses=inline_serializer("AuditVerify", {
        "ok": serializers.BooleanField(), "checked": serializers.IntegerField(),
        "first_broken": serializers.IntegerField(allow_null=True), "reason": serializers.CharField(allow_null=True),
        "anchor": serializers.ChoiceField(choices=[state.value for state in AnchorState]),
        "anchored_seq": serializers.IntegerField(allow_null=True),
        "anchor_note": serializers.CharField(allow_null=True), "legacy_events": serializers.IntegerField(),
        "witness": serializers.ChoiceField(choices=[state.value for state in WitnessState]),
        "witnessed_seq": serializers.IntegerField(allow_null=True),
        "witness_note": serializers.CharField(allow_null=True)}))
    @action(detail=False, methods=["get"])
    def verify(self, request):
        """The keyed chain walked from the genesis, held against the anchor file (`anchor` says whether it was) and
        against the head the engine witnessed (`witness` says whether it was)."""
        result = verify_chain(engine_witness)
        return Response({"ok": result.ok, "checked": result.checked, "first_broken": result.first_broken,
                         "reason": result.reason, "anchor": result.anchor.value, "anchored_seq": result.anchored_seq,
                         "anchor_note": result.anchor_note, "legacy_events": result.legacy_events,
                         "witness": result.witness.value, "witnessed_seq": result.witnessed_seq,
                         "witness_note": result.witness_note})

    @extend_schema(parameters=AUDIT_FILTERS, responses={(200, "application/x-ndjson"): OpenApiTypes.STR})
    @action(detail=False, methods=["get"])
    def export(self, request):
        """The (filtered) chain as canonical JSON lines, in seq order, re-verifiable without the database."""
        response = StreamingHttpResponse(export_jsonl(self.get_queryset()), content_type="application/x-ndjson")
        response["Content-Disposition"] = 'attachment; filename="seam-audit.jsonl"'
        return response


class FrontierView(ApiErrors, APIView):
    """The cut frontier of SEAM_MODEL on SEAM_RIG (`python -m solvers frontier --json`)."""

    permission_classes = [IsAuthenticated, HasRole]

    # float() also reads "nan" and "inf": NaN compares false with every pool (a frontier of nothing answered 200
    # as if it were one), so only a finite ratio >= 0 is a question; NumberQuery refuses both.
    MIN_POOL_RATIO = NumberQuery(name="min_pool_ratio", minimum=0, example="0.9",
                                 description="keep only cuts whose pool is at least this fraction of the incumbent's")

    @extend_schema(parameters=[MIN_POOL_RATIO.parameter()],
                   responses={200: OpenApiTypes.OBJECT, 400: ErrorSerializer})
    def get(self, request):
        return Response(running_frontier(self.MIN_POOL_RATIO.read(request.query_params)).to_dict())


class TelemetryLatestView(ApiErrors, APIView):
    """The engine's newest telemetry snapshot, as it published it to Redis."""

    permission_classes = [IsAuthenticated, HasRole]

    @extend_schema(responses={200: OpenApiTypes.OBJECT, 404: ErrorSerializer, 502: ErrorSerializer,
                              503: ErrorSerializer})
    def get(self, request):
        key, _recent = telemetry_keys(settings.TELEMETRY_CHANNEL)
        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
        try:
            raw = client.get(key)
        except redis.RedisError as error:
            return Response({"detail": f"telemetry store unreachable: {error}", "code": "TelemetryUnavailable"},
                            status=status.HTTP_503_SERVICE_UNAVAILABLE)
        finally:
            client.close()
        if raw is None:
            raise NotFound(f"no telemetry snapshot yet: the engine has not published to {key}")
        try:
            return Response(json.loads(raw))
        except ValueError:
            return Response({"detail": f"the snapshot at {key} is not JSON", "code": "TelemetryUnreadable"},
                            status=status.HTTP_502_BAD_GATEWAY)


# Redoc's bundle would fetch its makers' logo from their CDN; on this page the browser loads nothing from elsewhere.
DOCS_CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
            "font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; object-src 'none'; base-uri 'self'; "
            "frame-ancestors 'none'")


def docs_page(request):
    """The API reference: Redoc, from our own static files (drf-spectacular-sidecar), reading /api/schema/."""
    response = render(request, "ui/api_docs.html", {"schema_url": reverse("api-schema") + "?format=json"})
    response["Content-Security-Policy"] = DOCS_CSP
    return response
