"""Template helpers for the pages: the user's roles, plans and audit details as readable JSON, an audit event's
one-line summary, cuts as the comma lists URLs and data attributes carry, subject links. Units and numbers as people
read them are console.ui.templatetags.formatting's."""

from __future__ import annotations

import json
import re

from django import template
from django.urls import reverse

from console.jobs.roles import ROLES, roles_of

register = template.Library()
_JOB_SUBJECT = re.compile(r"job:([1-9][0-9]{0,17})")
_HASH = re.compile(r"[0-9a-f]{40,}")
SUMMARY_CHARS = 100


@register.simple_tag
def user_roles(user) -> str:
    held = roles_of(user)
    return ", ".join(role for role in ROLES if role in held) or "no role"


@register.filter
def pretty_json(value) -> str:
    return json.dumps(value, indent=2, sort_keys=True)


@register.filter
def event_json(event) -> str:
    """An audit event's details whole, as indented JSON: its payload, then its before and after where it has them."""
    details = {"payload": event.payload}
    details.update({name: getattr(event, name) for name in ("before", "after") if getattr(event, name)})
    return json.dumps(details, indent=2, ensure_ascii=False)


@register.filter
def event_summary(event) -> str:
    """An audit event in one short line: its status change, then its payload's fields as `name=value` (nested
    values as compact JSON, long hashes shortened), cut at SUMMARY_CHARS; the details hold the rest whole."""
    parts = []
    before, after = event.before or {}, event.after or {}
    if isinstance(before, dict) and isinstance(after, dict) and (before.get("status") or after.get("status")):
        parts.append(f"{before.get('status') or '…'} → {after.get('status') or '…'}")
    payload = event.payload if isinstance(event.payload, dict) else {"payload": event.payload}
    for name, value in payload.items():
        if value is None or value == "" or value == [] or value == {}:
            continue
        text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        parts.append(f"{name}={_HASH.sub(lambda match: match[0][:12] + '…', text)}")
    line = " · ".join(parts)
    return line if len(line) <= SUMMARY_CHARS else line[:SUMMARY_CHARS - 1] + "…"


@register.filter
def comma_join(values) -> str:
    return ",".join(str(value) for value in values or [])


@register.filter
def short_hash(value: str) -> str:
    return (value or "")[:16]


@register.filter
def subject_url(subject: str) -> str:
    """The page of an audit event's subject (`job:<id>`), or "" when it has none."""
    match = _JOB_SUBJECT.fullmatch(subject or "")
    return reverse("job", args=[int(match[1])]) if match else ""
