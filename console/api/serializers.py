"""Serializers: read shapes of jobs and audit events, and the request bodies of the job verbs.

Proposal bodies are checked by the service layer (console.jobs.planning.parse_body), the one place that
knows what a plan body is; ProposeSerializer only documents it in the schema.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from console.audit.models import AuditEvent
from console.jobs.choices import JobKind
from console.jobs.models import Job
from console.jobs.verdicts import speed_check

__all__ = ["ApproveSerializer", "AuditEventSerializer", "ErrorSerializer", "JobSerializer", "ProposeSerializer",
           "RejectSerializer", "SpeedupSerializer"]


class SpeedupSerializer(serializers.Serializer):
    """A succeeded job's pipelined speedup, predicted and measured, and the noise floor that judges it."""

    predicted = serializers.FloatField(allow_null=True)
    measured = serializers.FloatField(allow_null=True)
    noise_floor = serializers.FloatField(allow_null=True, help_text="The floor the prediction was made with.")
    error = serializers.FloatField(allow_null=True, help_text="measured / predicted - 1, once both are known.")
    missed = serializers.BooleanField(allow_null=True, help_text="|error| > noise_floor, once both are known.")


class JobSerializer(serializers.ModelSerializer):
    outcome = serializers.CharField(read_only=True, help_text='The status with the speed verdict, e.g. "succeeded, '
                                                              'missed prediction".')
    speedup = serializers.SerializerMethodField()
    reverted_by = serializers.PrimaryKeyRelatedField(many=True, read_only=True,
                                                     help_text="The jobs proposed to revert this one.")

    class Meta:
        model = Job
        fields = ["id", "kind", "status", "outcome", "speed_verdict", "speedup", "target", "plan_hash", "prediction",
                  "measured", "plan", "proposer_name", "engine_operation_id", "phase", "progress", "error", "created",
                  "updated", "not_before", "queued_at", "started_at", "finished_at", "incumbent_layout", "reverts",
                  "reverted_by"]
        read_only_fields = fields

    @extend_schema_field(SpeedupSerializer(allow_null=True))
    def get_speedup(self, job: Job) -> dict | None:
        """None until the job has a layout prediction (it ran on the engine)."""
        prediction = getattr(job, "layout_prediction", None)
        if prediction is None:
            return None
        check = speed_check(prediction.predicted_speedup, prediction.measured_speedup, prediction.noise_floor)
        if check is not None:
            return check.to_dict()
        return {"predicted": prediction.predicted_speedup, "measured": prediction.measured_speedup,
                "noise_floor": prediction.noise_floor, "error": None, "missed": None}


@extend_schema_field({"type": "object", "additionalProperties": True})
class PlanTargetField(serializers.JSONField):
    """A plan's target: a JSON object whose fields depend on the kind (parse_body says which)."""


class ProposeSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=JobKind.choices)
    target = PlanTargetField(help_text='The plan target, a JSON object, e.g. {"cut": [8, 4, 4]}.')
    incumbent_fingerprint = serializers.CharField(required=False,
                                                  help_text="The layout the operator looked at; refused if stale.")
    not_before = serializers.DateTimeField(
        required=False, help_text="A scheduled change: ISO 8601 with a timezone, in the future. Once approved the job "
                                  "waits until then; beat queues it, and it ends stale if the layout moved meanwhile.")


class ApproveSerializer(serializers.Serializer):
    # Required, as on the job page's form: an approval is bound to the plan the reviewer saw (review-gate rule 2),
    # never to whatever the job's plan is by the time the request lands.
    # Not trimmed: a hash with spaces is another plan's (409), not an empty field (400) the schema allows.
    plan_hash = serializers.CharField(min_length=1, max_length=64, trim_whitespace=False,
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
