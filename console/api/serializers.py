"""Serializers: read shapes of jobs and audit events, and the request bodies of the job verbs.

Proposal bodies are checked by the service layer (console.jobs.planning.parse_body), the one place that
knows what a plan body is; ProposeSerializer only documents it in the schema.
"""

from __future__ import annotations

from rest_framework import serializers

from console.audit.models import AuditEvent
from console.jobs.choices import JobKind
from console.jobs.models import Job

__all__ = ["ApproveSerializer", "AuditEventSerializer", "JobSerializer", "ProposeSerializer", "RejectSerializer"]


class JobSerializer(serializers.ModelSerializer):
    class Meta:
        model = Job
        fields = ["id", "kind", "status", "target", "plan_hash", "prediction", "measured", "plan", "proposer_name",
                  "engine_operation_id", "phase", "progress", "error", "created", "updated", "queued_at",
                  "started_at", "finished_at"]
        read_only_fields = fields


class ProposeSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=JobKind.choices)
    target = serializers.JSONField(help_text='The plan target, e.g. {"cut": [8, 4, 4]}.')
    incumbent_fingerprint = serializers.CharField(required=False,
                                                  help_text="The layout the operator looked at; refused if stale.")


class ApproveSerializer(serializers.Serializer):
    plan_hash = serializers.CharField(required=False, max_length=64,
                                      help_text="The plan the reviewer saw; refused (409) if the job's plan changed.")


class RejectSerializer(serializers.Serializer):
    reason = serializers.CharField(required=False, allow_blank=True, max_length=2000)


class AuditEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditEvent
        fields = ["id", "seq", "timestamp", "actor_name", "action", "subject", "payload", "before", "after",
                  "request_id", "prev_hash", "hash"]
        read_only_fields = fields
