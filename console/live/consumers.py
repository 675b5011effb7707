"""`LiveConsumer` at `/ws/live/`: AWX's protocol for live pages.

A page loads a snapshot with its seq, opens the socket, subscribes, then fetches the gap:

    -> {"action": "subscribe", "groups": ["telemetry", "job-42"]}
    <- {"type": "subscribed", "groups": ["job-42", "telemetry"]}      (or {"type": "error", ...}: nothing changed)
    -> {"action": "fetch", "after_seq": 17}
    <- {"type": "fetched", "after_seq": 17, "snapshots": [{"seq": 18, ...}, ...]}   (oldest first)
    <- {"type": "telemetry", "snapshot": {...}}   /   {"type": "job", "job": {...}}

A subscribe replaces the groups held; every group is checked server-side (`refusal`) and one refused group
refuses the whole request. Every group needs one of the console roles (viewer, operator, reviewer), as every
page and endpoint does; the roles are read afresh at each subscribe, so a revoked role stops the next one.
Anonymous sockets are accepted and closed at once with code 4401, so the browser sees the code (a refused
handshake shows it only 1006) and stops reconnecting instead of retrying.
"""

from __future__ import annotations

import re

import redis.asyncio as aioredis
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from console.jobs.roles import roles_of
from console.live.bridge import TELEMETRY_GROUP, recent_since

__all__ = ["CLOSE_UNAUTHENTICATED", "LiveConsumer", "refusal"]

CLOSE_UNAUTHENTICATED = 4401
MAX_GROUPS = 32
_JOB_GROUP = re.compile(r"job-[1-9][0-9]{0,17}")


def refusal(user, roles: set[str], group: object) -> str | None:
    """Why `user`, holding `roles` (console.jobs.roles.roles_of), may not join `group`, or None.

    Any of the console roles reads telemetry and every job, as the pages and the API let it."""
    if not getattr(user, "is_authenticated", False):
        return "login required"
    if not roles:
        return (f"{user.get_username()} has none of the console roles (viewer, operator or reviewer); "
                "ask an administrator for one")
    if group == TELEMETRY_GROUP or (isinstance(group, str) and _JOB_GROUP.fullmatch(group)):
        return None
    return f"unknown group {group!r} (expected 'telemetry' or 'job-<id>')"


@database_sync_to_async
def _roles(user) -> set[str]:
    return roles_of(user)


class LiveConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        self.joined: set[str] = set()
        await self.accept()
        if not getattr(self.scope.get("user"), "is_authenticated", False):
            await self.close(code=CLOSE_UNAUTHENTICATED)

    async def disconnect(self, code: int) -> None:
        for group in getattr(self, "joined", ()):
            await self.channel_layer.group_discard(group, self.channel_name)
        self.joined = set()

    async def receive_json(self, content, **kwargs) -> None:
        action = content.get("action") if isinstance(content, dict) else None
        if action == "subscribe":
            await self._subscribe(content.get("groups"))
        elif action == "fetch":
            await self._fetch(content.get("after_seq"))
        else:
            await self._error(f"unknown action {action!r} (expected 'subscribe' or 'fetch')")

    async def _subscribe(self, groups: object) -> None:
        if not isinstance(groups, list) or len(groups) > MAX_GROUPS:
            await self._error(f"'groups' must be a list of at most {MAX_GROUPS} group names")
            return
        user = self.scope["user"]
        roles = await _roles(user)
        refused = {str(group): reason for group in groups if (reason := refusal(user, roles, group))}
        if refused:
            await self._error("subscription refused: " + "; ".join(refused.values()), refused=sorted(refused))
            return
        wanted = set(groups)
        for group in self.joined - wanted:
            await self.channel_layer.group_discard(group, self.channel_name)
        for group in wanted - self.joined:
            await self.channel_layer.group_add(group, self.channel_name)
        self.joined = wanted
        await self.send_json({"type": "subscribed", "groups": sorted(wanted)})

    async def _fetch(self, after_seq: object) -> None:
        if not isinstance(after_seq, int) or isinstance(after_seq, bool):
            await self._error("'after_seq' must be an integer (the seq of the snapshot the page holds)")
            return
        # A fetch reads the telemetry group's history, so it is refused to whoever may not join that group.
        user = self.scope["user"]
        if reason := refusal(user, await _roles(user), TELEMETRY_GROUP):
            await self._error(f"fetch refused: {reason}")
            return
        client = aioredis.Redis.from_url(settings.REDIS_URL, socket_timeout=2.0, socket_connect_timeout=2.0)
        try:
            snapshots = await recent_since(client, settings.TELEMETRY_CHANNEL, after_seq)
        except (aioredis.RedisError, OSError):
            await self._error("telemetry store unavailable; fetch again later")
            return
        finally:
            await client.aclose()
        await self.send_json({"type": "fetched", "after_seq": after_seq, "snapshots": snapshots})

    async def _error(self, message: str, **extra) -> None:
        await self.send_json({"type": "error", "error": message, **extra})

    # Channel-layer events -> the browser.
    async def telemetry_snapshot(self, event: dict) -> None:
        await self.send_json({"type": "telemetry", "snapshot": event["snapshot"]})

    async def job_update(self, event: dict) -> None:
        await self.send_json({"type": "job", "job": event["job"]})
