"""Serializers: read shapes of jobs and audit events, and the request bodies of the job verbs.

Proposal bodies are checked by the service layer (console.jobs.planning.parse_body), the one place that
knows what a plan body is; ProposeSerializer only documents it in the schema.
"""

from __future__ import annotations

from rest_framework import serializers

from console.audit.models import AuditEvent
from console.jobs.choices import JobKind
from console.jobs.models import Job

__all__ = ["ApproveSerializer", "AuditEventSerializer", "ErrorSerializer", "JobSerializer", "ProposeSerializer",
           "RejectSerializer"]


class JobSerializer(serializers.ModelSerializer):
    class Meta:
        model = Job
        fields = ["id", "kind", "status", "target", "plan_hash", "prediction", "measured", "plan", "proposer_name",
                  "engine_operation_id", "phase", "progress", "error", "created", "updated", "not_before",
                  "queued_at", "started_at", "finished_at"]
        read_only_fields = fields


class ProposeSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=JobKind.choices)
    target = serializers.JSONField(help_text='The plan target, e.g. {"cut": [8, 4, 4]}.')
    incumbent_fingerprint = serializers.CharField(required=False,
                                                  help_text="The layout the operator looked at; refused if stale.")
    not_before = serializers.DateTimeField(
        required=False, help_text="A scheduled change: ISO 8601 with a timezone, in the future. Once approved the job "
                                  "waits until then; beat queues it, and it ends stale if the layout moved meanwhile.")


class ApproveSerializer(serializers.Serializer):
    # Required, as on the job page's form: an approval is bound to the plan the reviewer saw (review-gate rule 2),
    # never to whatever the job's plan is by the time the request lands.
    plan_hash = serializers.CharField(max_length=64,
                                      help_text="The plan the reviewer saw; refused (409) if the job's plan changed.")


class RejectSerializer(serializers.Serializer):
    reason = serializers.CharField(required=False, allow_blank=True, max_length=2000)


class AuditEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditEvent
        fields = ["id", "seq", "timestamp", "actor_name", "action", "subject", "payload", "before", "after",
                  "request_id", "prev_hash", "hash"]
        read_only_fields = fields


class ErrorSerializer(serializers.Serializer):
    """What every refusal answers (console.api.errors)."""

    detail = serializers.CharField(help_text="What is wrong, naming the field or path where there is one.")
    code = serializers.CharField(required=False, help_text="The kind of refusal, e.g. InvalidProposal, Conflict.")
    field = serializers.CharField(required=False, allow_null=True, help_text="The offending field or path.")
    reasons = serializers.ListField(child=serializers.CharField(), required=False,
                                    help_text="The engine's reasons for an infeasible plan.")
    errors = serializers.JSONField(required=False, help_text="Every field's errors, when a body had several.")
    request_id = serializers.CharField(required=False, help_text="Quote it when reporting an internal error.")
