"""The pages' forms: a job proposal (turned into the service's plan body), the audit filter and the dashboard's
time range."""

from __future__ import annotations

from django import forms
from django.conf import settings
from django.db.models import QuerySet

from console.jobs.choices import JobKind

__all__ = ["SHAPE_FIELDS", "TIME_RANGES", "AuditFilterForm", "ProposeForm", "TimeRangeForm"]

SHAPE_NUMBERS = ("max_model_len", "max_num_seqs", "max_num_batched_tokens")
SHAPE_FIELDS = (*SHAPE_NUMBERS, "kv_dtype")


def _layers(name: str, text: str) -> list[int]:
    parts = [part.strip() for part in text.split(",")]
    if not all(part.isdigit() for part in parts):
        raise forms.ValidationError(f"{name}: expected whole numbers of layers per rank separated by commas, "
                                    f"e.g. 8,4,4 (got {text[:60]!r})")
    return [int(part) for part in parts]


class ProposeForm(forms.Form):
    """A cut change (`cut`), a shape change (any shape field) or a ladder move (`rung`), optionally scheduled
    (`not_before`, a local date and time read in the server's time zone, settings.TIME_ZONE).

    Only the body's form is checked here; the service and the engine judge the plan itself (and the service whether
    `not_before` lies ahead).
    """

    kind = forms.ChoiceField(choices=JobKind.choices, initial=JobKind.CUT)
    cut = forms.CharField(required=False, max_length=400, help_text="layers per rank, e.g. 8,4,4")
    rung = forms.CharField(required=False, max_length=400, help_text="the rung's layers per rank, e.g. 8,4,4")
    max_model_len = forms.IntegerField(required=False, min_value=1)
    max_num_seqs = forms.IntegerField(required=False, min_value=1)
    max_num_batched_tokens = forms.IntegerField(required=False, min_value=1)
    kv_dtype = forms.CharField(required=False, max_length=32, help_text="e.g. fp8, bf16; empty keeps it")
    not_before = forms.DateTimeField(
        required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
        help_text=f"server time ({settings.TIME_ZONE}); once approved the job waits until then. Empty: it runs once "
                  "approved")
    # The layout the prediction was made for: proposing is refused if the engine has moved on since.
    incumbent_fingerprint = forms.CharField(required=False, max_length=128, widget=forms.HiddenInput)

    def clean(self) -> dict:
        data = super().clean()
        kind = data.get("kind")
        if kind in (JobKind.CUT, JobKind.LADDER):
            name = "cut" if kind == JobKind.CUT else "rung"
            text = (data.get(name) or "").strip()
            if not text:
                raise forms.ValidationError(f"{name}: name the layers per rank, e.g. 8,4,4")
            target = {name: _layers(name, text)}
        elif kind == JobKind.SHAPE:
            target = {name: data[name] for name in SHAPE_NUMBERS if data.get(name) is not None}
            if data.get("kv_dtype"):
                target["kv_dtype"] = data["kv_dtype"].strip()
            if not target:
                raise forms.ValidationError("shape: set at least one of max_model_len, max_num_seqs, "
                                            "max_num_batched_tokens, kv_dtype")
        else:
            return data
        data["body"] = {"kind": kind, "target": target}
        if data.get("incumbent_fingerprint"):
            data["body"]["incumbent_fingerprint"] = data["incumbent_fingerprint"]
        if data.get("not_before"):  # aware, in the server's time zone: the service takes ISO 8601 with its offset
            data["body"]["not_before"] = data["not_before"].isoformat()
        return data


class AuditFilterForm(forms.Form):
    actor = forms.CharField(required=False, max_length=150)
    action = forms.CharField(required=False, max_length=64)
    subject = forms.CharField(required=False, max_length=255)
    since = forms.DateTimeField(required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
                                help_text="UTC")
    until = forms.DateTimeField(required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
                                help_text="UTC")

    def clean(self) -> dict:
        data = super().clean()
        if data.get("since") and data.get("until") and data["since"] > data["until"]:
            raise forms.ValidationError("since: the time range starts after it ends")
        return data

    def filter(self, events: QuerySet) -> QuerySet:
        """The events matching the (valid) filter: exact actor, action and subject; since <= time <= until."""
        data = self.cleaned_data
        for name, lookup in (("actor", "actor_name"), ("action", "action"), ("subject", "subject")):
            if data.get(name):
                events = events.filter(**{lookup: data[name].strip()})
        if data.get("since"):
            events = events.filter(timestamp__gte=data["since"])
        if data.get("until"):
            events = events.filter(timestamp__lte=data["until"])
        return events


# The dashboard charts' time ranges: `?range=<key>` -> (label, seconds). No range: the recent snapshots, as held.
TIME_RANGES = {"15m": ("15 min", 15 * 60), "1h": ("1 h", 3600), "6h": ("6 h", 6 * 3600), "24h": ("24 h", 24 * 3600)}


class TimeRangeForm(forms.Form):
    range = forms.ChoiceField(
        required=False, choices=[("", "recent"), *((key, label) for key, (label, _) in TIME_RANGES.items())],
        error_messages={"invalid_choice": "%(value)s is not a time range: use one of "
                                          + ", ".join(TIME_RANGES) + ", or none for the recent snapshots"})

    def seconds(self) -> int | None:
        """The (valid) range's length in seconds; None for the recent snapshots."""
        key = self.cleaned_data.get("range")
        return TIME_RANGES[key][1] if key else None
