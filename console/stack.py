"""The stack key (SEAM_STACK): one name that keeps the Redis names of two Seam stacks on one Redis apart.

Every Redis name a keyed stack uses starts with `seam:<key>:` — the Channels layer's prefix, Celery's task queue
and its control and event exchanges, and the engine's telemetry channel — so two `make run` on one host never
take each other's jobs, websocket messages or telemetry. `make run` always sets a key (`default_stack_key`: from
the console's port, which no two running stacks share); console processes started by hand without one use the
libraries' own names and the engine's default channel (contracts.telemetry.DEFAULT_CHANNEL). An explicit
SEAM_TELEMETRY_CHANNEL or CELERY_TASK_DEFAULT_QUEUE still wins over the derived name.

No Django here: console/settings.py and launch/run.py both read the names from `stack_names`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from contracts.telemetry import DEFAULT_CHANNEL

__all__ = ["STACK_ENV", "StackNames", "check_stack_key", "default_stack_key", "stack_names"]

STACK_ENV = "SEAM_STACK"
# Safe inside a Redis key, a Celery queue name and a channel-layer prefix alike.
_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True)
class StackNames:
    """The Redis names of one stack; `key` is None for a stack without a key."""

    key: str | None
    telemetry_channel: str
    task_queue: str
    control_exchange: str
    event_exchange: str
    channel_layer_prefix: str


def default_stack_key(console_port: int) -> str:
    """`make run`'s key when SEAM_STACK is unset: two stacks running on one host cannot share a console port."""
    return f"port{console_port}"


def check_stack_key(key: str) -> str:
    if not _KEY.fullmatch(key):
        raise ValueError(f"{STACK_ENV}={key!r}: expected 1 to 64 letters, digits, '.', '_' or '-', starting with a "
                         "letter or digit (e.g. demo-2)")
    return key


def stack_names(environ: Mapping[str, str]) -> StackNames:
    """The names for the key in environ[SEAM_STACK], with explicit SEAM_TELEMETRY_CHANNEL and
    CELERY_TASK_DEFAULT_QUEUE kept; ValueError naming SEAM_STACK for a key that is not a plain name."""
    key = environ.get(STACK_ENV) or None
    if key is None:  # the names every library and the engine use by default
        names = StackNames(None, DEFAULT_CHANNEL, "celery", "celery", "celeryev", "asgi")
    else:
        space = f"seam:{check_stack_key(key)}"
        names = StackNames(key, f"{space}:telemetry", f"{space}:jobs", f"{space}:control", f"{space}:events",
                           f"{space}:asgi")
    return replace(names, telemetry_channel=environ.get("SEAM_TELEMETRY_CHANNEL") or names.telemetry_channel,
                   task_queue=environ.get("CELERY_TASK_DEFAULT_QUEUE") or names.task_queue)
