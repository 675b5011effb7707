"""Template helpers for the pages: the user's roles, plans and audit details as readable JSON, cuts as comma lists,
subject links."""

from __future__ import annotations

import json
import re

from django import template
from django.urls import reverse

from console.jobs.roles import ROLES, roles_of

register = template.Library()
_JOB_SUBJECT = re.compile(r"job:([1-9][0-9]{0,17})")


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
